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
# # Exercises · Chapter 08 · Heads that compose
#
# Three exercises, one per tool of chapter 08, and then a question to answer with them:
#
# 1. the task: a batch of random tokens in which a segment appears twice;
# 2. the two scores that say what a head does: previous-token and induction;
# 3. ablation: the loss of the model with each head silenced in turn.
#
# Then you load chapter 08's trained two-layer model, measure every head with your three tools,
# and say which heads do the work.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=08`, or `.venv/bin/python -m mha_course start 08`; see the README), so that
# updates to the course never overwrite your work.

# %%
import math

import torch

from mha_lib import get_device, seed_everything
from mha_lib.checks import (
    check_ablation_losses,
    check_induction_score,
    check_previous_token_score,
    check_repeated_segment_batch,
)
from mha_lib.induction import (
    losses,
    repeated_segments,
    silence_heads,
    uniform_induction_score,
    uniform_previous_token_score,
)
from mha_lib.induction.study import load_trained

device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## Exercise 8.1 · The repeated-segment batch
#
# Write `repeated_segment_batch(batch_size, seq_len, vocab_size, segment, generator)` returning
# `(tokens, predictable)`:
#
# - `tokens`, `(B, L)`, `torch.long`: uniform random ids `0 ... vocab_size - 1`. In each row, a
#   segment of `n` tokens starting at `first` appears again at `second`: `n` is drawn per row
#   between `segment[0]` and `segment[1]` (both included), and the second copy starts after the
#   first has ended (`second >= first + n`, `second + n <= L`). Draw `first` and `second` per
#   row, so that the offset `second - first` varies from row to row.
# - `predictable`, `(B, L)`, `torch.bool`: True at the second copy's tokens except its first,
#   `second + 1 ... second + n - 1`, and nowhere else: the tokens that the earlier copy tells.
#
# Draw every random number from `generator` (a CPU `torch.Generator`), so that the same seed
# gives the same batch. Don't call `mha_lib.induction.repeated_segments`.
#
# <details><summary>Hint 1</summary>
#
# `torch.randint(low, high, (), generator=generator)` draws one integer in `[low, high)`: its
# upper end is excluded. A loop over the rows is fine here.
# </details>
# <details><summary>Hint 2</summary>
#
# Why not the copy's first token? It follows a random token: nothing before it says that a copy
# begins there.
# </details>

# %%
def repeated_segment_batch(batch_size, seq_len, vocab_size, segment, generator):
    raise NotImplementedError  # your code here


# %%
check_repeated_segment_batch(repeated_segment_batch)

# %% [markdown]
# ## Exercise 8.2 · Scoring heads
#
# A head's score is its mean attention weight on one chosen key per query. Both functions take
# one layer's weights `(B, H, L, L)` (rows are queries, columns keys, each row sums to 1, as
# `model(tokens, return_weights=True)` gives them) and return one score per head, `(H,)`, in
# the weights' dtype and differentiable (no `.item()`, no `torch.no_grad()`).
#
# 1. `previous_token_score(weights)`: the mean of `weights[b, h, t, t - 1]` over the queries
#    `t = 1 ... L - 1` (query 0 has no previous token) and over the batch.
# 2. `induction_score(weights, batch)`, with `batch` a `RepeatBatch` (fields `tokens`,
#    `predictable`, `first`, `second`, `length`, each `(B,)` but the first two): the mean of
#    `weights[b, h, second + i, first + i + 1]` over `i = 0 ... length - 2` and the batch, all
#    those queries pooled (their sum over their number). Query `second + i` holds the same token
#    as `first + i`; an induction head looks at the token that came *after* it, `first + i + 1`,
#    which is the next token to predict.
#
# Don't call the functions of `mha_lib.induction` of the same names.
#
# <details><summary>Hint 1</summary>
#
# `weights.diagonal(offset=..., dim1=-2, dim2=-1)` picks one diagonal of the last two axes (offset 0
# is `t -> t`). Which offset holds `t -> t - 1`, and how many entries does it have?
# </details>
# <details><summary>Hint 2</summary>
#
# For the induction score, build two `(B, L)` tensors from `torch.arange(L)` and the batch's
# `first`, `second`, `length`: which positions are scored, and each one's key. Then
# `weights.gather(-1, keys[:, None, :, None].expand(B, H, L, 1))` picks the weight on each
# query's key.
# </details>

# %%
def previous_token_score(weights):
    raise NotImplementedError  # your code here


# %%
check_previous_token_score(previous_token_score)

# %%
def induction_score(weights, batch):
    raise NotImplementedError  # your code here


# %%
check_induction_score(induction_score)

# %% [markdown]
# ## Exercise 8.3 · Which heads does the model need?
#
# Write `ablation_losses(model, batch)` for an `AttentionOnlyTransformer` and a `RepeatBatch`: a
# tensor `(num_layers, H)` whose entry `[l, h]` is the mean cross-entropy on the **predictable**
# tokens with head `h` of layer `l` silenced. Silence a head with
# `with silence_heads(model.layers[l], [h]):` and compute the logits inside that block;
# `losses(logits, batch)` returns `(all, predictable, other)`. Return the losses themselves (not
# their difference from the intact model's loss), and leave the model as you found it.
#
# <details><summary>Hint</summary>
#
# `model(batch.tokens)` gives logits `(B, L, V)` in which position `t` predicts token `t + 1`;
# `losses` lines them up. Under `torch.no_grad()` nothing is kept for a backward pass.
# </details>

# %%
def ablation_losses(model, batch):
    raise NotImplementedError  # your code here


# %%
check_ablation_losses(ablation_losses)

# %% [markdown]
# ## Which heads does a trained model use?
#
# Now use your three tools on a trained model: chapter 08's two-layer model (4 heads per layer,
# `d_model` 64, learned positions, sequences of 24 tokens with a repeated segment of 4 to 8),
# the run of seed 0 of its seed study. It was trained once and ships with the course
# (`mha_lib/induction/model_seed0.pt`, written by `python -m mha_lib.induction model`), so it is
# the same model on every machine and this notebook needs no training time.

# %%
model = load_trained(device=device)  # an AttentionOnlyTransformer, in evaluation mode
VOCAB_SIZE = model.vocab_size  # 64
print(model)

# %% [markdown]
# On a fresh batch of 256 sequences (`repeated_segments(256, 24, 64, (4, 8),
# generator=torch.Generator().manual_seed(1))`, moved to `device`), compute:
#
# - the intact model's loss on the predictable tokens (a uniform guess scores ln 64 ≈ 4.16, a
#   perfect copier 0), and the weights of both layers (`model(tokens, return_weights=True)`);
# - every head's previous-token and induction score, with your functions, next to the uniform
#   baselines (`uniform_previous_token_score(24)`, `uniform_induction_score(batch)`);
# - your ablation table.
#
# Print them rounded, one line per layer. (A head that matters but fits neither score? The
# library's `duplicate_token_score(weights, batch)` measures how much each head looks, from the
# second copy, at the earlier occurrence of the current token itself.)

# %%
# NBVAL_IGNORE_OUTPUT
# (a model's losses and scores may differ in the last digit between machines)
# your code here

# %% [markdown]
# Which heads do the work? Say what each score and each ablation tells, compared with the uniform
# baselines and with the intact model's loss, and whether the scores and the ablation agree.
#
# *Your answer here (double-click this cell to edit it).*

# %% [markdown]
# ## Done?
#
# Compare with `solutions/08_heads_that_compose.ipynb`, then go on to chapter 09.
