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
# # Solutions · Chapter 10 · Efficient attention
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/10_efficient_attention.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# <!-- END SOLUTION -->
#
# Two exercises, one per optimisation of chapter 10: fuse the three input projections into
# one, and compute attention block by block without ever holding the whole `(Lq, Lk)` weight
# matrix, the idea behind flash attention.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=10`, or `.venv/bin/python -m mha_course start 10`; see the README), so that
# updates to the course never overwrite your work.
# -->

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
    # BEGIN SOLUTION
    parts = (mha.W_q, mha.W_k, mha.W_v)
    weight = mha.W_q.weight
    fused = nn.Linear(mha.d_model, 3 * mha.d_model, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))  # (3D, D)
        fused.bias.copy_(torch.cat([p.bias for p in parts]))  # (3D,)
    return fused
    # END SOLUTION


# %%
check_fused_projection(fuse_projections)

# %% [markdown]
# Prove it yourself too: for a module and an input of your choice, the three chunks of the
# fused output equal the three projections.

# %%
# BEGIN SOLUTION
mha = MultiHeadAttention(16, 4)
x = torch.randn(2, 5, 16)
q, k, v = fuse_projections(mha)(x).chunk(3, dim=-1)  # three (2, 5, 16)
print("fused == separate:", all(torch.allclose(a, b(x), atol=1e-6) for a, b in ((q, mha.W_q), (k, mha.W_k), (v, mha.W_v))))
# END SOLUTION

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
    # BEGIN SOLUTION
    scale = 1 / math.sqrt(query.size(-1))
    m = torch.full((*query.shape[:-1], 1), float("-inf"), dtype=query.dtype, device=query.device)  # (..., Lq, 1)
    l = torch.zeros_like(m)  # (..., Lq, 1)
    o = torch.zeros(*query.shape[:-1], value.size(-1), dtype=query.dtype, device=query.device)  # (..., Lq, d_v)
    for start in range(0, key.size(-2), block_size):
        k_block = key[..., start : start + block_size, :]  # (..., b, d_k)
        v_block = value[..., start : start + block_size, :]  # (..., b, d_v)
        scores = query @ k_block.transpose(-2, -1) * scale  # (..., Lq, b)
        m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))
        p = torch.exp(scores - m_new)  # (..., Lq, b), at most 1
        correction = torch.exp(m - m_new)  # shrinks what was accumulated under the old maximum
        l = l * correction + p.sum(dim=-1, keepdim=True)
        o = o * correction + p @ v_block
        m = m_new
    return o / l
    # END SOLUTION


# %%
check_blockwise_attention(blockwise_attention)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The loop holds only a `(Lq, block_size)` tile of scores at a time, which is why
# the memory of flash attention grows linearly with the length. Real kernels also tile the
# queries and keep the tiles in the GPU's fast on-chip memory; the arithmetic is this one.
# <!-- END SOLUTION -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/10_efficient_attention.ipynb`, then go on to chapter 11.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 11.
# <!-- END SOLUTION -->
