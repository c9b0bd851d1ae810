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
# # Exercises · Chapter 01 · Attention from one dot product
#
# Five exercises, from a warm-up to the whole of scaled dot-product attention, and then a scale
# that you measure instead of assuming.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=01`, or `.venv/bin/python -m mha_course start 01`; see the README), so that
# updates to the course never overwrite your work.

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
    raise NotImplementedError  # your code here


# %%
check_attention_scores(attention_scores)

# %% [markdown]
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
    raise NotImplementedError  # your code here


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
    raise NotImplementedError  # your code here


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
    raise NotImplementedError  # your code here


# %%
check_scaled_dot_product_attention(scaled_dot_product_attention)

# %% [markdown]
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
    raise NotImplementedError  # your code here


# %%
check_unit_variance_scale(unit_variance_scale)

# %%
# your code here

# %% [markdown]
# *Your answer here (double-click this cell to edit it).*
#
# ## Done?
#
# Compare with `solutions/01_dot_product_attention.ipynb`, then go on to chapter 02.
