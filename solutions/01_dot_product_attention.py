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
# # Solutions · Chapter 01 · Attention from one dot product
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/01_dot_product_attention.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# > Try the exercise first; come here to compare.
# <!-- END SOLUTION -->
#
# Five exercises, from a warm-up to the whole of scaled dot-product attention, and then a scale
# that you measure instead of assuming.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=01`, or `.venv/bin/python -m mha_course start 01`; see the README), so that
# updates to the course never overwrite your work.
# -->

# %%
import math

import torch

from mha_lib.checks import (
    check_attention_scores,
    check_causal_mask,
    check_padding_mask,
    check_scaled_dot_product_attention,
    check_unit_variance_scale,
)

# %% [markdown]
# ## Exercise 1.1 · Scores (warm-up)
#
# Write `attention_scores(query, key)` that returns the scaled dot-product scores
# $QK^\top / \sqrt{d_k}$.
#
# - `query`: `(..., Lq, d_k)`, `key`: `(..., Lk, d_k)`; the `...` are any leading axes (batch, heads).
# - Return `(..., Lq, Lk)`: entry `[i, j]` is how well query `i` matches key `j`.
#
# <details><summary>Hint 1</summary>
#
# `@` multiplies the last two axes and broadcasts the others. Which two axes of `key` must you swap?
# </details>
# <details><summary>Hint 2</summary>
#
# `key.transpose(-2, -1)` swaps the last two axes whatever the number of leading ones;
# `d_k` is `query.size(-1)`.
# </details>

# %%
def attention_scores(query, key):
    # BEGIN SOLUTION
    d_k = query.size(-1)
    return query @ key.transpose(-2, -1) / math.sqrt(d_k)
    # END SOLUTION


# %%
check_attention_scores(attention_scores)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** `key.T` would be wrong as soon as there is a batch axis: on a 3-D tensor it
# reverses *all* axes. `key.mT` is a short spelling of `key.transpose(-2, -1)`.
# <!-- END SOLUTION -->
#
# ## Exercise 1.2 · A causal mask
#
# Write `causal_mask(seq_len)` returning a boolean tensor of shape `(seq_len, seq_len)` in which
# `mask[i, j]` is `True` when query `i` **may attend** to key `j`, that is when `j <= i`: every
# token sees itself and the tokens before it, never the ones after.
#
# <details><summary>Hint</summary>
#
# `torch.tril` keeps the lower triangle of a matrix, diagonal included. Start from
# `torch.ones(seq_len, seq_len, dtype=torch.bool)`.
# </details>

# %%
def causal_mask(seq_len):
    # BEGIN SOLUTION
    return torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    # END SOLUTION


# %%
check_causal_mask(causal_mask)

# %% [markdown]
# ## Exercise 1.3 · A padding mask
#
# A batch holds sequences of different `lengths` (a list of ints), padded to `max_len`, which may
# be longer than the longest of them. Write `padding_mask(lengths, max_len=None)` returning a
# boolean tensor of shape `(B, 1, 1, max_len)`: `mask[b, 0, 0, j]` is `True` for the real tokens
# (`j < lengths[b]`) and `False` for the padding. Without `max_len`, pad to the longest sequence:
# the same arguments as the `mha_lib.padding_mask` that chapter 01 uses. The two axes of size 1
# let the mask broadcast over heads and queries of scores `(B, H, Lq, Lk)`.
#
# <details><summary>Hint 1</summary>
#
# Turn the list into a tensor with `torch.as_tensor(lengths)`, then compare the positions
# `torch.arange(max_len)` with the lengths; broadcasting a `(1, max_len)`
# tensor against a `(B, 1)` tensor gives `(B, max_len)`.
# </details>
# <details><summary>Hint 2</summary>
#
# `x[:, None, None, :]` inserts the two axes of size 1.
# </details>

# %%
def padding_mask(lengths, max_len=None):
    # BEGIN SOLUTION
    lengths = torch.as_tensor(lengths)
    if max_len is None:
        max_len = int(lengths.max())
    keep = torch.arange(max_len)[None, :] < lengths[:, None]  # (B, max_len)
    return keep[:, None, None, :]  # (B, 1, 1, max_len)
    # END SOLUTION


# %%
check_padding_mask(padding_mask)

# %% [markdown]
# ## Exercise 1.4 · Scaled dot-product attention
#
# Now the whole thing. Write `scaled_dot_product_attention(query, key, value, mask=None)`
# returning `(output, weights)`:
#
# - `query` `(..., Lq, d_k)`, `key` `(..., Lk, d_k)`, `value` `(..., Lk, d_v)`;
# - `weights = softmax(QKᵀ/√d_k)` over the keys, `(..., Lq, Lk)`;
# - `output = weights @ value`, `(..., Lq, d_v)`;
# - `mask` (optional) is boolean, broadcastable to `(..., Lq, Lk)`, **True = may attend**: blocked
#   scores become `-inf` before the softmax. The check never blocks every key of a query
#   (chapter 04 deals with that case).
#
# Don't modify the inputs in place, and keep them in the computation: the outputs have the
# inputs' dtype (float32 in, float32 out), and the check backpropagates through your function, so
# gradients must reach `query`, `key` and `value` (no `.detach()`, no `torch.no_grad()`).
#
# <details><summary>Hint 1</summary>
#
# Reuse your `attention_scores`. `scores.masked_fill(~mask, float("-inf"))` blocks where the
# mask is False.
# </details>
# <details><summary>Hint 2</summary>
#
# `torch.softmax(scores, dim=-1)`: each query's weights are spread over the keys, the last axis.
# </details>

# %%
def scaled_dot_product_attention(query, key, value, mask=None):
    # BEGIN SOLUTION
    scores = attention_scores(query, key)  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights  # (..., Lq, d_v), (..., Lq, Lk)
    # END SOLUTION


# %%
check_scaled_dot_product_attention(scaled_dot_product_attention)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** Masking *before* the softmax matters: zeroing weights after it leaves rows
# that no longer sum to 1. `masked_fill_` (in place) would be harmless here, because `scores`
# is a new tensor; in place on `query` or `mask` it would change the caller's data, which the
# check detects.
# <!-- END SOLUTION -->
#
# ## Exercise 1.5 · A scale measured, not assumed
#
# Section 6 of the chapter divides by $\sqrt{d_k}$ because the dot product of two vectors whose
# $d_k$ entries have variance 1 has variance $d_k$. Real queries and keys are not like that: some
# features are much larger than others, and queries and keys may be large in the same features.
#
# Write `unit_variance_scale(query, key)` that returns the number $s$ for which the scores
# `query @ key.transpose(-2, -1) / s` have **variance 1**, measured over every score (all leading
# axes, queries and keys) of the inputs it is given.
#
# - `query` `(..., Lq, d_k)`, `key` `(..., Lk, d_k)`; return one number, a Python `float` (a 0-d
#   tensor is accepted).
# - The check hands over float64 and float32 inputs, some with leading axes, queries and keys of
#   other sizes than 1, features of different sizes, and calls your function twice with inputs of
#   the same shapes. It also calls it once with inputs on another device (a stand-in for a GPU):
#   make no tensor of your own on the CPU.
#
# Then, in the cell after the check, **measure** what the choice changes: for queries and keys
# whose 4 first features (of 32) are 8 times larger than the others, compare √d_k with your
# scale: the variance of the scaled scores, and the average largest softmax weight of a query
# over 16 keys. Which would you use, and what would it cost to compute it in a model?
#
# <details><summary>Hint 1</summary>
#
# Dividing a set of numbers by their standard deviation leaves them with variance 1.
# </details>
# <details><summary>Hint 2</summary>
#
# `(query @ key.transpose(-2, -1)).std()` reduces over every axis; `.item()` makes it a float.
# </details>

# %%
def unit_variance_scale(query, key):
    # BEGIN SOLUTION
    raw = query @ key.transpose(-2, -1)  # (..., Lq, Lk), not scaled
    return raw.std().item()
    # END SOLUTION


# %%
check_unit_variance_scale(unit_variance_scale)

# %%
# BEGIN SOLUTION
g = torch.Generator().manual_seed(0)
loud = torch.tensor([4.0] * 4 + [0.5] * 28)  # 4 large features, 28 small ones, alike in queries and keys
q = torch.randn(500, 32, generator=g) * loud  # (Lq, d_k)
k = torch.randn(16, 32, generator=g) * loud  # (Lk, d_k)
largest = {}
for name, scale in [("√d_k", math.sqrt(32)), ("measured", unit_variance_scale(q, k))]:
    scores = q @ k.T / scale  # (Lq, Lk)
    largest[name] = torch.softmax(scores, dim=-1).max(dim=-1).values.mean().item()
    print(f"{name:8s}  scale {scale:5.1f}   variance of the scores {scores.var():6.2f}   "
          f"average largest weight {largest[name]:.2f}")
assert largest["√d_k"] > 0.75 and largest["measured"] < 0.3  # what the discussion below says
# END SOLUTION

# %% [markdown]
# <!-- BEGIN ANSWER -->
# **Discussion.** With √d_k, the scores of these queries and keys have a variance above 40, not
# 1, and a query gives on average about 0.8 of its weight to one key out of 16: the softmax is
# close to the saturation that section 6 warned about. The measured scale, more than six times
# √d_k, brings the variance back to 1 and the largest weight to about 0.25. The spread of a
# score is set by $\sum_i \mathrm{var}(q_i)\,\mathrm{var}(k_i)$, which grows most when queries and
# keys are large *in the same features*; √d_k is that sum only when every entry has variance 1.
# A model does not measure the scale on each batch: it would make each query's output depend on
# the other queries of the batch, and differ between training and inference. It keeps √d_k, and
# relies on training and on normalisation layers (such as LayerNorm) to keep the sizes of its
# queries and keys in range.
# <!-- END ANSWER -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/01_dot_product_attention.ipynb`, then go on to chapter 02.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 02.
# <!-- END SOLUTION -->
