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
# # Solutions · Chapter 03 · Multi-head attention
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/03_multi_head_attention.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# <!-- END SOLUTION -->
#
# Five exercises, from counting parameters to the whole module, and a probe that shows what a
# wrong split does to the positions.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=03`, or `.venv/bin/python -m mha_course start 03`; see the README), so that
# updates to the course never overwrite your work.
# -->

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
    # BEGIN SOLUTION
    per_projection = d_model * d_model + (d_model if bias else 0)
    return 4 * per_projection
    # END SOLUTION


# %%
check_parameter_count(mha_parameter_count)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** `num_heads` doesn't appear: the heads share the same four matrices, each head
# using its own slice of `d_k = d_model / num_heads` features. More heads means more views of the
# same parameters, not more parameters.
# <!-- END SOLUTION -->
#
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
    # BEGIN SOLUTION
    B, L, D = x.shape
    return x.view(B, L, num_heads, D // num_heads).transpose(1, 2)  # (B, H, L, d_k)
    # END SOLUTION


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
    # BEGIN SOLUTION
    B, H, L, d_k = x.shape
    return x.transpose(1, 2).reshape(B, L, H * d_k)  # (B, L, D)
    # END SOLUTION


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
        # BEGIN SOLUTION
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        # END SOLUTION

    def forward(self, query, key, value, mask=None):
        # BEGIN SOLUTION
        q = split_heads(self.W_q(query), self.num_heads)  # (B, H, Lq, d_k)
        k = split_heads(self.W_k(key), self.num_heads)  # (B, H, Lk, d_k)
        v = split_heads(self.W_v(value), self.num_heads)  # (B, H, Lk, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, Lq, Lk)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return self.W_o(combine_heads(weights @ v)), weights  # (B, Lq, d_model)
        # END SOLUTION


# %%
check_multi_head_attention(MultiHeadAttention)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The check tries one to four heads, self- and cross-attention, causal and
# padding masks. The common slips it recognises: scaling by `√d_model` (each head's dot products
# have only `d_k` terms), forgetting `W_o` (the heads are then never mixed), and splitting with a
# plain reshape.
# <!-- END SOLUTION -->
#
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
    # BEGIN SOLUTION
    x = torch.arange(seq_len, dtype=torch.float64)[None, :, None].expand(1, seq_len, d_model)  # x[0, j, :] = j
    out = split(x, num_heads)[0]  # (H, L, d_k): the position each feature came from
    return (out[..., None] == torch.arange(seq_len, dtype=torch.float64)).any(dim=-2)  # (H, L, L)
    # END SOLUTION


# %%
check_positions_read(positions_read)

# %%
# BEGIN SOLUTION
def split_by_reshape(x, num_heads):
    B, L, D = x.shape
    return x.reshape(B, num_heads, L, D // num_heads)  # the right shape, no transpose


for name, split in [("mha_lib.split_heads", mha_lib.split_heads), ("a plain reshape", split_by_reshape)]:
    reads = positions_read(split, seq_len=6, d_model=8, num_heads=2)  # (H, L, L)
    print(name)
    for h in range(2):
        seen = [reads[h, i].nonzero().flatten().tolist() for i in range(6)]
        print(f"  head {h}, positions 0-5 read input positions {seen}")
assert positions_read(split_by_reshape, 6, 8, 2)[0].any(dim=0).tolist() == [True] * 3 + [False] * 3
# END SOLUTION

# %% [markdown]
# <!-- BEGIN ANSWER -->
# **Discussion.** With `mha_lib.split_heads`, every head at position `i` reads position `i`, and
# only it. With the plain reshape, head 0 reads only the first half of the sequence (input
# positions 0, 0, 1, 1, 2, 2) and head 1 only the second half: each head's "position" `i` holds a
# piece of input position `i // 2` (or `3 + i // 2`). Attention in head 0 would then compare
# pieces of tokens 0 to 2 with each other, twice each, and never see tokens 3 to 5; a mask built
# for the real positions would block the wrong pieces. The shapes are right and no error is
# raised: only a measurement like this one, or a comparison with a reference, finds it.
# <!-- END ANSWER -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/03_multi_head_attention.ipynb`, then go on to chapter 04.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 04.
# <!-- END SOLUTION -->
