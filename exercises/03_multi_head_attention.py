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
# # Exercises · Chapter 03 · Multi-head attention
#
# Five exercises, from counting parameters to the whole module, and a probe that shows what a
# wrong split does to the positions.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=03`, or `.venv/bin/python -m mha_course start 03`; see the README), so that
# updates to the course never overwrite your work.

# %%
import math

import torch
from torch import nn

import mha_lib

from mha_lib.checks import (
    check_combine_heads,
    check_multi_head_attention,
    check_parameter_count,
    check_positions_read,
    check_split_heads,
)

# %% [markdown]
# ## Exercise 3.1 · How many parameters? (warm-up)
#
# Write `mha_parameter_count(d_model, num_heads, bias=True)` returning the number (an `int`) of
# trainable numbers in a multi-head attention module with four projections `W_q, W_k, W_v, W_o`, each
# `nn.Linear(d_model, d_model, bias=bias)`. Work it out with arithmetic, not by building a module.
#
# <details><summary>Hint</summary>
#
# An `nn.Linear(n, m)` has an `(m, n)` weight and, with a bias, `m` more numbers. Does the number
# of heads appear anywhere?
# </details>

# %%
def mha_parameter_count(d_model, num_heads, bias=True):
    raise NotImplementedError  # your code here


# %%
check_parameter_count(mha_parameter_count)

# %% [markdown]
# ## Exercise 3.2 · Split into heads
#
# Write `split_heads(x, num_heads)`: `(B, L, D) -> (B, H, L, D // H)`, where head `h` receives
# the features `[h * d_k, (h + 1) * d_k)` of every position.
#
# <details><summary>Hint 1</summary>
#
# First cut the last axis into `(H, d_k)` with `.view(B, L, H, d_k)`; then swap the sequence and
# head axes.
# </details>
# <details><summary>Hint 2</summary>
#
# `.transpose(1, 2)` swaps axes 1 and 2. A single `.reshape(B, H, L, d_k)` has the right shape but
# puts the wrong numbers in each head.
# </details>

# %%
def split_heads(x, num_heads):
    raise NotImplementedError  # your code here


# %%
check_split_heads(split_heads)

# %% [markdown]
# ## Exercise 3.3 · Combine the heads
#
# Write `combine_heads(x)`: `(B, H, L, d_k) -> (B, L, H * d_k)`, the inverse of `split_heads`:
# the heads of each position are put side by side again.
#
# <details><summary>Hint</summary>
#
# Undo the steps in reverse order. After `.transpose`, the tensor is no longer contiguous in
# memory, and `.view` refuses it: use `.reshape`, or `.contiguous().view(...)`.
# </details>

# %%
def combine_heads(x):
    raise NotImplementedError  # your code here


# %%
check_combine_heads(combine_heads)

# %% [markdown]
# ## Exercise 3.4 · The multi-head attention module
#
# Write the class `MultiHeadAttention(d_model, num_heads)`:
#
# - `__init__`: `self.W_q`, `self.W_k`, `self.W_v`, `self.W_o`, each `nn.Linear(d_model, d_model)`;
#   raise a `ValueError` when `d_model` is not divisible by `num_heads`;
# - `forward(query, key, value, mask=None)` with `query (B, Lq, d_model)`, `key` and
#   `value (B, Lk, d_model)`, and an optional boolean mask (True = may attend) broadcastable to
#   `(B, H, Lq, Lk)`:
#   1. project: `W_q(query)`, `W_k(key)`, `W_v(value)`;
#   2. split each into heads with your `split_heads`;
#   3. scaled dot-product attention in every head at once;
#   4. combine the heads with your `combine_heads`;
#   5. mix them with `W_o`; return the output `(B, Lq, d_model)`. You may return the pair
#      `(output, weights)` instead, with the weights of every head, `(B, H, Lq, Lk)`, those the
#      values were blended with: the check accepts both, and checks the weights when you return them.
#
# *Transformers in Action*'s listing 2.4 has the same structure, and one bug: it splits the
# values with `self.d_v`, which it never defines. Don't copy that.
#
# <details><summary>Hint 1</summary>
#
# Each head's vectors have `d_k = d_model // num_heads` features: that is the size to scale by.
# </details>
# <details><summary>Hint 2</summary>
#
# The mask broadcasts: `scores.masked_fill(~mask, float("-inf"))` works for scores
# `(B, H, Lq, Lk)` and masks `(Lq, Lk)` or `(B, 1, 1, Lk)` alike.
# </details>

# %%
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        raise NotImplementedError  # your code here

    def forward(self, query, key, value, mask=None):
        raise NotImplementedError  # your code here


# %%
check_multi_head_attention(MultiHeadAttention)

# %% [markdown]
# ## Exercise 3.5 · Which positions does a head read?
#
# A split with the right shape can still put the wrong numbers in each head (exercise 3.2's
# hint). How wrong? Measure it: write `positions_read(split, seq_len, d_model, num_heads)` that
# runs any split function `split(x, num_heads)` (`(B, L, d_model) -> (B, H, L, d_k)`) on a probe
# of your own and returns a boolean tensor `reads` of shape `(num_heads, seq_len, seq_len)`:
# `reads[h, i, j]` is True when the features that head `h` gets at position `i` include a
# feature of input position `j`.
#
# - Make the probe yourself, one sequence `(1, seq_len, d_model)`, so that every entry tells the
#   position it came from. Return a `torch.bool` tensor on the CPU; the check runs on the CPU.
# - The check hands over six splits, some right and some wrong, on three sizes: your function
#   must read what each one does, not assume it.
#
# Then, in the cell after the check, **measure** two splits with `seq_len=6, d_model=8,
# num_heads=2`: `mha_lib.split_heads`, and a plain `x.reshape(B, H, L, d_k)`. Which positions do
# head 0 and head 1 see with the reshape, and what would attention in those heads then compute?
#
# <details><summary>Hint 1</summary>
#
# A probe whose entries at position `j` all equal `j`:
# `torch.arange(seq_len, dtype=torch.float64)[None, :, None].expand(1, seq_len, d_model)`.
# </details>
# <details><summary>Hint 2</summary>
#
# With `out = split(x, num_heads)[0]` `(H, L, d_k)`, `out[..., None] == torch.arange(seq_len)` is
# `(H, L, d_k, L)`; `.any(dim=-2)` asks "any of the d_k features?".
# </details>

# %%
def positions_read(split, seq_len, d_model, num_heads):
    raise NotImplementedError  # your code here


# %%
check_positions_read(positions_read)

# %%
# your code here

# %% [markdown]
# *Your answer here (double-click this cell to edit it).*
#
# ## Done?
#
# Compare with `solutions/03_multi_head_attention.ipynb`, then go on to chapter 04.
