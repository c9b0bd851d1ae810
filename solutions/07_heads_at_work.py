# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -all
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Solutions · Chapter 07 · Heads at work
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/07_heads_at_work.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# <!-- END SOLUTION -->
#
# Five exercises: the forward pass of a pre-norm encoder layer and zero-ablation (7.1, 7.2); then
# the tools chapter 07 used to find out what each head is for, written by you: mean- and
# resample-ablation (7.3) and direct logit attribution (7.4); and a question about the seed study
# that the chapter does not answer, counted over its runs (7.5).
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=07`, or `.venv/bin/python -m mha_course start 07`; see the README), so that
# updates to the course never overwrite your work.
# -->

# %%
import torch
from torch import nn

from mha_lib import MultiHeadAttention, combine_heads, scaled_dot_product_attention, split_heads
from mha_lib.checks import (
    check_ablated_logits,
    check_encoder_layer,
    check_head_ablation,
    check_logit_attribution,
    check_recount,
)
from mha_lib.sentiment import load_study
from mha_lib.sentiment.findings import independent, learned, negation_head_of

# %% [markdown]
# ## Exercise 7.1 · The encoder layer's forward pass
#
# The `__init__` below is complete. Write `forward(x, mask=None)` for the **pre-norm** layer of
# chapter 07:
#
# 1. `h = norm1(x)`; `x = x + self_attn(h, h, h, mask=mask)` (self-attention, with a residual);
# 2. `x = x + feed_forward(norm2(x))` (the position-wise network, with a residual);
# 3. return `x`, shape `(B, L, d_model)`.
#
# (Chapter 07's `mha_lib.EncoderLayer` also has dropout; it is left out here.) The output keeps `x`'s
# dtype and device, and `forward` changes nothing in the layer (its mode, weights, `requires_grad`).
#
# <details><summary>Hint</summary>
#
# The residual adds the sublayer's output to `x` itself, not to its normalized copy `h`.
# </details>

# %%
class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.feed_forward = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        # BEGIN SOLUTION
        h = self.norm1(x)  # (B, L, D)
        x = x + self.self_attn(h, h, h, mask=mask)  # attention sublayer, residual
        return x + self.feed_forward(self.norm2(x))  # feed-forward sublayer, residual
        # END SOLUTION


# %%
check_encoder_layer(EncoderLayer)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** In the post-norm order of the original Transformer (and of *Transformers in
# Action*'s encoder), the normalization comes after the addition: `norm1(x + self_attn(x, ...))`.
# Both are correct models; they are different functions, and the check tells them apart.
# <!-- END SOLUTION -->
#
# ## Exercise 7.2 · Silence one head
#
# To learn what a head is for, switch it off and see what breaks. Write
# `silence_head(mha, x, head)` returning the output of self-attention of `x (B, L, d_model)`
# through the `MultiHeadAttention` `mha`, with head `head`'s output replaced by zeros **just
# before** the output projection `W_o`, in `x`'s dtype and on its device. Leave `mha` as you found it:
# its weights, its mode, `requires_grad`, and no hook left behind.
#
# <details><summary>Hint 1</summary>
#
# Redo the module's steps with `split_heads`, `scaled_dot_product_attention` and `combine_heads`,
# and zero the head's output in between.
# </details>
# <details><summary>Hint 2</summary>
#
# Why not zero the head's slice of the final output instead? Because `W_o` mixes every head into
# every output feature.
# </details>

# %%
def silence_head(mha, x, head):
    # BEGIN SOLUTION
    q = split_heads(mha.W_q(x), mha.num_heads)  # (B, H, L, d_k)
    k = split_heads(mha.W_k(x), mha.num_heads)
    v = split_heads(mha.W_v(x), mha.num_heads)
    heads, _ = scaled_dot_product_attention(q, k, v)  # (B, H, L, d_k)
    keep = torch.ones(mha.num_heads, 1, 1, dtype=heads.dtype, device=heads.device)
    keep[head] = 0.0
    return mha.W_o(combine_heads(heads * keep))  # (B, L, d_model)
    # END SOLUTION


# %%
check_head_ablation(silence_head)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** Chapter 07 does the same with a forward pre-hook on `W_o`
# (`silence_heads` in `mha_lib.heads`, also importable from `mha_lib.sentiment`), which switches
# a head off inside a whole trained model without rewriting its forward pass.
# <!-- END SOLUTION -->
#
# ## Exercise 7.3 · Mean- and resample-ablation
#
# Zeros are a report a head never gives (chapter 07, section 6). Write
# `ablated_logits(model, tokens, heads, how, reference, generator)`, which returns the logits
# `(B, 2)` of a one-layer `SentimentClassifier` `model` on `tokens (B, L)` (ids from
# `batch_examples`, on the model's device) with the output **at `<cls>`** (position 0) of each head
# in the list `heads` replaced **just before `W_o`** (head `h` owns the features
# `[h·d_k, (h+1)·d_k)` of `W_o`'s input):
#
# - `how == "mean"`: by the head's **mean** output at `<cls>` over the reference sentences
#   `reference (M, L')` (in the notebook, the training sentences), the same for every sentence;
# - `how == "resample"`: for sentence `b`, by the head's output at `<cls>` on reference sentence
#   `pick[b]`, with `pick = torch.randint(M, (B,), generator=generator)` drawn **once** per call:
#   every head in `heads` takes its output from the same reference sentence.
#
# Read the heads' outputs with a forward pre-hook on `model.layers[0].self_attn.W_o` (or by hand),
# run the model in **evaluation mode**, and leave it as you found it: its mode, `requires_grad`,
# hooks and parameters, and gradients switched on. **What the check enforces:** the logits keep the
# model's dtype (it tries float32 and float64) and are made on its device (it runs your function
# once more on the `meta` device, where a tensor made on the CPU fails as it would on a GPU):
# create tensors with `device=tokens.device`, draw `pick` on the CPU with the generator you are
# given and move it with `.to(tokens.device)`. The check hands you models in training mode, with
# dropout, a hook of their own and frozen parameters.
#
# <details><summary>Hint 1</summary>
#
# Two forward passes: one on `reference` whose hook only *reads* `args[0][:, 0]`, viewed as
# `(M, H, d_k)`; one on `tokens` whose hook *returns* a modified copy of `args[0]`.
# </details>
# <details><summary>Hint 2</summary>
#
# `was_training = model.training; model.eval()` before, and in a `finally:` block
# `handle.remove()` and `model.train(was_training)`.
# </details>

# %%
def ablated_logits(model, tokens, heads, how, reference, generator=None):
    # BEGIN SOLUTION
    W_o = model.layers[0].self_attn.W_o
    H = model.num_heads
    was_training = model.training
    model.eval()  # no dropout
    try:
        with torch.no_grad():
            seen = []
            handle = W_o.register_forward_pre_hook(lambda module, args: seen.append(args[0][:, 0]))
            try:
                model(reference)
            finally:
                handle.remove()
            at_cls = seen[0].view(reference.size(0), H, -1)[:, heads]  # (M, len(heads), d_k)
            if how == "mean":
                values = at_cls.mean(dim=0)  # (len(heads), d_k), the same for every sentence
            else:
                pick = torch.randint(reference.size(0), (tokens.size(0),), generator=generator)  # (B,), on the CPU
                values = at_cls[pick.to(at_cls.device)]  # (B, len(heads), d_k)

            def replace(module, args):
                x = args[0].clone()  # (B, L, H * d_k)
                x[:, 0].view(x.size(0), H, -1)[:, heads] = values  # a view into x, at <cls>
                return (x,)

            handle = W_o.register_forward_pre_hook(replace)
            try:
                return model(tokens)  # (B, 2)
            finally:
                handle.remove()
    finally:
        model.train(was_training)
    # END SOLUTION


# %%
check_ablated_logits(ablated_logits)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** `mha_lib.sentiment.attribution` splits the same work into `head_outputs` and the
# context manager `replace_heads`; `ablated_accuracy` compares the predictions with the labels.
# Both replacements keep the head's output on what the model saw in training, but they ask
# different questions: the mean erases what the head says about *this* sentence, a resampled
# output replaces it with a confident report about *another* one. Only position 0 matters, since in
# a one-layer model nothing but `<cls>`'s vector reaches the classifier: replacing the head at
# every position gives the same logits.
# <!-- END SOLUTION -->
#
# ## Exercise 7.4 · Direct logit attribution
#
# Write `logit_terms(model, tokens)`, returning a dict of tensors `(B,)`, one per term of
# `<cls>`'s vector after the layer (chapter 07, section 7): `"embedding"` (token + position 0),
# `"head 0"` ... `"head H-1"` (each head's output at `<cls>` through its slice of `W_o`'s weight),
# `"W_o bias"`, `"feed-forward"`, and `"constant"`, such that with $\sigma$ frozen the terms
# **add up to** `logit[1] - logit[0]` (positive minus negative):
#
# $$\text{term}_t = w \cdot \frac{\gamma \odot (t - \bar t)}{\sigma},\qquad
# \text{constant} = w \cdot \beta + b_1 - b_0,\qquad
# \sigma = \sqrt{\operatorname{var}(x) + \varepsilon}$$
#
# with $x$ the sum of the terms' vectors, $w$ = `classifier.weight[1] - classifier.weight[0]` and
# $\gamma, \beta, \varepsilon$ = `model.norm.weight`, `.bias`, `.eps`. Evaluation mode, the model
# left as you found it, as in 7.3. **What the check enforces:** every term in the model's dtype
# (float32 and float64 are tried), shape `(B,)`, and made on the model's device (one more run on
# the `meta` device: create tensors with `device=tokens.device`).
#
# <details><summary>Hint 1</summary>
#
# Hooks give you `W_o`'s input (the heads, side by side) and the feed-forward network's output;
# take `[:, 0]` of each. `W_o.weight[:, h*d_k:(h+1)*d_k]` is head `h`'s slice.
# </details>
# <details><summary>Hint 2</summary>
#
# Check yourself: `sum(terms.values())` must equal `logits[:, 1] - logits[:, 0]`. If it doesn't,
# a piece of $x$ is missing, or $\beta$ or a bias is counted more than once.
# </details>

# %%
def logit_terms(model, tokens):
    # BEGIN SOLUTION
    layer = model.layers[0]
    W_o, norm = layer.self_attn.W_o, model.norm
    H = model.num_heads
    seen = {}
    handles = [W_o.register_forward_pre_hook(lambda module, args: seen.update(heads=args[0][:, 0])),
               layer.feed_forward.register_forward_hook(lambda module, args, out: seen.update(ffn=out[:, 0]))]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(tokens)
            d_k = W_o.in_features // H
            zero = torch.zeros(1, dtype=torch.long, device=tokens.device)  # position 0
            vectors = {"embedding": model.token_embedding(tokens[:, 0]) + model.position_embedding(zero)}  # (B, D)
            for h in range(H):
                part = slice(h * d_k, (h + 1) * d_k)
                vectors[f"head {h}"] = seen["heads"][:, part] @ W_o.weight[:, part].T  # (B, D)
            vectors["W_o bias"] = W_o.bias.expand_as(vectors["embedding"])
            vectors["feed-forward"] = seen["ffn"]
            x = sum(vectors.values())  # <cls>'s vector, as the final LayerNorm reads it
            sigma = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # (B, 1), frozen
            w = model.classifier.weight[1] - model.classifier.weight[0]  # (D,)
            b = model.classifier.bias[1] - model.classifier.bias[0]
            terms = {name: (norm.weight * (t - t.mean(dim=-1, keepdim=True)) / sigma) @ w for name, t in vectors.items()}
            terms["constant"] = (norm.bias @ w + b).expand(tokens.size(0))
            return terms
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    # END SOLUTION


# %%
check_logit_attribution(logit_terms)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The one non-linear step between the heads and the logits is LayerNorm's
# division by $\sigma$, which depends on all the terms together: freezing it at its value for the
# sentence makes the map linear, so the terms add up exactly. Centring is linear too, so each
# term is centred on its own. Change one term (ablate a head) and $\sigma$ changes: that is why
# attribution and ablation can disagree (chapter 07, section 7).
# <!-- END SOLUTION -->
#
# ## Exercise 7.5 · Did the negation head lean toward "not" before training?
#
# Which head becomes the negation head "can only depend on the seed" (chapter 07, section 5). But
# does the seed already show it? Every run of the seed study also recorded, **before training**,
# each head's share of `<cls>`'s attention on "not" (`run["untrained"]["cls_to_not"]`).
#
# Write `leaned_before(study)`, returning `(k, n)`: over the runs that are **independent**
# (not a kernel-path replica), have **two heads**, **learned** (negated and plain accuracy at least
# the run's `learned_at`) and whose **negation head** (the head with the larger trained share on
# "not", `run["heads"]["cls_to_not"]`) **has a role** for it (share at least the run's `role`),
# the number `k` in which that head's untrained share on "not" was already larger than the other
# head's. Every threshold comes from the run's own `run["baselines"]`, never a number typed in:
# the check counts on studies of its own, in the same format, with replicas, other numbers of
# heads, runs that did not learn and other baselines (a task with four labels has another
# `learned_at`). **What the check enforces:** two ints, the study left unchanged.
# `mha_lib.sentiment.findings` has `independent`, `learned` and `negation_head_of`.
#
# Then answer with the committed study, `load_study()`: would a coin that picks one of the two
# heads at random do as well? (With a fair coin, `k` or more of `n` happens with probability
# $\sum_{i \ge k} \binom{n}{i} / 2^n$; `math.comb`.)

# %%
def leaned_before(study):
    # BEGIN SOLUTION
    def counted(run):
        return (independent(run) and learned(run)
                and run["heads"]["cls_to_not"][negation_head_of(run)] >= run["baselines"]["role"])

    def leans(run):
        before, h = run["untrained"]["cls_to_not"], negation_head_of(run)
        return all(before[h] > before[other] for other in range(run["num_heads"]) if other != h)

    return study.count(leans, where=counted)  # (k, n)
    # END SOLUTION


# %%
check_recount(leaned_before)

# %%
# BEGIN SOLUTION
from math import comb

k, n = leaned_before(load_study())
at_least = sum(comb(n, i) for i in range(k, n + 1)) / 2**n  # a fair coin: k or more of n
as_lopsided = sum(comb(n, i) for i in range(n + 1) if abs(i - n / 2) >= abs(k - n / 2)) / 2**n
print(f"the negation head already led on 'not' before training in {k} of {n} runs ({k / n:.0%})")
print(f"a coin: {k} or more of {n} with probability {at_least:.3f}; a split at least as lopsided, {as_lopsided:.3f}")
assert 0.5 < k / n < 0.8 and as_lopsided > 0.05  # what the discussion below says
# END SOLUTION

# %% [markdown]
# <!-- BEGIN ANSWER -->
# **Discussion.** In about two thirds of the runs, the future negation head already put more of
# `<cls>`'s attention on "not" before training. But a coin that picks one of the two heads at
# random gives a split at least this lopsided, one way or the other, in more than 1 study in 20
# (the second probability): suggestive at most, not shown. Untrained attention is close to uniform
# (no head has a role, chapter 07, section 4), yet a small head start might decide which head
# takes the job; these runs can't tell that from chance. More seeds could, and the question was
# fixed before the counts were read: that is what makes it a test.
# <!-- END ANSWER -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/07_heads_at_work.ipynb`, then go on to chapter 08.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 08.
# <!-- END SOLUTION -->
