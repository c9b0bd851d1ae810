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
# # Exercises · Chapter 10 · Efficient attention
#
# Two exercises, one per optimisation of chapter 10: fuse the three input projections into
# one, and compute attention block by block without ever holding the whole `(Lq, Lk)` weight
# matrix, the idea behind flash attention.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=10`, or `.venv/bin/python -m mha_course start 10`; see the README), so that
# updates to the course never overwrite your work.

# %%
import math

import torch
from torch import nn

from mha_lib import MultiHeadAttention
from mha_lib.checks import check_blockwise_attention, check_fused_projection

# %% [markdown]
# ## Exercise 10.1 · Fuse the three projections
#
# Write `fuse_projections(mha)` that returns one `nn.Linear(d_model, 3 * d_model)` computing
# the queries, keys and values of a `MultiHeadAttention` in a single matrix product: its output,
# cut into three along the last axis, must be `(W_q(x), W_k(x), W_v(x))`. **Device and dtype:**
# make the layer on the module's device and in its dtype (`nn.Linear(..., device=..., dtype=...)`):
# the check hands over float64 and float32 modules, and one on another device. Leave the module as
# you found it (its mode, `requires_grad`, hooks and weights), and build a new layer on every call:
# the check calls your function again after changing the module's weights.
#
# <details><summary>Hint</summary>
#
# `nn.Linear.weight` has shape `(out_features, in_features)`. Stacking three
# `(d_model, d_model)` weights on top of each other (dim 0) gives `(3 * d_model, d_model)`. Copy
# under `torch.no_grad()`, biases included.
# </details>

# %%
def fuse_projections(mha):
    raise NotImplementedError  # your code here


# %%
check_fused_projection(fuse_projections)

# %% [markdown]
# Prove it yourself too: for a module and an input of your choice, the three chunks of the
# fused output equal the three projections.

# %%
# your code here

# %% [markdown]
# ## Exercise 10.2 · Attention, one block of keys at a time
#
# Flash attention never stores the `(Lq, Lk)` weights. It walks over the keys in blocks and keeps,
# for every query, three running quantities: the largest score seen so far `m`, the sum of
# `exp(score - m)` so far `l`, and the weighted sum of values so far `o`. When a new block
# raises the maximum from `m` to `m_new`, everything accumulated so far is rescaled by
# `exp(m - m_new)`; at the end, `o / l` is exactly `softmax(QKᵀ/√d_k) V`.
#
# Write `blockwise_attention(query, key, value, block_size)` that does this (no mask): query
# `(..., Lq, d_k)`, key `(..., Lk, d_k)`, value `(..., Lk, d_v)`; return the output
# `(..., Lq, d_v)`. `Lk` need not be a multiple of `block_size`. Compute one block's scores at a
# time, in a loop: the check records the sizes of the products your code computes, and refuses the
# `(Lq, Lk)` scores and all the blocks' scores computed at once (keys reshaped into blocks). Make
# the running quantities in the query's dtype and on its device (the check runs your function once
# more on another device).
#
# <details><summary>Hint 1</summary>
#
# Start with `m = -inf`, `l = 0` and `o = 0`, of shapes `(..., Lq, 1)`, `(..., Lq, 1)` and
# `(..., Lq, d_v)`. Slicing `key[..., start:start + block_size, :]` handles the last, shorter block.
# </details>
# <details><summary>Hint 2</summary>
#
# For each block: `scores` `(..., Lq, b)`; `m_new = maximum(m, scores.amax(-1, keepdim=True))`;
# `p = exp(scores - m_new)`; `l = l * exp(m - m_new) + p.sum(-1, keepdim=True)`;
# `o = o * exp(m - m_new) + p @ value_block`.
# </details>

# %%
def blockwise_attention(query, key, value, block_size):
    raise NotImplementedError  # your code here


# %%
check_blockwise_attention(blockwise_attention)

# %% [markdown]
# ## Done?
#
# Compare with `solutions/10_efficient_attention.ipynb`, then go on to chapter 11.
