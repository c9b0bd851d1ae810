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
# # Exercises · Chapter 04 · Masks and cross-attention
#
# Four exercises: combine two masks, make attention safe for queries that may attend to
# nothing, use the multi-head module for cross-attention over a padded source, and build the mask
# of a left-padded batch so that no query is left with nothing to look at.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=04`, or `.venv/bin/python -m mha_course start 04`; see the README), so that
# updates to the course never overwrite your work.

# %%
import math

import torch

import mha_lib
from mha_lib import causal_mask, padding_mask
from mha_lib.checks import (
    check_causal_padding_mask,
    check_cross_attention,
    check_left_padded_causal_mask,
    check_masked_attention,
)

# %% [markdown]
# ## Exercise 4.1 · Causal and padding at once
#
# A decoder sees a batch of padded sequences: each query may attend only to earlier tokens
# (causal) that are not padding. Write `causal_padding_mask(lengths, seq_len)` returning a boolean
# mask `(B, 1, seq_len, seq_len)`: `mask[b, 0, i, j]` is True when `j <= i` and `j < lengths[b]`. The
# batch may be padded beyond its longest sequence (`seq_len > max(lengths)`). You may use
# `mha_lib.causal_mask` and `mha_lib.padding_mask`.
#
# <details><summary>Hint</summary>
#
# `causal_mask(seq_len)` is `(seq_len, seq_len)`, `padding_mask(lengths, max_len=seq_len)` is
# `(B, 1, 1, seq_len)`; `&` broadcasts them.
# </details>

# %%
def causal_padding_mask(lengths, seq_len):
    raise NotImplementedError  # your code here


# %%
check_causal_padding_mask(causal_padding_mask)

# %% [markdown]
# ## Exercise 4.2 · Attention that survives a fully masked row
#
# Some queries may have no key to attend to: the leading padding queries of a *left*-padded batch
# under a causal mask (chapter 04, section 4), or any query under a restrictive per-head mask. A
# softmax over a row of `-inf` is `0/0 = NaN`, and the NaN spreads.
#
# Write `masked_attention(query, key, value, mask=None)` returning `(output, weights)` like
# chapter 01's attention, except that a query whose keys are **all** blocked gets all-zero
# weights and an all-zero output (not NaN, and not a uniform average of blocked keys).
#
# <details><summary>Hint 1</summary>
#
# `torch.isneginf(scores).all(dim=-1, keepdim=True)` finds the rows with nothing allowed.
# </details>
# <details><summary>Hint 2</summary>
#
# Give those rows any finite scores before the softmax (so it makes no NaN), then set their
# weights to zero with `masked_fill`.
# </details>

# %%
def masked_attention(query, key, value, mask=None):
    raise NotImplementedError  # your code here


# %%
check_masked_attention(masked_attention)

# %% [markdown]
# ## Exercise 4.3 · Cross-attention over a padded source
#
# In translation, the words being generated (the *target*) attend to the words of the *source*
# sentence. Write `cross_attend(mha, target, source, source_lengths)` that uses a
# `mha_lib.MultiHeadAttention` module `mha` for cross-attention:
#
# - `target`: `(B, Lt, d_model)`, `source`: `(B, Ls, d_model)` padded (perhaps beyond its longest
#   sentence), `source_lengths`: the true length of each source sentence;
# - return the output `(B, Lt, d_model)`; no target word may attend to the source's padding;
# - make every tensor you create (the mask) on the inputs' device, e.g. `.to(source.device)`: the
#   check also runs your function on another device (a stand-in for a GPU).
#
# <details><summary>Hint</summary>
#
# Queries come from the target; keys and values from the source. `padding_mask(source_lengths,
# max_len=source.size(1))` has the shape the module broadcasts.
# </details>

# %%
def cross_attend(mha, target, source, source_lengths):
    raise NotImplementedError  # your code here


# %%
check_cross_attention(cross_attend)

# %% [markdown]
# ## Exercise 4.4 · A left-padded batch without empty rows
#
# To generate text for a batch, sentences are padded at the **start** (chapter 04, section 4),
# and then `causal_mask(L) & left_padding` leaves every leading `<pad>` query with nothing to look
# at. Exercise 4.2 made attention survive such rows; here you decide what those rows should hold,
# so that even textbook attention (`masked_fill(-inf)`, softmax) never meets one.
#
# Write `left_padded_causal_mask(lengths, seq_len)` returning a boolean mask `(B, 1, seq_len,
# seq_len)` for a batch whose sequence `b` has its `lengths[b]` real tokens at the **end**:
#
# - a real query `i` of sequence `b` may attend to key `j` exactly when `j <= i` and `j` is a real
#   token (`j >= seq_len - lengths[b]`);
# - every padding query must be allowed **at least one** key. Which ones is your decision (their
#   outputs are thrown away); it must not change any real query's row;
# - `lengths` is a list of ints or a 1-D tensor; a sequence may be empty (length 0), and
#   `seq_len` may exceed the longest length. Make the mask on `lengths`' device when it is a
#   tensor (the CPU for a list): the check also runs it with `lengths` on another device.
#
# Then, in the cell after the check, **measure** what your choice changes: run textbook
# attention with the chapter's mask and with yours on the same random inputs, count the NaN,
# and compare the real queries' outputs with `mha_lib.scaled_dot_product_attention`'s.
#
# <details><summary>Hint 1</summary>
#
# `pos = torch.arange(seq_len)`: the real keys are `pos >= seq_len - lengths[:, None]` `(B, L)`.
# </details>
# <details><summary>Hint 2</summary>
#
# Every query may attend to itself without harm: a real query already may, and a padding
# query's output is thrown away. `| torch.eye(seq_len, dtype=torch.bool)` does it.
# </details>

# %%
def left_padded_causal_mask(lengths, seq_len):
    raise NotImplementedError  # your code here


# %%
check_left_padded_causal_mask(left_padded_causal_mask)

# %%
# your code here

# %% [markdown]
# *Your answer here (double-click this cell to edit it).*
#
# ## Done?
#
# Compare with `solutions/04_masks_and_cross_attention.ipynb`, then go on to chapter 05.
