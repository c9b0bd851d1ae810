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
# # Solutions · Chapter 02 · Self-attention with one head
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/02_self_attention_one_head.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# <!-- END SOLUTION -->
#
# Two exercises: self-attention with given projection matrices, then the same thing as a
# module with trainable projections.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=02`, or `.venv/bin/python -m mha_course start 02`; see the README), so that
# updates to the course never overwrite your work.
# -->

# %%
import math

import torch
from torch import nn

from mha_lib.checks import check_attention_head, check_self_attention

# %% [markdown]
# ## Exercise 2.1 · Self-attention with given projections
#
# Write `self_attention(x, W_q, W_k, W_v)` returning `(output, weights)`:
#
# - `x`: token embeddings `(B, L, d_model)`;
# - `W_q`, `W_k`: `(d_model, d_k)` and `W_v`: `(d_model, d_v)`, used as `x @ W_q` and so on;
# - each token's query is compared with every token's key (the sequence attends to itself);
# - `weights`: `(B, L, L)`; `output`: `(B, L, d_v)`.
#
# <details><summary>Hint 1</summary>
#
# Three matrix products give queries, keys and values; then it is chapter 01's attention.
# </details>
# <details><summary>Hint 2</summary>
#
# Scale by the size of the projected queries and keys, `d_k = W_q.shape[1]`, not by `d_model`.
# </details>

# %%
def self_attention(x, W_q, W_k, W_v):
    # BEGIN SOLUTION
    q, k, v = x @ W_q, x @ W_k, x @ W_v  # (B, L, d_k), (B, L, d_k), (B, L, d_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, L, L)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights
    # END SOLUTION


# %%
check_self_attention(self_attention)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The dot products are taken between projected vectors of size `d_k`, so
# their variance grows with `d_k`, whatever `d_model` is: that is the size to scale by.
# <!-- END SOLUTION -->
#
# ## Exercise 2.2 · One attention head as a module
#
# Write the class `AttentionHead(d_model, d_k, d_v)`:
#
# - in `__init__`, three trainable projections: `self.W_q = nn.Linear(d_model, d_k)`,
#   `self.W_k = nn.Linear(d_model, d_k)`, `self.W_v = nn.Linear(d_model, d_v)`;
# - `forward(query, key, value, mask=None)`: project `query` with `W_q`, `key` with `W_k` and
#   `value` with `W_v`, then scaled dot-product attention; return the output `(B, Lq, d_v)`
#   (returning `(output, weights)` is fine too, as the solution does).
# - For self-attention you will call `head(x, x, x)`; taking three inputs also lets the same head
#   do cross-attention later (chapter 04).
# - `mask` (optional) is boolean, broadcastable to `(B, Lq, Lk)`, True = may attend.
#
# <details><summary>Hint 1</summary>
#
# Don't forget `super().__init__()` as the first line of `__init__`.
# </details>
# <details><summary>Hint 2</summary>
#
# `scores.masked_fill(~mask, float("-inf"))` blocks where the mask is False.
# </details>

# %%
class AttentionHead(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        # BEGIN SOLUTION
        self.W_q = nn.Linear(d_model, d_k)
        self.W_k = nn.Linear(d_model, d_k)
        self.W_v = nn.Linear(d_model, d_v)
        # END SOLUTION

    def forward(self, query, key, value, mask=None):
        # BEGIN SOLUTION
        q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)  # (B, Lq, d_k), (B, Lk, d_k), (B, Lk, d_v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, Lq, Lk)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return weights @ v, weights
        # END SOLUTION


# %%
check_attention_head(AttentionHead)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The check copies its own weights into your `W_q`, `W_k` and `W_v`, which is
# why their names and sizes matter. `mha_lib.AttentionHead` is the course's version of this
# class, with input checks and docstrings.
# <!-- END SOLUTION -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/02_self_attention_one_head.ipynb`, then go on to chapter 03.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 03.
# <!-- END SOLUTION -->
