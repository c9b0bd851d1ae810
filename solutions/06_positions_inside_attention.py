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
# # Solutions · Chapter 06 · Positions inside attention
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/06_positions_inside_attention.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# <!-- END SOLUTION -->
#
# Two exercises on rotary positions (RoPE): rotate queries and keys by their positions, then
# use the rotation in one attention step.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=06`, or `.venv/bin/python -m mha_course start 06`; see the README), so that
# updates to the course never overwrite your work.
# -->

# %%
import torch

from mha_lib import scaled_dot_product_attention
from mha_lib.checks import check_apply_rotary, check_rotary_attention

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
# rotated second halves in `[d_k/2, d_k)`. Don't call `mha_lib.apply_rotary`: the check compares
# your code with it.
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
    # BEGIN SOLUTION
    half = x.size(-1) // 2
    theta = 10000.0 ** (-2 * torch.arange(half, dtype=x.dtype) / x.size(-1))  # (d_k/2,)
    angle = positions.to(x.dtype)[:, None] * theta  # (L, d_k/2)
    a, b = x[..., :half], x[..., half:]  # (..., L, d_k/2) each
    return torch.cat([a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()], dim=-1)
    # END SOLUTION


# %%
check_apply_rotary(apply_rotary)

# %% [markdown]
# Prove the offset property with your function: for one query vector and one key vector of
# your choice, the score of the query at position `i` and the key at position `j` is the same
# for `(i, j) = (3, 1)`, `(10, 8)` and `(100, 98)`.

# %%
# BEGIN SOLUTION
q, k = torch.randn(2, 1, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # (L = 1, d_k = 8) each
for i, j in [(3, 1), (10, 8), (100, 98)]:
    score = apply_rotary(q, torch.tensor([i])) @ apply_rotary(k, torch.tensor([j])).T
    print(f"query at {i}, key at {j}: {score.item():.6f}")
# END SOLUTION

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The pairing is a convention, and the one place where RoPE code differs between
# libraries. Hugging Face computes the same thing as `x * cos + rotate_half(x) * sin`, with every
# angle written twice (`cat([freqs, freqs])`) and `rotate_half(x) = cat([-x2, x1])`; the check
# accepts both ways of writing it. RoFormer's paper pairs neighbours `(2i, 2i + 1)`, which is the
# same rotation of differently ordered features: fine for a model trained that way, wrong for
# weights trained with half-split pairs.
# <!-- END SOLUTION -->

# %% [markdown]
# ## Exercise 6.2 · One rotary attention step
#
# Write `rotary_attention(query, key, value, mask=None)` for per-head tensors `(B, H, L, d_k)`
# (the output of `split_heads`): rotate what needs rotating with the positions `0 .. L-1`, then
# attend with `scaled_dot_product_attention` (imported above; `mask` as in chapter 04, True = may
# attend). Return the output `(B, H, L, d_k)`. You may use your `apply_rotary` from 6.1.
#
# <details><summary>Hint</summary>
#
# Which of the three tensors decide *where to look*, and which one is *what gets handed over*?
# Chapter 06, section 6.
# </details>

# %%
def rotary_attention(query, key, value, mask=None):
    # BEGIN SOLUTION
    positions = torch.arange(query.size(-2))
    q, k = apply_rotary(query, positions), apply_rotary(key, positions)  # the values stay as they are
    output, _ = scaled_dot_product_attention(q, k, value, mask)  # (B, H, L, d_k)
    return output
    # END SOLUTION


# %%
check_rotary_attention(rotary_attention)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** Rotating the values too is the mistake the check looks for first: the output
# would then carry each key's absolute position, and shifting the whole sequence would change it.
# Rotating only the queries (or only the keys) is the other one: the score would depend on
# `i` alone (or `j` alone), not on the offset `i - j`.
# <!-- END SOLUTION -->

# %% [markdown]
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/06_positions_inside_attention.ipynb`, then go on to chapter 07.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 07.
# <!-- END SOLUTION -->
