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
# and say which heads do the work. Two more exercises then look inside the heads, at their
# weights:
#
# 4. what a layer-1 head writes, split into a part that comes from the tokens, one that comes
#    from the positions and one from a bias;
# 5. whether a head *copies*: what its weights do to the logit of the token it attends to.
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
    check_copying_score,
    check_head_parts,
    check_induction_score,
    check_ov_circuit,
    check_previous_token_score,
    check_repeated_segment_batch,
)
from mha_lib.induction import (
    AttentionOnlyTransformer,
    induction_queries,
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
# the weights' dtype, on their device, and differentiable (no `.item()`, no `torch.no_grad()`).
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
# their difference from the intact model's loss), in the model's dtype, and leave the model as you
# found it (its mode, weights, `requires_grad`, no hook left behind).
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
# ## Exercise 8.4 · What a layer-1 head writes: token, position and bias
#
# Your ablation table named one head of layer 1 that the induction heads need. What does it pass
# them? Layer 1 reads the embeddings, `x_j = E[t_j] + P_j`: the embedding of token `t_j`
# (`model.token_embedding`) plus the learned embedding of position `j` (row `j` of
# `model.position_embedding`, a `(max_len, D)` table). A head is linear in its values, so head
# `h`'s output at query `i`, the term it adds to the residual stream
# (`model.head_outputs(tokens)[0][:, h]`, `(B, L, D)`), splits into three parts that add up to it
# exactly:
#
# $$\underbrace{\sum_j A_{ij}\, E[t_j]\, W_v^{h\top} W_o^{h\top}}_{\text{token}}
# \;+\; \underbrace{\sum_j A_{ij}\, P_j\, W_v^{h\top} W_o^{h\top}}_{\text{position}}
# \;+\; \underbrace{b_v^h\, W_o^{h\top}}_{\text{bias}}$$
#
# The bias part needs no sum: the weights of a row add up to 1. Here `A = weights[0][:, h]`,
# `(B, L, L)`, are the head's attention weights in layer 1 (`model(tokens, return_weights=True)`
# returns one weights tensor per layer), and, with `rows = slice(h * d_k, (h + 1) * d_k)`,
# `W_v^h = model.layers[0].W_v.weight[rows]` `(d_k, D)`, `b_v^h = model.layers[0].W_v.bias[rows]`
# `(d_k,)` and `W_o^h = model.layers[0].W_o.weight[:, rows]` `(D, d_k)`: an `nn.Linear` stores its
# weight as `(out, in)` and computes `x @ weight.T + bias`. `W_o`'s own bias is added once to the
# layer's output, after the heads are summed: it belongs to no head, so to none of the parts.
#
# Write `head_parts(model, tokens, head)` returning `(token, position, bias)`, each `(B, L, D)`;
# the bias part is the same vector at every query of every sequence (expand it).
#
# - **Mode and state.** The check hands over models in training mode (some with attention
#   dropout switched on), with gradients on and a hook of their own. Compute the attention
#   weights in evaluation mode, and leave the model as you found it: its mode (whichever it
#   was), `requires_grad`, hooks, parameters and gradients.
# - **dtype and device.** Return the model's dtype (the check uses float32 and float64 models),
#   on the model's device: create any tensor you need on `tokens.device` (the check runs your
#   function once more on another device).
#
# Don't call `mha_lib.induction.circuits.head_parts`.
#
# <details><summary>Hint 1</summary>
#
# `A @ values`, with `A` `(B, L, L)` and `values` `(B, L, D)`, is the weighted sum over the keys
# for every query at once; values `(L, D)`, the same for every sequence, broadcast.
# </details>
# <details><summary>Hint 2</summary>
#
# `was_training = model.training; model.eval()` before the forward pass, and
# `model.train(was_training)` in a `finally:` block after it.
# </details>

# %%
def head_parts(model, tokens, head):
    raise NotImplementedError  # your code here


# %%
check_head_parts(head_parts)

# %% [markdown]
# Now measure what the four heads of layer 1 write, on the batch above: for each head and each
# part, the mean length (`.norm(dim=-1)`) of the part over the queries of the second copy whose
# next token the first copy tells (`induction_queries(batch)[0]`, `(B, L)`, True there), and over
# all other queries. Print one line per head.

# %%
# NBVAL_IGNORE_OUTPUT
# (the lengths may differ in the last digit between machines)
# your code here

# %% [markdown]
# Which part dominates what the head that your ablation found necessary writes, at the second
# copy and elsewhere? And does the largest part have to be the one that the next layer uses?
#
# *Your answer here (double-click this cell to edit it).*
#
# ## Exercise 8.5 · Does a head copy?
#
# An induction head attends to the token *after* the earlier occurrence of the current one. To
# predict it, it must also **copy** it: raise that token's logit. Where a head looks is in its
# attention weights; what it does with what it finds is in its weights alone (Elhage et al.,
# 2021). When head `h` of a layer attends fully to a token `b`, its value path carries `E[b]` to
# the logits as `W_U W_o^h W_v^h E[b]`. For all tokens at once this is the head's **OV circuit**,
# read through the unembedding:
#
# $$C = W_U\, W_o^h\, W_v^h\, E^\top \quad (V \times V), \qquad C[a, b] = \text{what attending to
# token } b \text{ adds to logit } a,$$
#
# with `W_U = model.unembed.weight` `(V, D)`, `E = model.token_embedding.weight` `(V, D)`, and head
# `h`'s rows of `W_v` and columns of `W_o` in `model.layers[layer]`, as in 8.4. It leaves out the
# biases (they add the same whatever the token), the positions, and, for a layer-2 head, what
# layer 1 adds to the stream: it is the direct path from a token to the logits through one head.
#
# 1. `ov_circuit(model, layer, head)`: `C`, `(V, V)`, entry `[a, b]` as above (`layer` counts
#    from 0: `model.layers[layer]`).
# 2. `copying_score(model, layer, head)`: the share of tokens `b` whose own logit is the one the
#    head raises most when it attends to `b` (`C[b, b]` is the largest entry of column `b`), as a
#    Python float.
#
# **The baseline, stated before any measurement.** In a head whose weights have nothing to do
# with copying, the largest entry of a column lands on the diagonal with chance `1 / V`: a score
# of about `1 / 64 ≈ 0.016`. The number of such columns is then about Poisson with mean 1, so at
# most 4 of 64 (0.0625) for 99.6 % of such heads. A head that copies every token scores 1.
#
# The same rules as in 8.4: the models come in training mode with gradients on and must be left
# as found; return the model's dtype (the circuit) and make any tensor you create on the model's
# device (`torch.arange(V, device=circuit.device)`; each check runs your function once more on
# another device). Don't call the functions of `mha_lib.induction.circuits`.
#
# <details><summary>Hint</summary>
#
# `circuit.argmax(dim=0)` gives, for every column, the row of its largest entry.
# </details>

# %%
def ov_circuit(model, layer, head):
    raise NotImplementedError  # your code here


# %%
check_ov_circuit(ov_circuit)

# %%
def copying_score(model, layer, head):
    raise NotImplementedError  # your code here


# %%
check_copying_score(copying_score)

# %% [markdown]
# Which heads of the shipped model copy? **Before you run anything, write down what you expect**
# for the four induction heads of layer 2, for the head of layer 1 that your ablation found
# necessary, and for a model that was never trained. Then measure: the copying score of every
# head of both layers of `model`, and of an untrained model of the same shape
# (`torch.manual_seed(0)`, then `AttentionOnlyTransformer(64, max_len=24)`, moved to `device`),
# next to the baseline. Does the necessary head of layer 1 copy? If not, what does 8.4 say it
# writes instead?

# %%
# NBVAL_IGNORE_OUTPUT
# (a score counts columns: a near-tie could fall the other way on another machine)
# your code here

# %% [markdown]
# *Your answer here (double-click this cell to edit it).*

# %% [markdown]
# ## Done?
#
# Compare with `solutions/08_heads_that_compose.ipynb`, then go on to chapter 10.
