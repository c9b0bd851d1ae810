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
# # Solutions · Chapter 09 · Heads in a language model
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/09_heads_in_a_language_model.ipynb`:
# > the same exercises, with the solutions filled in, a short discussion after each, and model
# > answers backed by the measurements above them.
# <!-- END SOLUTION -->
#
# Two exercises on chapter 09's language model of real text (2 layers of 4 heads, trained on
# Python's own test suite), each with a question to answer on the shipped model:
#
# 1. a **score for a head role of your choosing**, next to what uniform attention would score;
#    then which heads of the model have that role, by the chapter's threshold rule, and whether
#    the study's other runs agree;
# 2. **which heads matter for one token class**: the loss on the tokens of that class when each
#    head alone is mean-ablated; then which head matters most for a class you pick.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh inputs (random attention weights, windows of
# text, small untrained models) and says what is wrong, if anything. Each statement says what the
# check enforces. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=09`, or `.venv/bin/python -m mha_course start 09`; see the README), so that
# updates to the course never overwrite your work.
# -->

# %%
import torch
import torch.nn.functional as F

from mha_lib import get_device, seed_everything
from mha_lib.checks import check_class_ablation, check_role_baseline, check_role_score
from mha_lib.textlm import load_checkpoint, load_corpus
from mha_lib.textlm.ablation import CLASSES, class_losses, token_classes
from mha_lib.textlm.scores import role_threshold

device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# Both exercises use the shipped model (`mha_lib/textlm/model_seed0.pt`, the run of seed 0) and
# 64 windows of 64 tokens of held-out text, files the model never trained on: `inputs[:, t]` is the
# token before `targets[:, t]`.

# %%
model, tokenizer, _ = load_checkpoint(device=device)  # a TextTransformer in evaluation mode
inputs, targets = load_corpus().val_windows(64, model.config.max_len)  # (64, 64) each, on the CPU
inputs, targets = inputs.to(device), targets.to(device)
print(f"{model.num_layers} layers of {model.num_heads} heads, {len(tokenizer)} tokens; "
      f"inputs {tuple(inputs.shape)}")

# %% [markdown]
# ## Exercise 9.1 · A score for a role of your choosing
#
# The chapter scored the heads for roles named before looking (previous token, first token,
# newline, ...), each next to what uniform attention would score. Now you name one. Pick a role
# from this menu (the check knows these three):
#
# - `"same token"`: from query `t` to the **earlier** keys `s < t` that hold the same token as
#   `t` (a name used again: `self` ... `self`). It applies to the queries that have at least one
#   such key; the others are left out of the mean.
# - `"punctuation"` or `"indent"`: from query `t` to the visible keys `s <= t` whose token is of
#   that class of the chapter's (`CLASSES`: brackets, dots, operators and quotes; or tokens of
#   spaces only). It applies to every query `t = 1 ... L - 1` (query 0 sees only itself).
#
# Write two functions for your role:
#
# 1. `role_score(weights, tokens, tokenizer)`: `weights` are one layer's attention weights
#    `(B, H, L, L)` (rows are queries, columns keys, each row sums to 1 over the keys `0 ... t`),
#    `tokens` the ids `(B, L)` they were computed on, `tokenizer` the model's. Return `(H,)`: each
#    head's weight on the role's keys, summed per query, averaged over the role's queries of the
#    whole batch, pooled (their sum over their number).
# 2. `role_baseline(tokens, tokenizer)`: the score of uniform attention, `1 / (t + 1)` on each key
#    `0 ... t`, as one number (a float).
#
# The class of every key: `token_classes(tokenizer, tokens, tokens)` gives each token's index in
# `CLASSES` (the function classifies a target given the token before it; only *word start* and
# *word piece* depend on that token, so passing the tokens as their own predecessors gives each
# key's class). It returns a CPU tensor.
#
# The cell lays out a helper, `role_masks(tokens, tokenizer)`, for the two masks of Hint 1: fill it
# in and use it in both functions, or write them your own way.
#
# What the check enforces: the scores in the **weights' dtype** (it hands over float32 and float64
# weights); every tensor you create on the **tokens' device** (it runs your functions once more
# on another device); the inputs left unchanged; the baseline a Python float or a one-element
# tensor. It feeds windows of text tokenized by two tokenizers (other ids), rows built for the
# corners (no repeated token at all, the first token coming back, a token seen three times) and
# lengths down to 2. Don't call `mha_lib.textlm.scores.key_class_score`.
#
# <details><summary>Hint 1</summary>
#
# Build two masks first: `keys`, `(B, L, L)` bool, True where key `s` is one of the role's keys
# for query `t`, and `queries`, `(B, L)` bool, True where the role applies. Then the score is two
# sums, `(weights * keys[:, None]).sum(-1)` and a sum over the queries, and the baseline uses
# the same masks.
# </details>
# <details><summary>Hint 2</summary>
#
# `torch.ones(L, L, dtype=torch.bool, device=...).tril(-1)` is True where `s < t`; `.tril()`
# where `s <= t`. `tokens[:, :, None] == tokens[:, None, :]` compares every query's token with
# every key's.
# </details>

# %%
ROLE = "punctuation"  # your choice: "same token", "punctuation" or "indent"


def role_masks(tokens, tokenizer):
    """(keys (B, L, L), queries (B, L)), both bool, on the tokens' device."""
    # BEGIN SOLUTION
    B, L = tokens.shape
    t = torch.arange(L, device=tokens.device)
    if ROLE == "same token":
        keys = (tokens[:, :, None] == tokens[:, None, :]) & (t[None, :] < t[:, None])  # an earlier key, same token
        return keys, keys.any(-1)  # the queries with at least one
    is_key = token_classes(tokenizer, tokens, tokens).to(tokens.device) == CLASSES.index(ROLE)  # (B, L)
    keys = is_key[:, None, :] & (t[None, :] <= t[:, None])  # a visible key of the class
    return keys, (t >= 1).expand(B, L)  # every query but the first
    # END SOLUTION


def role_score(weights, tokens, tokenizer):
    # BEGIN SOLUTION
    keys, queries = role_masks(tokens, tokenizer)
    per_query = (weights * keys[:, None].to(weights.dtype)).sum(-1)  # (B, H, L): weight on the role's keys
    return (per_query * queries[:, None]).sum(dim=(0, 2)) / queries.sum()  # (H,)
    # END SOLUTION


def role_baseline(tokens, tokenizer):
    # BEGIN SOLUTION
    keys, queries = role_masks(tokens, tokenizer)
    t = torch.arange(tokens.size(1), device=tokens.device)
    return (keys.sum(-1) / (t + 1))[queries].mean().item()  # uniform: 1 / (t + 1) on each of the keys
    # END SOLUTION


# %%
check_role_score(role_score, role=ROLE)

# %%
check_role_baseline(role_baseline, role=ROLE)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** Every role of the menu is the same computation on two masks: which keys the
# role names for each query, and which queries it applies to. With them, the score and the
# baseline are a few lines each, and the baseline is the score of uniform attention *on the same
# queries*: check it by passing uniform weights to your score. The slips the check names are the
# places where a role's definition is easy to blur: counting key `t` itself as an earlier
# occurrence (every token equals itself, so every query would qualify), averaging over queries
# that have no earlier occurrence (each adds 0 and drags the score down), a baseline divided by
# `L` instead of the `t + 1` keys that query `t` sees, the mask broadcast over the queries instead
# of the keys, a mean over the heads. For a class role the queries are all `t >= 1`, also those
# that see no key of the class yet: they score 0, and so does the baseline there, so the two stay
# comparable.
# <!-- END SOLUTION -->
#
# ## Which heads have your role?
#
# Apply your functions to the shipped model: each layer's weights on `inputs`
# (`model(inputs, return_weights=True)` returns the logits and one `(B, H, L, L)` per layer),
# every head's score, the baseline, and the chapter's threshold, `role_threshold(baseline)`:
# halfway from the baseline to 1. A head **has the role** when its score reaches the threshold.
# Print the scores rounded to 2 decimals, one line per layer, and the heads that have the role.

# %%
# BEGIN SOLUTION
with torch.no_grad():
    _, weights = model(inputs, return_weights=True)  # one (B, H, L, L) per layer
scores = torch.stack([role_score(w, inputs, tokenizer) for w in weights]).cpu()  # (layers, H)
baseline = role_baseline(inputs, tokenizer)
bar = role_threshold(baseline)
print(f"role {ROLE!r}: uniform attention scores {baseline:.2f}; a head has the role from {bar:.2f}")
print("          " + "".join(f"{f'h{h}':>6}" for h in range(model.num_heads)))
for l in range(model.num_layers):
    print(f"layer {l + 1}   " + "".join(f"{v:6.2f}" for v in scores[l].tolist()))
having = [(l + 1, h) for l in range(model.num_layers) for h in range(model.num_heads) if scores[l, h] >= bar]
print("heads with the role (layer, head):", having if having else "none")
# END SOLUTION

# %%
# SOLUTION ONLY
# What the model answer below says, checked on this model, for every role of the menu
# (the checks above test the role chosen; the checks' own tests cover every role of the menu).
from mha_lib.checks.language_model import ROLES

chosen, found = ROLE, {}
for ROLE in ROLES:
    found[ROLE] = (torch.stack([role_score(w, inputs, tokenizer) for w in weights]).cpu(),
                   role_baseline(inputs, tokenizer))
ROLE = chosen
punct, base = found["punctuation"]
assert (punct < role_threshold(base)).all()  # no head has the punctuation role by the rule
leaning = [(l, h) for l in range(2) for h in range(4) if punct[l, h] >= 1.8 * base]
assert leaning == [(1, 2), (1, 3)] and (punct <= 1.25 * base).sum() == 6  # two lean to it, six stay near uniform
same, same_base = found["same token"]
assert (same < same_base).all() and same.max() < 0.041 and 0.042 < same_base < 0.044  # every head below uniform
indent, indent_base = found["indent"]
assert (indent < role_threshold(indent_base)).all() and indent.max() < 1.5 * indent_base
print(f"punctuation: layer 2, heads 2 and 3 at {punct[1, 2]:.2f} and {punct[1, 3]:.2f} (uniform {base:.2f}); "
      f"same token: at most {same.max():.3f}, below uniform {same_base:.3f}; indent: at most {indent.max():.2f} (uniform {indent_base:.2f})")

# %% [markdown]
# Which heads have your role, and by how much do they clear the threshold? Is a head that stays
# below the threshold but far above the baseline doing the role too?
#
# <!-- BEGIN ANSWER -->
# **Model answer.** *(Asserted in the cell above, on the shipped model, for each role of the
# menu.)* For **punctuation**, no head has the role by the rule: the threshold is 0.61, and the
# highest scores are 0.42 and 0.41, heads 2 and 3 of layer 2. That is about twice the 0.21 of
# uniform attention, while the six other heads stay within a quarter of it. So two heads lean
# towards punctuation keys, yet they still put most of their weight (about 0.6) elsewhere: a
# preference, not the role as the chapter's rule defines it. The rule is strict on purpose
# (halfway to 1, fixed before looking); a score between the baseline and the threshold says
# "more than chance", and whether that matters is a question for ablation (exercise 9.2).
#
# The other two roles: no head reaches the threshold for **indent** (at most 0.10 against a
# uniform 0.07), and for **same token** every head scores *below* uniform attention (at most
# 0.040 against 0.043): no head of this model seeks the earlier occurrences of the current token,
# which fits the chapter's finding that no induction head formed.
# <!-- END ANSWER -->
#
# **One run or six?** The shipped model is one run of the chapter's study. The study recorded the
# two class roles, punctuation and indent, for every head of its 6 runs at every evaluation:
# `load_study().runs` (from `mha_lib.textlm.study`) is the list of runs, and for a run `r`,
# `r["probes"][-1]["scores"]["punctuation"]` holds the last evaluation's scores, one list per
# layer, with uniform attention's score in `r["probes"][-1]["scores"]["uniform"]["punctuation"]`.
# They are measured on the study's own held-out windows (128 of them), so they differ from
# yours in the second decimal. For a class role: in how many runs does a head have it? How many
# times uniform attention's score does each run's strongest head reach, and in which layer is
# it? Is the shipped model
# typical? (For "same token", the study's nearest record is chapter 08's duplicate-token score,
# on random tokens: see the chapter's section 7.)

# %%
# BEGIN SOLUTION
from mha_lib.textlm.study import load_study

study_runs = load_study().runs
for role in ("punctuation", "indent"):
    having, strongest = 0, []
    for r in study_runs:
        last = r["probes"][-1]["scores"]
        bar = role_threshold(last["uniform"][role])
        having += any(s >= bar for row in last[role] for s in row)
        strongest.append(max((s / last["uniform"][role], l + 1) for l, row in enumerate(last[role]) for s in row))
    ratios = [ratio for ratio, _ in strongest]
    print(f"{role}: a head with the role in {having} of {len(study_runs)} runs; each run's strongest head at "
          f"{min(ratios):.1f} to {max(ratios):.1f} times uniform, in layer 2 in "
          f"{sum(layer == 2 for _, layer in strongest)} of {len(study_runs)} runs")
    assert having == 0 and max(ratios) < 2.0
    if role == "punctuation":
        assert min(ratios) > 1.6 and all(layer == 2 for _, layer in strongest)
# END SOLUTION

# %% [markdown]
# <!-- BEGIN ANSWER -->
# **Model answer.** *(Asserted in the cell above, from the study file.)* **No run has a head with
# either class role** (0 of 6 for punctuation, 0 of 6 for indent), so the shipped model is typical
# in that. It is typical in its lean too: for **punctuation** every run's strongest head is in
# layer 2, at 1.7 to 2.0 times uniform attention's score, as seed 0's two heads are. For
# **indent** the strongest head reaches 1.3 to 1.8 times uniform, in either layer: a weak lean at
# most. One model suggested the answer; six independent runs make it a finding about this
# configuration.
# <!-- END ANSWER -->
#
# ## Exercise 9.2 · Which heads matter for one token class
#
# A score tests a role you chose; ablation asks the model which heads it needs, and for which
# tokens. Write `class_ablation(model, inputs, targets, classes, cls)` for a `TextTransformer`:
# `inputs` and `targets`, `(B, L)` ids, the targets one token later; `classes`, `(B, L)` long, the
# class of every target (an index into `CLASSES`, as `token_classes` gives it); `cls`, one class's
# index. Return a tensor `(layers, heads)` whose entry `[l, h]` is how much the mean cross-entropy
# (nats) on the targets of class `cls` **rises** when head `h` of layer `l` alone is
# **mean-ablated**:
#
# - head `h`'s output is its `d_k` columns `h * d_k : (h + 1) * d_k` of the input to
#   `model.blocks[l].attn.W_o` (the heads' outputs side by side, `(B, L, D)`, with
#   `d_k = model.blocks[l].attn.d_k`);
# - mean-ablated: those columns replaced, at every position of every sequence, by their mean over
#   the batch **and** the positions, taken from the intact model on the same inputs;
# - the loss of each target: `F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")`,
#   `(B, L)` (`logits[:, t]` predicts `targets[:, t]`); average it over the targets where
#   `classes == cls`, with the head ablated, and subtract the intact model's average on the same
#   targets.
#
# What the check enforces: the result in the **model's dtype** (it hands over float32 and float64
# models); the model left as you found it: its mode (it hands over models in training mode and in
# evaluation mode), `requires_grad`, its weights, no hook left behind, gradients on. It calls your
# function on small untrained models, twice on the same one, and again after the weights change.
# It runs on the CPU. Don't call the functions of `mha_lib.textlm.ablation`.
#
# <details><summary>Hint 1</summary>
#
# A forward pre-hook sees a module's input before the module runs and may replace it:
# `handle = W_o.register_forward_pre_hook(hook)` with `def hook(module, args):` returning
# `(new_input,)`, a changed *copy* of `args[0]`. First run one hook that only records each
# layer's input (for the means), then one hook per ablated head. Call `handle.remove()` in a
# `finally:` block, right after the forward pass.
# </details>
# <details><summary>Hint 2</summary>
#
# `was_training = model.training` before, `model.train(was_training)` after, if you switch to
# evaluation mode; `with torch.no_grad():` keeps autograd out without touching `requires_grad`.
# </details>

# %%
def class_ablation(model, inputs, targets, classes, cls):
    # BEGIN SOLUTION
    picked = classes == cls  # (B, L): the targets of the class

    def class_loss():
        per_target = F.cross_entropy(model(inputs).transpose(1, 2), targets, reduction="none")  # (B, L)
        return per_target[picked].mean()

    recorded = []  # each layer's input to W_o in the intact model, (B, L, D)
    record = [block.attn.W_o.register_forward_pre_hook(lambda module, args: recorded.append(args[0]))
              for block in model.blocks]
    try:
        with torch.no_grad():
            intact = class_loss()
    finally:
        for handle in record:
            handle.remove()
    means = [x.mean(dim=(0, 1)) for x in recorded]  # (D,) per layer: over the batch and the positions

    rows = []
    with torch.no_grad():
        for l, block in enumerate(model.blocks):
            row = []
            for h in range(block.attn.num_heads):
                cols = slice(h * block.attn.d_k, (h + 1) * block.attn.d_k)

                def ablate(module, args, mean=means[l][cols], cols=cols):
                    x = args[0].clone()
                    x[..., cols] = mean  # head h says its average, everywhere
                    return (x,)

                handle = block.attn.W_o.register_forward_pre_hook(ablate)
                try:
                    row.append(class_loss() - intact)
                finally:
                    handle.remove()
            rows.append(torch.stack(row))
    return torch.stack(rows)  # (layers, heads)
    # END SOLUTION


# %%
check_class_ablation(class_ablation)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** A mean-ablated head says the same thing everywhere: what it computed from *this*
# text is gone, while the average it adds to the stream stays. Zeroing it instead would also
# remove that average, a shift the model never saw in training, and blame the head for it. The
# mean must be over the batch *and* the positions: a mean per position keeps what the head does
# at each position on average (and with it much of a positional head's work), a mean per sequence
# keeps what it says about each sequence. The model here has no dropout, so its mode changes no
# number, but a function that switches it and leaves it switched changes what the next cell
# runs; the check hands the model over in both modes to catch that. Recording the means and
# ablating are both hooks on `W_o`, removed in `finally:` blocks, so an error half-way leaves no
# head silenced for good.
# <!-- END SOLUTION -->
#
# ## Which head matters most for your class?
#
# Pick a class of `CLASSES` (`"newline"`, `"indent"`, `"punctuation"`, `"word start"` or
# `"word piece"`). On `inputs` and `targets`, compute the class of every target
# (`token_classes(tokenizer, inputs, targets)`, a CPU tensor: move it to `device`), how many
# targets are of your class, the intact model's loss on them (`class_losses(model, inputs,
# targets, classes)` gives every class's), and your table. Print them rounded to 2 decimals, and
# the head whose ablation raises the loss most.

# %%
CLASS = "punctuation"  # your choice

# BEGIN SOLUTION
cls = CLASSES.index(CLASS)
classes = token_classes(tokenizer, inputs, targets).to(device)  # (B, L): the class of every target
intact = class_losses(model, inputs, targets, classes)[cls].item()
table = class_ablation(model, inputs, targets, classes, cls).cpu()  # (layers, heads)
print(f"class {CLASS!r}: {int((classes == cls).sum())} of {classes.numel()} targets; "
      f"intact model's loss on them {intact:.2f} nats")
print("loss increase, one head mean-ablated")
print("          " + "".join(f"{f'h{h}':>7}" for h in range(model.num_heads)))
for l in range(model.num_layers):
    print(f"layer {l + 1}   " + "".join(f"{v:7.2f}" for v in table[l].tolist()))
l, h = divmod(int(table.argmax()), model.num_heads)
print(f"matters most: layer {l + 1}, head {h} (+{table[l, h]:.2f} nats)")
# END SOLUTION

# %%
# SOLUTION ONLY
# What the model answer below says, checked on this model.
assert CLASS == "punctuation" and (l, h) == (1, 2)  # head 2 of layer 2 matters most ...
assert table[1, 2] - table[1, 3] > 0.005 and leaning == [(1, 2), (1, 3)]  # ... then head 3: the two leaning heads
assert table[1].min() > 2 * table[0].max()  # every head of layer 2 matters more than any of layer 1
assert 0.1 < table[1, 2] / intact < 0.2  # about an eighth of the intact loss
print(f"layer 2: {table[1].min():.2f} to {table[1].max():.2f}; layer 1: at most {table[0].max():.2f}; "
      f"intact {intact:.2f}")

# %% [markdown]
# Which head matters most for your class, and how does its cost compare with the intact loss and
# with the other heads? Does that head have one of the roles the chapter and exercise 9.1 score?
#
# <!-- BEGIN ANSWER -->
# **Model answer.** *(Asserted in the cell above, on the shipped model.)* For **punctuation**
# (891 of the 4,096 targets, an intact loss of about 2.81 nats), head 2 of layer 2 matters most:
# mean-ablated, it raises the loss by about 0.37 nats, an eighth of the intact loss. Head 3 of
# layer 2 comes close (about 0.35), and every head of layer 2 costs more (0.21 to 0.37) than any
# head of layer 1 (0.08 at most).
#
# The two heads that matter most are the two that exercise 9.1 found leaning towards punctuation
# keys (0.42 and 0.41, twice uniform attention, below the threshold): the heads that look at
# punctuation are the ones the model needs most to predict it. But the link is loose: heads 0 and 1
# of layer 2 matter almost as much (0.24 and 0.21) without any lean, and no head has the role by
# the rule. Of the chapter's roles, head 2 has one, *local* (it reads the last four tokens; the
# chapter's section 6 asserts it), and head 3 none; but heads 0 and 1 are local heads too, so
# that role does not tell the punctuation heads apart. A score says where a head looks; the ablation says what the model loses without what
# it writes. Neither replaces the other, and this is one run: the chapter's seed study says which
# findings hold across runs.
# <!-- END ANSWER -->
#
# ## Recap
#
# - A role is two masks: the keys it names for each query, and the queries it applies to. Its
#   score is the weight on those keys pooled over those queries; its baseline is the same score
#   for uniform attention, `1 / (t + 1)` per visible key, and the chapter's rule puts the bar
#   halfway from that baseline to 1.
# - Mean-ablation replaces a head's output by its average over the batch and the positions, with a
#   forward pre-hook on `W_o` that is removed afterwards; the loss it costs, per token class, says
#   which tokens the head is needed for.

# %% [markdown]
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/09_heads_in_a_language_model.ipynb`, then go on to chapter 10.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 10.
# <!-- END SOLUTION -->
