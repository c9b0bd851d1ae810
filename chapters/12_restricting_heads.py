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
# # Chapter 12 · Restricting where heads may look
#
# The course ends where its first source ends. Priyesh Dave's post "Day 28: Multi-Head
# Attention" closes with a challenge: change the multi-head code so that **the first head may
# attend only to the first half of the sequence and the second head only to the second half**,
# run it, see how the outputs differ from the unrestricted module, and write a few sentences on
# what changed and what it says about the role of heads.
#
# The challenge is not a toy. Restricting where a head may look is one way models handle long
# inputs. Full attention computes `L × L` scores per head and layer: about 17 billion at
# `L = 131 072` (128k tokens). Llama 3.1 and Qwen 2.5 pay that over 128k-token contexts with
# fused kernels such as flash attention (chapter 10), which make the **memory** linear in `L`;
# the **compute** still grows like `L²`, 64 times more for a text 8 times longer. A head that
# may look at `W` keys needs only `L · W` scores, if the kernel skips the rest. This chapter
# builds the restrictions real models use (chapter 11's causal window is one), then sets up the
# challenge, which you solve in `exercises/12_restricting_heads.ipynb`.
#
# **By the end of this chapter and its exercise you will be able to**
#
# - build the masks of **local (sliding-window)**, **global** and **block-sparse** attention as
#   `(L, L)` boolean tensors, count what each one costs, and compute how far information can
#   travel through a stack of restricted layers;
# - give each head **its own** mask of shape `(H, L, L)`, and know how it broadcasts through
#   `mha_lib.MultiHeadAttention` (and which shape would silently do something else);
# - say precisely what "head 0 attends only to the first half" means, for even and odd lengths;
# - compare a restricted module with an unrestricted one, measure what the restriction costs a
#   trained model, and back your explanation with measurements over many independent runs.
#
# *Sources.* The challenge is the "Try it yourself" of Priyesh Dave's post (DEV Community).
# Restricted attention in real models: Child et al., "Generating Long Sequences with Sparse
# Transformers" (2019); Beltagy et al., "Longformer: The Long-Document Transformer" (2020);
# Zaheer et al., "Big Bird: Transformers for Longer Sequences" (2020); Jiang et al.,
# "Mistral 7B" (2023).

# %%
import matplotlib.pyplot as plt
import torch

from mha_lib import MultiHeadAttention, get_device, plot_attention, seed_everything, sliding_window_mask

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. Where a head may look is a design choice
#
# A mask (chapter 04) says, for every query, which keys it may attend to: `True` = may attend.
# The causal mask of a language model is already a restriction: no token may look ahead. Models
# for long inputs restrict much more. Four small helpers build the patterns they use, for a
# sequence of `L` tokens; each returns an `(L, L)` bool mask, rows = queries, columns = keys.
#
# - **Local (sliding-window) attention**: query `i` may attend only to the `W` keys nearest to it.
#   As in chapter 11, the **window `W` counts the keys a query sees, itself included**. Mistral
#   7B uses a causal window, `W = 4096`: query `i` sees keys `i - W + 1 … i`, that is
#   `0 <= i - j < W`, exactly `mha_lib.sliding_window_mask(L, W)`. (The Mistral paper writes
#   the span as `i - W … i`, one key more; implementations differ by that one key, and this
#   course counts `W` so that a rolling cache of `W` entries holds exactly one window.)
#   Longformer uses a window on both sides: `W = 2h + 1` keys, the query and `h` on each side,
#   `|i - j| <= h`.
# - **Global tokens** (Longformer): a few chosen positions, such as a classification token, see
#   every token and are seen by every token, so that the whole input can meet in one place.
# - **Block-local attention**: the sequence is cut into blocks and each query sees its own block.
#   BigBird computes its pattern block by block (window, global and a few random blocks),
#   because whole blocks are what GPU kernels handle fast.
# - **Strided attention** (the Sparse Transformer): query `i` sees every `s`-th earlier position.

# %%
def sliding_window(L, W, causal=False):
    """(L, L): query i may attend to W keys, itself included: causal, 0 <= i - j < W;
    two-sided (W odd), |i - j| <= W // 2."""
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]  # (L, 1), (1, L)
    if causal:
        return (i - j >= 0) & (i - j < W)
    if W % 2 == 0:
        raise ValueError(f"a two-sided window has an odd number of keys (the query and W // 2 on each side), got {W}")
    return (i - j).abs() <= W // 2


def with_global(mask, positions):
    """Longformer's global attention: these positions see every token and every token sees them."""
    mask = mask.clone()
    mask[positions, :] = True
    mask[:, positions] = True
    return mask


def block_local(L, block):
    """(L, L): each query may attend to the keys of its own block of `block` positions."""
    blocks = torch.arange(L) // block  # (L,) the block of each position
    return blocks[:, None] == blocks[None, :]


def strided(L, stride):
    """(L, L), causal: query i may attend to i, i - stride, i - 2 * stride, ..."""
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return (j <= i) & ((i - j) % stride == 0)


L = 16
patterns = {
    "causal (chapter 04)": torch.ones(L, L, dtype=torch.bool).tril(),
    "sliding window, W = 5": sliding_window(L, 5),
    "causal window, W = 4": sliding_window(L, 4, causal=True),
    "window + global token 0": with_global(sliding_window(L, 5), [0]),
    "blocks of 4 + global 0": with_global(block_local(L, 4), [0]),
    "strided, every 4th": strided(L, 4),
}
assert torch.equal(patterns["causal window, W = 4"], sliding_window_mask(L, 4))  # chapter 11's: the same W
for name, mask in patterns.items():
    print(f"{name:26} {tuple(mask.shape)}  keys per query: {mask.sum(1).min().item():2d} to "
          f"{mask.sum(1).max().item():2d}  ({mask.float().mean().item():4.0%} of the L x L scores)")

# %%
fig, axes = plt.subplots(1, len(patterns), figsize=(2.3 * len(patterns), 2.9), layout="constrained")
for ax, (name, mask) in zip(axes, patterns.items()):
    ax.imshow(mask, cmap="Blues", vmin=0, vmax=1.4)
    ax.set_title(name, fontsize=9)
    ax.set_xticks([0, L - 1])
    ax.set_yticks([0, L - 1])
    ax.set_xlabel("key")
axes[0].set_ylabel("query")
fig.suptitle(f"Where each query may look (L = {L}; shaded = may attend)")
plt.show()

# %% [markdown]
# What a restriction can buy is the cost: full attention computes `L` scores per query, a window
# `W` of them, whatever `L` is. So the work grows like `L · W` instead of `L²`, with a kernel that
# skips the blocked scores: chapter 10's `blockwise_attention` skips every tile of 128 × 128
# scores that a mask blocks entirely; with this chapter's halves mask at `L = 1024` it computed
# 32 of each head's 64 tiles, in about half the time it took to compute them all (0.48 and 0.57
# of it, in two runs on one CPU thread). A mask alone saves nothing: `mha_lib`'s modules (like
# `F.scaled_dot_product_attention` with a mask) still compute all `L²` scores, then block most
# of them. The saving needs a kernel built for the pattern: Longformer's banded kernel,
# BigBird's blocks, FlashAttention's `window_size`, FlexAttention's block masks. Here for a
# two-sided window of `W = 513` keys (Longformer's `w = 512`: 256 on each side, 513 keys
# counting the query as this course does):

# %%
W = 513
h = W // 2  # keys on each side
print(f"{'L':>7} {'full: scores per head':>24} {'window W = 513':>16} {'saving':>8}")
for n in (512, 4096, 32768, 131072):
    window = sliding_window(n, W).sum().item() if n <= 4096 else n * W - h * (h + 1)  # exact count
    print(f"{n:7d} {n * n:24,d} {window:16,d} {n * n / window:7.1f}x")

# %% [markdown]
# The counts for the two longest sequences come from a formula (`W` keys per query, fewer near
# the ends), since the masks are too costly to build: at `L = 32 768`, `sliding_window`'s int64
# offsets `i - j` alone take 8.6 GB, and at 131 072 even the bool mask takes 17 GB. Where the
# mask is small, the formula agrees with it:

# %%
for n in (512, 4096):
    assert sliding_window(n, W).sum().item() == n * W - h * (h + 1)  # minus the corners
print("the formula counts the window mask exactly")

# %% [markdown]
# ## 2. What a stack of restricted layers can still see
#
# A window hides distant tokens from one layer, not from the model. With a causal window of `W`
# keys, in layer 1 token `i` gathers tokens `i - (W - 1)` to `i`; in layer 2 it attends to token
# `i - (W - 1)`, which already holds what came from `i - 2(W - 1)`. Information moves `W - 1`
# positions per layer, so after `k` layers up to `k · (W - 1)` positions back: Mistral 7B's
# argument for its window of `W = 4096` in 32 layers (the paper's window, `i - W … i`, holds one
# key more, so it gets exactly `k · W`: 32 · 4096 = 131 072, "about 131k tokens").
#
# Which positions reach a token after `k` layers is a product of masks: position `j` reaches
# query `i` through a middle token `m` when `i` may attend to `m` and `m` (one layer earlier) was
# reached from `j`. With the masks as 0/1 matrices, that is a matrix product, `> 0`.

# %%
def reach(masks):
    """reach[i, j] after each layer: can information from position j have arrived at position i?"""
    reached = torch.eye(masks[0].size(0), dtype=torch.bool)  # before any layer: only itself
    out = []
    for mask in masks:  # one mask per layer
        reached = (mask.int() @ reached.int()) > 0  # i <- m (this layer), m <- j (the layers before)
        out.append(reached)
    return out


window = sliding_window(L, 4, causal=True)  # W = 4 keys: itself and the 3 before it
layers = reach([window] * 4)
for k, reached in enumerate(layers, start=1):
    assert reached[-1].sum().item() == k * (4 - 1) + 1  # the last token: itself and k * (W - 1) positions back
print("the last token hears from", [reached[-1].sum().item() for reached in layers], "positions after 1-4 layers")

fig, axes = plt.subplots(1, 4, figsize=(10, 2.9), layout="constrained")
for k, (ax, reached) in enumerate(zip(axes, layers), start=1):
    ax.imshow(reached, cmap="Blues", vmin=0, vmax=1.4)
    ax.set_title(f"after {k} layer{'s' * (k > 1)}", fontsize=9)
    ax.set_xlabel("from position")
axes[0].set_ylabel("to position")
fig.suptitle("A causal window of W = 4: what can reach each position")
plt.show()

# %% [markdown]
# ## 3. A different view for each head
#
# Nothing says every head must obey the same mask. The Sparse Transformer splits the work
# between two heads: one sees the last few positions (a causal window), the other every
# `s`-th earlier position (strided). Neither head sees much, but inside one layer their outputs
# are concatenated and mixed by `W_o` (chapter 03), so each position receives both views, and
# after two layers every earlier position can reach every later one (this needs the stride to be
# at most the window; here both are 4):

# %%
local, stride = sliding_window(L, 4, causal=True), strided(L, 4)  # window of W = 4 keys; every 4th key
both_heads = local | stride  # what one layer brings to each position: the union of its heads' views
first, second = reach([both_heads, both_heads])
assert torch.equal(second, torch.ones(L, L, dtype=torch.bool).tril())  # every earlier position, in 2 layers
print(f"keys per query: local head {local.sum(1).max().item()}, strided head {stride.sum(1).max().item()}; "
      f"after 2 layers the last token hears from {second[-1].sum().item()} of {L} positions")

# %% [markdown]
# To give each head its own mask, stack them into one `(H, L, L)` tensor. The scores inside
# `MultiHeadAttention` have shape `(B, H, Lq, Lk)`, and PyTorch lines shapes up **from the
# right**, so a mask of shape `(H, Lq, Lk)` is read as `(1, H, Lq, Lk)`: one `(Lq, Lk)` mask per
# head, the same for every sequence of the batch. That is exactly what a per-head restriction
# needs.

# %%
B, H, L = 2, 2, 4
scores_shape = (B, H, L, L)
for mask_shape in [(L, L), (H, L, L), (1, H, L, L), (B, 1, 1, L), (H, 1, L, L)]:
    print(f"mask {str(mask_shape):14} -> broadcast to {tuple(torch.broadcast_shapes(mask_shape, scores_shape))}")

# %% [markdown]
# All five broadcast, and that is the trap in the last one: `(H, 1, L, L)` lines its first
# axis up with the **batch**, so "head 0's mask" would apply to *sequence* 0 (every head of it).
# When `B == H`, as in the tiny configuration below, nothing fails; the model is just wrong.
# `(H, L, L)` or `(1, H, L, L)` is the shape to use.
#
# Here are the Sparse Transformer's two heads in `mha_lib.MultiHeadAttention`, on the source
# post's tiny configuration (batch 2, sequence 4, embedding 8, random weights) with a stride of 2:

# %%
seed_everything(0)
mha = MultiHeadAttention(d_model=8, num_heads=2).to(device)
x = torch.randn(2, 4, 8).to(device)  # (B, L, d_model)

per_head = torch.stack([sliding_window(L, 2, causal=True), strided(L, 2)]).to(device)  # (H, L, L)
print("per-head mask:", tuple(per_head.shape))
out, weights = mha(x, x, x, mask=per_head, return_weights=True)
print("output:", tuple(out.shape), " weights:", tuple(weights.shape))
assert (weights.masked_select(~per_head) == 0).all()  # (B, H, L, L): zero wherever the head's mask says no
assert torch.allclose(weights.sum(-1), torch.ones(B, H, L).to(device))  # each row still sums to 1
plot_attention(weights[0], [f"x{i}" for i in range(L)], head_titles=["head 0: causal window, W = 2",
               "head 1: strided, every 2nd"], title="One mask per head (sequence 0)")
plt.show()

# %% [markdown]
# Each head's weights are zero wherever its own mask says no, and each row still sums to 1 over
# the keys the head may see. Restricting heads differently is also a way to *make* them
# specialize: the Sparse Transformer's heads cannot help doing different jobs.
#
# ## 4. The challenge: each head gets half of the sequence
#
# The post's restriction is the bluntest per-head pattern of all. A head attends *from* queries
# *to* keys, and "head 0 attends only to the first half" restricts the **keys** head 0 may look
# at; it says nothing about which queries it serves. So, for a sequence of length `L`:
#
# - for **every** query `i`, head 0 may attend to the keys at positions `[0, L // 2)`;
# - for **every** query `i`, head 1 may attend to the keys at positions `[L // 2, L)`.
#
# Every position still gets an output from both heads: one blended from the first half, one
# from the second. Unlike a window, the view does not move with the query; and unlike the
# Sparse Transformer's heads, the two views don't overlap at all, although together they cover
# the whole sequence in a single layer. (Restricting the *queries* instead would leave half of
# the positions of each head with no output at all, a different and stranger model.)
#
# **Odd lengths.** With `L = 5` the halves can't be equal. The course splits at `L // 2`
# (floor division): head 0 gets keys 0-1, head 1 gets keys 2-4; the middle token belongs to the
# second half. Any fixed rule would do, as long as it is stated; this one is what the exercise
# checks. And with `L = 1` head 0 has no key at all: its row is fully masked, which
# `mha_lib` turns into zero weights and a zero output (chapter 04), not NaN.
#
# Here is the picture for `L = 6` and `L = 5` (shaded = may attend), drawn with a small helper
# of this chapter; building the mask as a tensor is the exercise.

# %%
def draw_halves(ax_pair, L: int) -> None:
    """Shade, for each head, the keys it may attend to (rows = queries, columns = keys)."""
    split = L // 2
    for head, ax in enumerate(ax_pair):
        allowed = [[(j < split) == (head == 0) for j in range(L)] for _ in range(L)]
        ax.imshow(allowed, cmap="Blues", vmin=0, vmax=1.6)
        ax.set_title(f"L = {L}, head {head}")
        ax.set_xticks(range(L))
        ax.set_yticks(range(L))
        ax.set_xlabel("key")
        ax.set_ylabel("query")


fig, axes = plt.subplots(1, 4, figsize=(12, 3.2), layout="constrained")
draw_halves(axes[:2], 6)
draw_halves(axes[2:], 5)
plt.show()

# %% [markdown]
# ## 5. What to look for
#
# With the restricted module in hand (same weights as the unrestricted one, only the mask
# differs), the exercise asks you to compare the two:
#
# 1. **The per-head maps, side by side.** Where did each head's attention go before, and where
#    is it now? How much of head 0's attention used to fall on the second half?
# 2. **The output difference per position and per head.** Which positions change most? Look at
#    each head's output *before* `W_o` (its slice of the concatenated heads), then at the final
#    output, where `W_o` mixes the heads.
# 3. **What each head's output is made of.** Head `h`'s output at query `i` is
#    $\sum_j w^{(h)}_{ij}\, v^{(h)}_j$. After the restriction, head 0's output must be a blend of
#    first-half values only: show it, for instance by changing the second half's values and
#    watching head 0's blend stay the same for a fixed set of weights.
# 4. **A trained model.** In the runs where chapter 07's sentiment model learned the task, it
#    combines "not" with the word it negates (it gets the negated sentences right). Retrain it
#    with restricted heads and measure its accuracy on sentences where "not" and the sentiment
#    word fall in the same half versus different halves. In a padded batch the
#    halves must come from each sentence's **own** length: `halves_mask(L)` of the padded length
#    would put a short sentence entirely in head 0's half and leave head 1 nothing but padding.
#    (The model's `<cls>` token sits at position 0, so it always belongs to head 0's half.)
# 5. **What else differs between the groups.** Where "not" and the sentiment word fall is set by
#    the template that drew the sentence and its optional words, so the two negated groups also
#    differ by template. Before you credit a gap to the halves, compare sentences of the same
#    template and length (`mha_lib.sentiment.probes.template_of`, `halves_strata`).
#
# Start from the baseline: chapter 07's model, trained without restriction, tested on the three
# groups of held-out sentences. Each independent two-head run of the seed study
# (`mha_lib.sentiment.load_study()`, `independent(run)`) has its own seed and sentences, so each
# is one sample.
#
# The thresholds come from chance, 50% with two balanced labels, never from the results: a run
# *learned* the task (chapter 07) when it gets 95% or more of the negated and of the plain
# sentences, a tenth of a guess's errors; an accuracy is *near chance* when it is closer to 50%
# than to 95%, below 72.5%. Each run stores them in `run["baselines"]`.

# %%
from mha_lib.sentiment import load_study, make_datasets
from mha_lib.sentiment.findings import independent, learned
from mha_lib.sentiment.plots import plot_runs
from mha_lib.sentiment.probes import HALVES_GROUPS, halves_groups

_, test = make_datasets()
print("held-out sentences per group (data seed 0):", {name: len(idx) for name, idx in halves_groups(test).items()})


def independent_halves(run):
    """A run that counts (two heads, its own seed and sentences, not a replica), halves measured."""
    return independent(run) and "halves" in run


study = load_study()
runs = [run for run in study.runs if independent_halves(run)]
assert runs == [run for run in study.runs if independent(run)]  # every independent two-head run measured the halves
free = {group: (lambda run, group=group: run["halves"]["free, tested free"][group]) for group in HALVES_GROUPS}
lowest = {id(run): min(f(run) for f in free.values()) for run in runs}  # the run's weakest group
learned_runs = [run for run in runs if learned(run)]
all_three = [run for run in learned_runs if lowest[id(run)] >= run["baselines"]["learned_at"]]
print(f"independent two-head runs: {len(runs)}; learned the task: {len(learned_runs)}; "
      f"of those, 95% or more in all three groups: {len(all_three)}")
print("the others' weakest group:", [f"{lowest[id(run)]:.0%}" for run in learned_runs if run not in all_three])
assert 3 * len(all_three) > 2 * len(learned_runs)  # "most": more than two in three (chapter 07)
assert all(lowest[id(run)] >= run["baselines"]["near_chance"] for run in learned_runs)  # none near chance
fig, ax = plt.subplots(figsize=(8, 3.2), layout="constrained")
plot_runs(ax, study, free, where=independent_halves,
          title="Trained freely, tested freely: one dot per independent run of the seed study")
plt.show()

# %% [markdown]
# Most runs that learned the task get 95% or more in all three groups, whatever the halves; in
# the others one group falls short of 95%, but stays closer to 95% than to chance. Every dot
# near chance belongs to a run that did not learn the task. The exercise measures what the
# restriction takes away from there.
#
# Then the written part: a few sentences on what changed and what this suggests about the role
# of attention heads. One trained model is one sample (chapter 07 showed how much a single run
# can mislead), so make your claims about the model *you* trained, and say which ones you would
# expect to hold for any seed.
#
# ## Your turn
#
# - Start your copy: `make exercise N=12` (or `.venv/bin/python -m mha_course start 12`), then open
#   `workspace/12_restricting_heads.ipynb`. The exercise notebook is
#   `exercises/12_restricting_heads.ipynb`; its checks (`check_halves_mask`,
#   `check_restricted_attention`) tell you what is wrong, if anything.
# - Write your answer before you read the model answer.
#
# ## After the exercise
#
# The model answer is in `solutions/12_restricting_heads.ipynb`, Part 4. It does not rest on the
# one model the notebook trains: it reads the course's **seed study**, the same free and
# restricted models trained in many independent runs, each from its own seed on its own
# sentences (`mha_lib.sentiment.load_study()`; `make study` re-runs it), says only what held
# across those runs, with the counts printed from the file, and checks that the gap between the
# halves is not the templates' doing. Compare your own model with those distributions: it is one
# dot among them.
#
# ## Recap of the course
#
# - **Chapter 01:** attention is a soft lookup: score, softmax, blend; divide by $\sqrt{d_k}$;
#   masks block keys.
# - **Chapter 02:** trainable projections turn embeddings into queries, keys and values; attention
#   alone ignores order.
# - **Chapter 03:** several heads are the same computation on slices of the features, in one
#   batched call: the parameter count of one wide head, split into several views.
# - **Chapter 04:** padding and causal masks, cross-attention, and rows with nothing to attend to.
# - **Chapter 05:** a module is proven against PyTorch's own, to the tolerance its dtype allows.
# - **Chapter 06:** positions enter attention from outside: added to the embeddings, as a
#   rotation of each head's queries and keys (RoPE) that makes scores depend on the offset, or
#   as a bias on the scores that depends on the offset only (ALiBi's fixed slopes per head,
#   T5's learned buckets).
# - **Chapter 07:** heads of a trained model specialize, ablation measures what each one is for,
#   and only a study over many independent runs says which findings are robust.
# - **Chapter 08:** heads compose across layers: a second-layer induction head finds the earlier
#   copy of a token through what a first-layer head wrote, which no single layer can do.
# - **Chapter 10:** the same maths, fused, without ever storing the `L × L` weights: tiles and
#   an online softmax.
# - **Chapter 11:** at inference a model caches each layer's keys and values; fewer key/value
#   heads (MQA, GQA), sliding windows and multi-head latent attention (MLA, which caches one
#   small latent per token and folds the up-projections away) keep that cache small.
# - **Chapter 12:** a mask per head decides what each head may see: windows, global tokens and
#   blocks make long inputs affordable, and the halves restriction shows what a head's view costs.
#
# ## Where to go next
#
# - Vaswani et al., "Attention Is All You Need" (2017): the paper, now easy to read.
# - The Annotated Transformer (Harvard NLP): the whole model, line by line.
# - Beltagy et al., "Longformer" (2020), and Jiang et al., "Mistral 7B" (2023): restricted
#   attention at scale, in a few readable pages each.
# - Sebastian Raschka, *Build a Large Language Model (From Scratch)*, chapter 3, and the
#   attention chapters of *Dive into Deep Learning* (d2l.ai): other paths through the same ideas.
# - *Transformers in Action* (Manning), the book this course drew its encoder examples from.
