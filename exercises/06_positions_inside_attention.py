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
# # Exercises · Chapter 06 · Positions inside attention
#
# Three exercises: two on rotary positions (RoPE), rotating queries and keys by their positions
# and then using the rotation in one attention step, and one on ALiBi's bias on the scores.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=06`, or `.venv/bin/python -m mha_course start 06`; see the README), so that
# updates to the course never overwrite your work.

# %%
import torch

from mha_lib import scaled_dot_product_attention
from mha_lib.checks import check_alibi_bias, check_apply_rotary, check_rotary_attention

# %% [markdown]
# ## Exercise 6.1 · Rotate by position
#
# Write `apply_rotary(x, positions)` for `x` of shape `(..., L, d_k)` with an even `d_k` and
# `positions` an integer tensor `(L,)`. Use the course's **half-split** pairing: feature `i` and
# feature `i + d_k/2` form pair `i`, for `i = 0 .. d_k/2 - 1`; at position `m`, pair `i` is turned
# by the angle `m · θ_i` with `θ_i = 10000^(-2i/d_k)`:
#
# $$(a, b) \mapsto (a\cos\varphi - b\sin\varphi,\; a\sin\varphi + b\cos\varphi).$$
#
# Return a tensor of the same shape, the rotated first halves in features `[0, d_k/2)` and the
# rotated second halves in `[d_k/2, d_k)`. **Device and dtype:** the result has `x`'s dtype and
# device; make every tensor you create (the frequencies, the angles) in `x.dtype` and on
# `x.device`, and move `positions` there (the check runs your function in float64, and once more
# with its inputs on another device). Don't call `mha_lib.apply_rotary`: the check compares your
# code with it.
#
# <details><summary>Hint 1</summary>
#
# `theta = 10000 ** (-2 * torch.arange(d_k // 2, dtype=x.dtype) / d_k)` has shape `(d_k/2,)`;
# `positions[:, None] * theta` gives every angle, `(L, d_k/2)`, which broadcasts against
# `x[..., :d_k//2]` of shape `(..., L, d_k/2)`.
# </details>
# <details><summary>Hint 2</summary>
#
# Do the arithmetic in `x`'s dtype (the check uses float64 and compares to its precision): the
# `dtype=x.dtype` of `theta` above, and `positions.to(x.dtype)`. Join the two rotated halves with
# `torch.cat([..., ...], dim=-1)`.
# </details>

# %%
def apply_rotary(x, positions):
    raise NotImplementedError  # your code here


# %%
check_apply_rotary(apply_rotary)

# %% [markdown]
# Prove the offset property with your function: for one query vector and one key vector of
# your choice, the score of the query at position `i` and the key at position `j` is the same
# for `(i, j) = (3, 1)`, `(10, 8)` and `(100, 98)`.

# %%
# your code here

# %% [markdown]
# ## Exercise 6.2 · One rotary attention step
#
# Write `rotary_attention(query, key, value, mask=None)` for per-head tensors `(B, H, L, d_k)`
# (the output of `split_heads`): rotate what needs rotating with the positions `0 .. L-1`, then
# attend with `scaled_dot_product_attention` (imported above; `mask` as in chapter 04, True = may
# attend). Return the output `(B, H, L, d_k)`, in the inputs' dtype and on their device: make the
# positions on the query's device, `torch.arange(L, device=query.device)` (the check runs your
# function in float64, and once more with its inputs on another device). You may use your
# `apply_rotary` from 6.1.
#
# <details><summary>Hint</summary>
#
# Which of the three tensors decide *where to look*, and which one is *what gets handed over*?
# Chapter 06, section 6.
# </details>

# %%
def rotary_attention(query, key, value, mask=None):
    raise NotImplementedError  # your code here


# %%
check_rotary_attention(rotary_attention)

# %% [markdown]
# ## Exercise 6.3 · An ALiBi bias
#
# Write `alibi_bias(num_heads, seq_len, device=None)`: ALiBi's bias on the scores (chapter 06,
# section 7), a **float32** tensor `(num_heads, seq_len, seq_len)` with
#
# $$\text{bias}[h, i, j] = -m_h \cdot |i - j|$$
#
# for query `i` and key `j`: 0 on the diagonal, and more negative the farther the key, before or
# after the query (the paper defines it for decoders, keys `j ≤ i`, and a decoder adds its causal
# mask separately; `|i - j|` extends it to keys after the query, for encoders). Each head `h` has a fixed slope `m_h`:
#
# - when `num_heads` is a power of two, a geometric sequence that starts at $2^{-8/H}$ with that same
#   ratio: $m_h = 2^{-8(h+1)/H}$ for `h = 0 .. H-1` (8 heads: 1/2, 1/4, …, 1/256; 4 heads: 1/4,
#   1/16, 1/64, 1/256);
# - otherwise, as in the paper's code (and BLOOM's): the `n` slopes of `n` heads, `n` the largest
#   power of two below `H`, followed by every other slope of `2n` heads (its 1st, 3rd, 5th, …) until
#   there are `H`. For 6 heads: 1/4, 1/16, 1/64, 1/256 (`n = 4`), then 1/2 and 1/8 (the 1st and
#   3rd of the 8 heads' 1/2, 1/4, 1/8, …).
#
# Create the tensor on `device` (`None`: the CPU), as `mha_lib.alibi_bias(num_heads, seq_len,
# device)` does: a model on the GPU needs its bias there. Don't call `mha_lib.alibi_bias` or
# `mha_lib.positions.alibi_slopes`: the check compares your code with them.
#
# <details><summary>Hint 1</summary>
#
# Build the slopes first, as a list of Python floats: a helper `powers_of_two(n)` that returns
# `[2 ** (-8 * (h + 1) / n) for h in range(n)]` does both cases. The largest power of two
# `n <= H` is `2 ** (H.bit_length() - 1)` (or start at `n = 1` and double it while `2 * n <= H`);
# with `n == H` nothing is added. `torch.tensor(slopes, device=device)` is then float32 `(H,)`.
# </details>
# <details><summary>Hint 2</summary>
#
# `pos = torch.arange(seq_len, device=device)`; `(pos[:, None] - pos[None, :]).abs()` is the
# distance `|i - j|`, `(L, L)`. `slopes[:, None, None]`, `(H, 1, 1)`, times it broadcasts to
# `(H, L, L)`. The check also asks for `device=torch.device("meta")`, a device with shapes but no
# numbers, in place of a GPU: every tensor you create must be on `device`.
# </details>

# %%
def alibi_bias(num_heads, seq_len, device=None):
    raise NotImplementedError  # your code here


# %%
check_alibi_bias(alibi_bias)

# %% [markdown]
# Look at what your function gives: print the slopes it uses for 6 heads (`-bias[:, 1, 0]`) next
# to those for 4 and 8 heads, and check that every head's bias depends on `i - j` only (it is
# constant along every diagonal).

# %%
# your code here

# %% [markdown]
# ## Done?
#
# Compare with `solutions/06_positions_inside_attention.ipynb`, then go on to chapter 07.
