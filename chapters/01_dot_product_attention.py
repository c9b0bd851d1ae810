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
# # Chapter 01 · Attention from one dot product
#
# Attention is how a transformer lets every position of a sequence *look at* the other
# positions and pull in what it needs. Under the hood it is one small formula:
#
# $$\text{Attention}(Q, K, V) = \text{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V$$
#
# This chapter builds that formula one piece at a time, starting from a single dot product.
#
# **By the end of this chapter you will be able to**
#
# - explain attention as a *soft* dictionary lookup with queries, keys and values;
# - compute dot-product scores, turn them into weights with softmax, and blend values with them;
# - say why the scores are divided by $\sqrt{d_k}$, and show it with an experiment;
# - block positions with padding and causal masks;
# - write `attention(query, key, value, mask)` yourself, and prove it equals
#   `mha_lib.scaled_dot_product_attention` and PyTorch's `F.scaled_dot_product_attention`.
#
# *Sources.* The database analogy and the step-by-step view follow Priyesh Dave's post
# "Day 28: Multi-Head Attention" (DEV Community); the scaled dot-product calculation follows
# *Transformers in Action* (Manning), section 2.2.3. The $\sqrt{d_k}$ argument is from
# Vaswani et al., "Attention Is All You Need" (2017), section 3.2.1.

# %% [markdown]
# ## Set-up
#
# Every notebook of the course starts the same way: pick the device (CUDA when there is
# one; set the environment variable `MHA_DEVICE=cpu` to force the CPU) and seed every random
# generator, so that your numbers are the ones printed here. We create random tensors on the
# CPU and then move them, because the CPU and a GPU draw different numbers from the same seed.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import mha_lib
from mha_lib import causal_mask, get_device, padding_mask, plot_attention, seed_everything

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. A lookup you already know
#
# A Python dictionary maps **keys** to **values**. You ask with a **query**, and you get the
# value whose key matches it *exactly*:

# %%
legs = {"cat": 4, "dog": 4, "car": 0, "bus": 0}
print(legs["cat"])
print("kitten" in legs)

# %% [markdown]
# A query that matches no key gets nothing, even though a kitten is obviously close to a cat.
# Attention is a *soft* lookup: instead of demanding an exact match, it
#
# 1. scores how well the query matches **every** key,
# 2. turns the scores into **weights** that are positive and sum to 1,
# 3. returns the **weighted average of all the values**.
#
# To score "how well it matches" we need the words as vectors. Here is a hand-made
# two-feature embedding: the first number says "animal-like", the second "vehicle-like".
# (In a real model these vectors are learned; chapter 02 adds the projections that learn them.)

# %%
words = ["cat", "dog", "car", "bus"]
keys = torch.tensor([
    [1.0, 0.2],   # cat
    [0.9, 0.4],   # dog
    [0.1, 1.0],   # car
    [-0.1, 0.9],  # bus
])
values = torch.tensor([
    [1.0, 0.0],  # cat: [animal, vehicle]
    [1.0, 0.0],  # dog
    [0.0, 1.0],  # car
    [0.0, 1.0],  # bus
])
query = torch.tensor([1.0, 0.1])  # "kitten"
print("keys:", tuple(keys.shape), " values:", tuple(values.shape), " query:", tuple(query.shape))

# %% [markdown]
# ## 2. The dot product measures similarity
#
# The dot product $q \cdot k = \sum_i q_i k_i = \lVert q\rVert\,\lVert k\rVert \cos\theta$ is large when
# the two vectors point the same way, zero when they are at right angles, and negative when
# they point apart. One matrix-vector product scores the query against every key at once:

# %%
scores = keys @ query  # (4, 2) @ (2,) -> (4,)
for word, score in zip(words, scores.tolist()):
    print(f"kitten · {word:3s} = {score:6.2f}")

# %% [markdown]
# The picture: the query is the black arrow; keys pointing its way get high scores.

# %%
fig, ax = plt.subplots(figsize=(5, 4.2))
for word, k, s in zip(words, keys, scores):
    ax.annotate("", xy=k.tolist(), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="tab:blue"))
    dx = -0.32 if word == "bus" else 0.03  # keep the bus label clear of the car arrow
    ax.text(k[0] + dx, k[1] + 0.03, f"{word} ({s:.2f})", color="tab:blue")
ax.annotate("", xy=query.tolist(), xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="black", lw=2))
ax.text(query[0] + 0.03, query[1] - 0.1, "query: kitten")
ax.set(xlim=(-0.6, 1.4), ylim=(-0.3, 1.2), xlabel="animal-like", ylabel="vehicle-like",
       title="Dot-product scores (in brackets)")
ax.axhline(0, color="grey", lw=0.5)
ax.axvline(0, color="grey", lw=0.5)
plt.show()

# %% [markdown]
# ## 3. Softmax turns scores into weights
#
# Scores can be any real numbers. Softmax makes them positive (with $e^x$) and makes them sum
# to 1 (by dividing by the total), keeping their order:
#
# $$\text{softmax}(s)_j = \frac{e^{s_j}}{\sum_{j'} e^{s_{j'}}}$$

# %%
weights = torch.softmax(scores, dim=0)
print("scores: ", scores)
print("weights:", weights)
print("sum of weights:", round(weights.sum().item(), 6))

# %% [markdown]
# Adding the same number to every score changes nothing: only the gaps between scores matter.
# Multiply the scores by a number larger than 1 and the gaps widen, so the weights get sharper
# (closer to a hard lookup); by a number smaller than 1 and they get flatter (closer to a plain
# average). Keep this in mind for section 6.

# %%
for factor in [0.1, 1.0, 5.0, 50.0]:
    print(f"scores x {factor:4}: weights = {torch.softmax(factor * scores, dim=0)}")

# %% [markdown]
# ## 4. The output is a weighted average of the values
#
# Each value is multiplied by its weight and the results are added: `weights @ values`.
# Because "kitten" is most similar to the animal keys, the answer is mostly "animal":

# %%
output = weights @ values  # (4,) @ (4, 2) -> (2,)
print("output [animal, vehicle]:", output)

# %% [markdown]
# That is attention: **score, softmax, blend**. Everything else in this course is about
# doing it for many queries at once, learning the vectors, and running several copies side by side.
#
# ## 5. Many queries at once
#
# Stack the queries as the rows of a matrix $Q$ of shape `(Lq, d_k)`, the keys as the rows of
# $K$ `(Lk, d_k)` and the values as the rows of $V$ `(Lk, d_v)`. Then
#
# - $QK^\top$ is the `(Lq, Lk)` table of every query-key score,
# - the softmax runs along each **row** (over the keys, `dim=-1`): each query distributes its
#   attention over the keys,
# - multiplying by $V$ gives one blended value per query, `(Lq, d_v)`.

# %%
query_words = ["kitten", "puppy", "truck"]
queries = torch.tensor([[1.0, 0.1], [0.9, 0.3], [0.0, 1.1]])

scores = queries @ keys.T                # (3, 2) @ (2, 4) -> (3, 4)
weights = torch.softmax(scores, dim=-1)  # each row sums to 1
outputs = weights @ values               # (3, 4) @ (4, 2) -> (3, 2)
print("scores: ", tuple(scores.shape))
print("weights:", tuple(weights.shape), " row sums:", weights.sum(dim=-1))
print("outputs:", tuple(outputs.shape))
print(outputs)

# %% [markdown]
# The weights table is best read as a picture, an **attention map**: one row per query, one
# column per key, darker = more attention. `mha_lib.plot_attention` draws it with the tokens
# as labels.

# %%
plot_attention(weights, query_words, words, title="Who attends to whom", vmax=1)
plt.show()

# %% [markdown]
# The colour scale runs from 0 to 1 (`vmax=1`), so a pale map means flat weights. And they
# are rather flat: no weight is above 0.37, and "truck" still gives a third of its attention
# to animals.
# With such short vectors the scores are small. Real models use vectors of 64 numbers per head
# or more, and then the opposite problem appears.
#
# ## 6. Why divide by $\sqrt{d_k}$?
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, then
# $q\cdot k = \sum_{i=1}^{d_k} q_i k_i$ is a sum of $d_k$ terms of variance 1: its variance is
# $d_k$, so its typical size grows like $\sqrt{d_k}$. Let's measure it.

# %%
dims = [4, 16, 64, 256, 1024]
n = 20_000
print(" d_k   var(q·k)   var(q·k / √d_k)")
variances, scaled_variances = [], []
for d_k in dims:
    q = torch.randn(n, d_k)
    k = torch.randn(n, d_k)
    dots = (q * k).sum(dim=-1)  # n independent dot products
    variances.append(dots.var().item())
    scaled_variances.append((dots / math.sqrt(d_k)).var().item())
    print(f"{d_k:4d} {variances[-1]:10.1f} {scaled_variances[-1]:12.2f}")

# %% [markdown]
# Large scores are a problem for the softmax: as section 3 showed, multiplying scores by a
# big number pushes the weights towards a single 1 and zeros elsewhere. The softmax
# **saturates**, and a saturated softmax passes almost no gradient back to its scores.
# Below, one query attends over 16 random keys; we record the largest weight and the size of
# the gradient that flows back to the scores, with and without the scaling.

# %%
def softmax_stats(d_k: int, scale: bool, trials: int = 500) -> tuple[float, float]:
    """Average largest weight, and average gradient norm w.r.t. the scores."""
    q = torch.randn(trials, 1, d_k)
    k = torch.randn(trials, 16, d_k)
    scores = (q @ k.transpose(-2, -1)).squeeze(1)  # (trials, 16)
    if scale:
        scores = scores / math.sqrt(d_k)
    scores.requires_grad_(True)
    weights = torch.softmax(scores, dim=-1)
    # Gradient of a fixed random mix of the weights, as a loss would produce.
    (weights * torch.randn(trials, 16)).sum().backward()
    return weights.max(dim=-1).values.mean().item(), scores.grad.norm(dim=-1).mean().item()


stats = {scale: [softmax_stats(d, scale) for d in dims] for scale in (False, True)}
print(" d_k   max weight (raw / scaled)   gradient norm (raw / scaled)")
for d_k, (raw_w, raw_g), (sc_w, sc_g) in zip(dims, stats[False], stats[True]):
    print(f"{d_k:4d}        {raw_w:.2f} / {sc_w:.2f}               {raw_g:.3f} / {sc_g:.3f}")

# %%
fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
axes[0].loglog(dims, variances, "o-", label="q·k")
axes[0].loglog(dims, scaled_variances, "o-", label="q·k / √d_k")
axes[0].set(xlabel="d_k", ylabel="variance of the score", title="Scores grow with d_k")
for ax, i, name in ((axes[1], 0, "average largest weight"), (axes[2], 1, "average gradient norm")):
    ax.semilogx(dims, [s[i] for s in stats[False]], "o-", label="unscaled")
    ax.semilogx(dims, [s[i] for s in stats[True]], "o-", label="scaled by 1/√d_k")
    ax.set(xlabel="d_k", title=name)
for ax in axes:
    ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Unscaled, the largest weight heads for 1 and the softmax's gradient for 0 as $d_k$ grows:
# each query looks at almost one key. Vaswani et al. suspect this slows training; we measured
# only the softmax itself. Dividing by $\sqrt{d_k}$ keeps the scores at variance 1 for every
# $d_k$, so the softmax stays in its useful range.
#
# ## 7. Masks: positions that must not be looked at
#
# Sometimes a query must ignore some keys. A **mask** says which ones. In this course a
# boolean mask means **True = may attend** (the convention of `F.scaled_dot_product_attention`).
# Blocked scores are set to $-\infty$ before the softmax, so their weight is $e^{-\infty} = 0$.
# (`nn.MultiheadAttention` reads boolean masks the opposite way, True = blocked; chapter 05
# converts between the two.)
#
# **Padding masks.** Sentences in a batch have different lengths, so the short ones are
# padded to the length of the longest. No query should attend to the padding.
# `padding_mask(lengths, max_len=None)` returns `(B, 1, 1, Lk)`, where `Lk` is `max_len` or
# else the longest length. You write your own in exercise 1.3.
#
# **Broadcasting** is PyTorch's rule for combining tensors of different shapes: line the shapes
# up from the right, and stretch every axis of size 1 to the other tensor's size (without
# copying). So against scores `(B, H, Lq, Lk)`, the two 1s give every head (chapter 03) and
# every query of sentence `b` the same row of keys.

# %%
sentences = [["the", "movie", "was", "not", "bad"], ["great", "film", "<pad>", "<pad>", "<pad>"]]
lengths = [5, 2]
keep = padding_mask(lengths)
print("mask shape:", tuple(keep.shape))
print(keep[:, 0, 0])

# %% [markdown]
# We attend over random stand-in vectors `x` with the padding mask, and draw the second
# sentence's map:

# %%
B, L, d_k = 2, 5, 8
x = torch.randn(B, L, d_k)  # stand-in token vectors, used as queries, keys and values


def masked_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


padded = masked_weights(x, x, keep[:, 0])  # (2, 5, 5); keep[:, 0] is (B, 1, Lk) for 3-D scores
print("weights:", tuple(padded.shape))
plot_attention(padded[1], sentences[1], title="Padding mask: no attention to <pad>")
plt.show()

# %% [markdown]
# The token vectors are random: meaningful ones come with training (chapter 07). What matters
# is where the zeros are: no query attends to `<pad>`. (The rows of the padding queries
# themselves are computed but simply ignored later.) The strong diagonal, here and in the
# causal map below, has a simple cause: `x` supplies both the queries and the keys, and a
# random vector matches itself best (chapter 02, section 2 explains why).
#
# **Causal masks.** A model that generates text one token at a time must not peek at tokens
# it has not produced yet: query $i$ may attend to keys $0 \dots i$ only. The mask is the lower
# triangle of an `(L, L)` matrix.

# %%
causal = causal_mask(L)
print(causal.int())
plot_attention(masked_weights(x[0], x[0], causal), sentences[0], title="Causal mask: no peeking ahead")
plt.show()

# %% [markdown]
# Every row still sums to 1: the first token can only attend to itself, so its weight is 1.
#
# ## 8. The whole thing as one function
#
# Putting sections 5 to 7 together gives scaled dot-product attention. It works for any
# number of leading dimensions (batch, and later heads), because `@` and `softmax(dim=-1)`
# act on the last two.

# %%
def attention(query, key, value, mask=None):
    """query (..., Lq, d_k), key (..., Lk, d_k), value (..., Lk, d_v) -> (..., Lq, d_v), (..., Lq, Lk)"""
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))    # True = may attend
    weights = torch.softmax(scores, dim=-1)                  # over the keys
    return weights @ value, weights                          # (..., Lq, d_v)


# %% [markdown]
# The course's library `mha_lib` ships the same function as
# `mha_lib.scaled_dot_product_attention`, and PyTorch has its own,
# `torch.nn.functional.scaled_dot_product_attention` (which returns only the output, and
# picks a fast kernel for your hardware). The three must agree. We check on a batch of
# 2 x 3 independent attention problems, with 4 queries, 6 keys, $d_k = 8$ and $d_v = 5$,
# with and without a mask, on the course's device.

# %%
q = torch.randn(2, 3, 4, 8).to(device)
k = torch.randn(2, 3, 6, 8).to(device)
v = torch.randn(2, 3, 6, 5).to(device)
# Padding: sequence 0 has 6 real keys, sequence 1 has 3 real keys and 3 of padding.
# Causal: query i may see keys 0 ... i. With 4 queries and 6 keys, that is the first 4 rows
# of the (6, 6) lower triangle (query 0 lines up with key 0, as PyTorch's is_causal does when Lq ≠ Lk).
pad, causal4 = padding_mask([6, 3]).to(device), causal_mask(6)[:4].to(device)  # (2, 1, 1, 6), (4, 6)

for name, m in [("no mask", None), ("padding", pad), ("causal", causal4), ("padding & causal", pad & causal4)]:
    ours, ours_weights = attention(q, k, v, m)
    lib, lib_weights = mha_lib.scaled_dot_product_attention(q, k, v, m)
    torch_out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert ours.shape == lib.shape == torch_out.shape == (2, 3, 4, 5)
    assert torch.allclose(ours, lib, atol=1e-6) and torch.allclose(ours_weights, lib_weights, atol=1e-6)
    assert torch.allclose(ours, torch_out, atol=1e-5)
    print(f"{name}: ours == mha_lib == PyTorch (within 1e-5), output shape {tuple(ours.shape)}")

# %% [markdown]
# `mha_lib`'s version also checks its inputs and gives clear errors (try passing a key with
# the wrong width), supports float masks that are *added* to the scores, attention dropout,
# and handles a query whose keys are all masked without producing NaN. Chapter 04 shows why
# that last case needs care.

# %%
try:
    mha_lib.scaled_dot_product_attention(q, torch.randn(2, 3, 6, 7).to(device), v)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## Recap
#
# - Attention is a soft lookup: score the query against every key, softmax the scores into
#   weights, and return the weighted average of the values.
# - The dot product is the score: large when query and key point the same way.
# - Softmax runs over the keys (`dim=-1`); each query's weights are positive and sum to 1.
# - Scores grow like $\sqrt{d_k}$; dividing by $\sqrt{d_k}$ keeps the softmax out of
#   saturation, where the softmax's gradient vanishes.
# - Masks block keys: True = may attend; blocked scores become $-\infty$, so their weight is 0.
#   Padding masks hide padding, causal masks hide the future.
# - In matrix form: $\text{softmax}(QK^\top/\sqrt{d_k})\,V$, with shapes
#   `(Lq, d_k) x (d_k, Lk) -> (Lq, Lk)`, then `(Lq, Lk) x (Lk, d_v) -> (Lq, d_v)`.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/01_dot_product_attention.ipynb`; each exercise
# checks itself and tells you what is wrong. See the README for how to start your own copy.
# Exercises 1.1 to 1.4 rebuild the scores, the two masks and the whole function; exercise 1.5
# asks for what section 6 assumed: it measures the scale that gives the scores variance 1 when
# the entries of the queries and keys don't have variance 1, and what √d_k does to the softmax
# then.
#
# ## What comes next
#
# Here the queries, keys and values were given. In **chapter 02** a sequence attends to
# *itself*: trainable projections $W_q, W_k, W_v$ turn each token's embedding into its query,
# key and value, and we watch one attention head at work on "The movie was not bad".
