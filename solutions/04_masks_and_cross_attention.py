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
# # Solutions · Chapter 04 · Masks and cross-attention
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/04_masks_and_cross_attention.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# <!-- END SOLUTION -->
#
# Four exercises: combine two masks, make attention safe for queries that may attend to
# nothing, use the multi-head module for cross-attention over a padded source, and build the mask
# of a left-padded batch so that no query is left with nothing to look at.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=04`, or `.venv/bin/python -m mha_course start 04`; see the README), so that
# updates to the course never overwrite your work.
# -->

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
    # BEGIN SOLUTION
    return causal_mask(seq_len) & padding_mask(lengths, max_len=seq_len)  # (B, 1, L, L)
    # END SOLUTION


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
    # BEGIN SOLUTION
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., Lq, 1)
    weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return weights @ value, weights
    # END SOLUTION


# %%
check_masked_attention(masked_attention)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** Replacing the NaN weights afterwards (`torch.nan_to_num`) also passes here, and
# even its gradients are finite, but only because `masked_fill` passes no gradient to the scores
# it overwrote. With an additive mask (`scores + mask`, the mask holding `-inf`), the backward
# pass goes through the 0/0 and the gradients are NaN: the check tries a backward pass and would
# say so. Keeping the softmax finite avoids the NaN in both directions, whatever the kind of mask,
# which is what `mha_lib.scaled_dot_product_attention` does.
# <!-- END SOLUTION -->
#
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
    # BEGIN SOLUTION
    keep = padding_mask(source_lengths, max_len=source.size(1)).to(source.device)  # (B, 1, 1, Ls)
    return mha(target, source, source, mask=keep)  # (B, Lt, d_model)
    # END SOLUTION


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
    # BEGIN SOLUTION
    lengths = torch.as_tensor(lengths)  # a tensor stays on its device
    pos = torch.arange(seq_len, device=lengths.device)
    real = pos[None, :] >= seq_len - lengths[:, None]  # (B, L): the last lengths[b] tokens
    causal = pos[None, :] <= pos[:, None]  # (L, L): key j <= query i
    itself = pos[None, :] == pos[:, None]  # (L, L): every query may see itself
    return ((causal & real[:, None, :]) | itself)[:, None]  # (B, 1, L, L)
    # END SOLUTION


# %%
check_left_padded_causal_mask(left_padded_causal_mask)

# %%
# BEGIN SOLUTION
def textbook_attention(q, k, v, mask):
    """masked_fill(-inf) and softmax, nothing else: NaN where a row is fully masked."""
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


lengths, L = [2, 5, 3], 5
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(3, 2, L, 4, generator=g) for _ in range(3))  # (B, H, L, d_k)
chapter = causal_mask(L) & padding_mask(lengths).flip(-1)  # section 4's mask, (B, 1, L, L)
ours = left_padded_causal_mask(lengths, L)
real = padding_mask(lengths).flip(-1)[:, 0, 0]  # (B, L): the real queries
reference, _ = mha_lib.scaled_dot_product_attention(q, k, v, chapter)  # zeros on the empty rows
nan_rows = {}
for name, mask in [("the chapter's mask", chapter), ("left_padded_causal_mask", ours)]:
    out = textbook_attention(q, k, v, mask)  # (B, H, L, d_k)
    same = torch.allclose(out.transpose(1, 2)[real], reference.transpose(1, 2)[real], atol=1e-6)
    nan_rows[name] = out.isnan().any(-1).sum().item()
    print(f"{name:24s} NaN in {nan_rows[name]:2d} (head, query) rows; real queries as mha_lib's: {same}")
    assert same
assert list(nan_rows.values()) == [10, 0]  # what the discussion below says
# END SOLUTION

# %% [markdown]
# <!-- BEGIN ANSWER -->
# **Discussion.** With the chapter's mask, textbook attention puts NaN in every row of a leading
# padding query, 10 rows here (5 padding queries, 2 heads); with the new mask there is none, and
# the real queries' outputs are those of `mha_lib.scaled_dot_product_attention` with the
# chapter's mask. The choice "a padding query sees itself" costs nothing: a real query's row
# already holds its own key, and no real query ever sees a padding key, so what the padding
# positions compute never reaches a real token, in this layer or the next. Letting padding
# queries see every key would pass as well; seeing nothing is the one choice that breaks
# textbook attention. Fixing the mask and fixing attention (exercise 4.2) are two answers to the
# same problem: the mask fixes it for every attention function it is handed to, the guard for
# every mask.
# <!-- END ANSWER -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/04_masks_and_cross_attention.ipynb`, then go on to chapter 05.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 05.
# <!-- END SOLUTION -->
