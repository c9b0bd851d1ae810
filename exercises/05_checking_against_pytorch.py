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
# # Exercises · Chapter 05 · Checking against PyTorch
#
# Four exercises that take you from `mha_lib` to `torch.nn.MultiheadAttention`: convert the two
# kinds of masks to PyTorch's convention, copy a module's weights, then write the tests
# themselves: a tolerance per dtype and a gradient test, judged by what they let through.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=05`, or `.venv/bin/python -m mha_course start 05`; see the README), so that
# updates to the course never overwrite your work.

# %%
import torch
import torch.nn.functional as F
from torch import nn

import mha_lib
from mha_lib import causal_mask
from mha_lib.checks import (
    check_attn_mask_for_torch,
    check_copy_to_torch,
    check_key_padding_mask_for_torch,
    check_tolerances_and_gradients,
)

# %% [markdown]
# ## Exercise 5.1 · An attention mask for `nn.MultiheadAttention`
#
# `mha_lib` masks mean **True = may attend**. `nn.MultiheadAttention`'s `attn_mask` means the
# opposite: True = *blocked*. Write `to_torch_attn_mask(allowed)` that turns an `(L, L)` mask of
# ours into an `attn_mask` that makes `nn.MultiheadAttention` attend to exactly the same keys.
#
# <details><summary>Hint</summary>
#
# One character does it. (A float mask of `0` and `-inf` would work too.)
# </details>

# %%
def to_torch_attn_mask(allowed):
    raise NotImplementedError  # your code here


# %%
check_attn_mask_for_torch(to_torch_attn_mask)

# %% [markdown]
# ## Exercise 5.2 · A key padding mask
#
# `mha_lib.padding_mask` returns `(B, 1, 1, Lk)`, True for real tokens. `nn.MultiheadAttention`'s
# `key_padding_mask` is `(B, Lk)`, True for **padding**. Write `to_key_padding_mask(keep)`.
#
# <details><summary>Hint</summary>
#
# Drop the two axes of size 1, then invert.
# </details>

# %%
def to_key_padding_mask(keep):
    raise NotImplementedError  # your code here


# %%
check_key_padding_mask_for_torch(to_key_padding_mask)

# %% [markdown]
# ## Exercise 5.3 · Copy our weights into `nn.MultiheadAttention`
#
# Write `copy_to_torch(mha)` that takes a `mha_lib.MultiHeadAttention` and returns an
# `nn.MultiheadAttention` that computes the same function on `(B, L, d_model)` inputs.
#
# - PyTorch keeps the three input projections stacked in one `in_proj_weight` of shape
#   `(3 * d_model, d_model)` (queries, then keys, then values) and their biases in `in_proj_bias`;
#   the output projection is `out_proj`.
# - `mha.d_model` and `mha.num_heads` give the sizes. Leave `mha` itself unchanged.
# - Build the new module on `mha`'s device and with its dtype (`device=` and `dtype=`, read from
#   `mha.W_q.weight`): the check hands over a float64 module, and one on another device.
#
# <details><summary>Hint 1</summary>
#
# `nn.MultiheadAttention(d_model, num_heads, batch_first=True)`: without `batch_first` it expects
# `(L, B, d_model)`.
# </details>
# <details><summary>Hint 2</summary>
#
# Copy under `torch.no_grad()`: `theirs.in_proj_weight.copy_(torch.cat([...]))`. `nn.Linear`
# stores its weight as `(out_features, in_features)`, exactly the layout PyTorch expects: no `.T`.
# </details>

# %%
def copy_to_torch(mha):
    raise NotImplementedError  # your code here


# %%
check_copy_to_torch(copy_to_torch)

# %% [markdown]
# ## Exercise 5.4 · Tests that catch bugs and pass correct code
#
# Part 2 of the chapter measured rounding differences and showed a bug that a loose tolerance
# hides, and a gradcheck that stops at the first input. Now write the tests yourself; the check
# judges them by what they accept and reject.
#
# 1. `tolerance(dtype)` returns a pair `(rtol, atol)` for comparing an attention's output with
#    `F.scaled_dot_product_attention`'s in that dtype (`torch.float64`, `torch.float32` or
#    `torch.bfloat16`), entry by entry as `torch.allclose` does:
#    $|a - b| \le \texttt{atol} + \texttt{rtol}\,|b|$. Choose each from a **measurement**: run
#    `mha_lib.scaled_dot_product_attention` and `F.scaled_dot_product_attention` on inputs like
#    the check's (unit-variance `q`, `k`, `v` up to `(1, 2, 64, 32)`, values of another size `d_v`,
#    no mask, a causal or a padding mask), on the CPU, and look at the largest difference.
# 2. `gradients_right(attention)` returns `True` when the gradients of `attention(query, key,
#    value, mask=None) -> (output, weights)` are right, `False` otherwise (never raising), with
#    `torch.autograd.gradcheck`. Make its inputs yourself: tiny, float64, on the CPU.
#
# The check hands your tolerance correct attentions written in other ways (other rounding) and,
# for each dtype, the wrong ones that dtype can show: a computation done in a lower precision, a
# leaky mask (-10 in place of -inf), scores scaled by the values' size. It hands `gradients_right`
# three attentions with right gradients and four with a hand-written backward pass that is wrong
# for one input (query, key or value) or forgets the mask.
#
# <details><summary>Hint 1</summary>
#
# A tolerance a few times above the largest correct difference; correct differences sit near
# `torch.finfo(dtype).eps` times the outputs' size. One tolerance for every dtype can't work.
# </details>
# <details><summary>Hint 2</summary>
#
# `gradcheck` checks only the inputs it is given, each with `requires_grad=True`: pass all three,
# call the attention with a mask that blocks some keys, and `raise_exception=False`.
# </details>

# %%
def tolerance(dtype):
    raise NotImplementedError  # your code here


def gradients_right(attention):
    raise NotImplementedError  # your code here


# %%
check_tolerances_and_gradients(tolerance, gradients_right)

# %%
# your code here

# %% [markdown]
# *Your answer here (double-click this cell to edit it).*
#
# ## Done?
#
# Compare with `solutions/05_checking_against_pytorch.ipynb`, then go on to chapter 06.
