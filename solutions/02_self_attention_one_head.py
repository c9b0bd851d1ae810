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
# Three exercises: self-attention with given projection matrices, the same thing as a module
# with trainable projections, then how sharp a hand-set head must be for a longer sentence.
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

from mha_lib.checks import check_attention_head, check_self_attention, check_sharpness_needed

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
# ## Exercise 2.3 · How sharp must a head be?
#
# In section 6 of the chapter, the hand-set head gives "bad" a score of 6 on "not" and 0 on
# the other words, and a gap of 6 puts 99% of the weight on "not" in a sentence of 5 words. In
# a longer sentence there are more keys at 0 to share the weight with, and the same gap gives
# less.
#
# Write `sharpness_needed(seq_len, weight)` that returns the gap $s$ for which one key, scored
# $s$ above the `seq_len - 1` other keys (whose scores are equal), receives exactly `weight` of
# the softmax.
#
# - Return one number, a Python `float` (a 0-d tensor is accepted), within `1e-6` of the exact
#   gap; it may be negative (a weight below `1 / seq_len` needs a key scored *below* the others).
# - Raise a `ValueError` that names the argument when no gap can do it: `weight` not strictly
#   between 0 and 1, or `seq_len` below 2.
# - The check calls it on sentences of 2 to 1000 keys and weights from 0.1 to 0.999, then with
#   the impossible requests.
#
# Then, in the cell after the check, **decide**: with the chapter's gap of 6, what is the longest
# sentence in which "bad" still gives "not" at least 0.9 of its weight? Confirm it with
# `torch.softmax`.
#
# <details><summary>Hint 1</summary>
#
# The key's weight is $w = e^s / (e^s + (L-1)\,e^0)$. Solve for $e^s$ first.
# </details>
# <details><summary>Hint 2</summary>
#
# $e^s = w\,(L-1)/(1-w)$; `math.log` is the natural logarithm.
# </details>

# %%
def sharpness_needed(seq_len, weight):
    # BEGIN SOLUTION
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len}: a query over fewer than 2 keys gives its key weight 1 whatever the gap")
    if not 0 < weight < 1:
        raise ValueError(f"weight={weight} must lie strictly between 0 and 1: no finite gap gives 0 or 1")
    return math.log(weight * (seq_len - 1) / (1 - weight))
    # END SOLUTION


# %%
check_sharpness_needed(sharpness_needed)

# %%
# BEGIN SOLUTION
for L in (5, 50, 500):
    print(f"{L:4d} keys: a gap of {sharpness_needed(L, 0.9):4.2f} for 0.9 of the weight, "
          f"{sharpness_needed(L, 0.99):4.2f} for 0.99")

# The longest sentence for a gap of 6: w(L) = e^6 / (e^6 + L - 1) >= 0.9  <=>  L - 1 <= e^6 / 9.
longest = 1 + math.floor(math.exp(6) * (1 - 0.9) / 0.9)
for L in (longest, longest + 1):
    scores = torch.tensor([6.0] + [0.0] * (L - 1))  # "not" scored 6, the other L - 1 words 0
    print(f"gap 6, {L} words: weight on 'not' {torch.softmax(scores, dim=0)[0]:.4f}")
assert sharpness_needed(longest, 0.9) <= 6 < sharpness_needed(longest + 1, 0.9)
# END SOLUTION

# %% [markdown]
# <!-- BEGIN ANSWER -->
# **Discussion.** The gap needed grows with the *logarithm* of the length: $s = \log\frac{w}{1-w}
# + \log(L-1)$. Ten times more keys cost only $\log 10 \approx 2.3$ more, but that is on top of a
# gap that a head must produce as a dot product of its query and key. With a gap of 6, "bad"
# keeps at least 0.9 of its weight on "not" in sentences of up to 45 words, and loses it in a
# 46th. The other words were all scored 0 here; in a real sentence some score higher, and the
# weight is shared further. A head that must pick one token out of many needs a larger gap, that
# is larger or better aligned queries and keys.
# <!-- END ANSWER -->
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
