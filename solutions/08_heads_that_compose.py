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
# # Solutions · Chapter 08 · Heads that compose
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/08_heads_that_compose.ipynb`:
# > the same exercises, with the solutions filled in, a short discussion after each, and a model
# > answer to the written question, backed by the measurements above it.
# <!-- END SOLUTION -->
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
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=08`, or `.venv/bin/python -m mha_course start 08`; see the README), so that
# updates to the course never overwrite your work.
# -->

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
    # BEGIN SOLUTION
    shortest, longest = segment
    tokens = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)  # (B, L)
    predictable = torch.zeros(batch_size, seq_len, dtype=torch.bool)  # (B, L)
    for b in range(batch_size):
        n = int(torch.randint(shortest, longest + 1, (), generator=generator))
        first = int(torch.randint(0, seq_len - 2 * n + 1, (), generator=generator))
        second = int(torch.randint(first + n, seq_len - n + 1, (), generator=generator))
        tokens[b, second:second + n] = tokens[b, first:first + n].clone()  # the copy
        predictable[b, second + 1:second + n] = True  # all but the copy's first token
    return tokens, predictable
    # END SOLUTION


# %%
check_repeated_segment_batch(repeated_segment_batch)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The check reads the copy back from your mask and looks for an exact, earlier,
# non-overlapping copy in the tokens, so it accepts any way of drawing the positions; the library
# draws the whole batch at once with `gather` (`mha_lib/induction/data.py`). Two choices matter
# for what a model can learn. A fixed offset would let one layer solve the task by position
# alone ("copy the token 12 places back"), so the offset varies. And `predictable` starts at
# `second + 1`: the copy's first token comes after a random one, so nothing can predict it, and
# counting it would blur the loss that tells whether the model copies. `torch.randint(low, high)`
# never draws `high`, hence `longest + 1`.
# <!-- END SOLUTION -->
#
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
    # BEGIN SOLUTION
    previous = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, H, L - 1): weights[b, h, t, t - 1], t >= 1
    return previous.mean(dim=(0, 2))  # (H,)
    # END SOLUTION


# %%
check_previous_token_score(previous_token_score)

# %%
def induction_score(weights, batch):
    # BEGIN SOLUTION
    B, H, L, _ = weights.shape
    t = torch.arange(L, device=weights.device)  # (L,)
    first, second, length = (x.to(weights.device)[:, None] for x in (batch.first, batch.second, batch.length))
    queries = (t >= second) & (t <= second + length - 2)  # (B, L): second + i, i = 0 ... n - 2
    keys = torch.where(queries, t - second + first + 1, 0)  # (B, L): first + i + 1 (0 elsewhere, unused)
    picked = weights.gather(-1, keys[:, None, :, None].expand(B, H, L, 1)).squeeze(-1)  # (B, H, L)
    return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()  # (H,)
    # END SOLUTION


# %%
check_induction_score(induction_score)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The common slips are each off by one somewhere: counting query 0, taking the
# main diagonal (`t -> t`, a head that looks at itself) for the previous token, scoring the key
# `first + i` (the earlier occurrence of the current token: a *duplicate-token* head, not an
# induction head), or taking `batch.predictable` as the queries: it marks the tokens that are
# predicted, one position after the queries that predict them. The pooled mean weighs every
# scored query alike; a mean per row first would weigh a short copy as much as a long one.
# A score alone says little: a head that spreads its attention evenly over the past scores the
# mean of `1 / (t + 1)` over the scored queries (`uniform_previous_token_score`,
# `uniform_induction_score`), and that baseline is what a score is compared with below.
# <!-- END SOLUTION -->
#
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
    # BEGIN SOLUTION
    rows = []
    with torch.no_grad():
        for layer in model.layers:
            row = []
            for head in range(layer.num_heads):
                with silence_heads(layer, [head]):
                    row.append(losses(model(batch.tokens), batch)[1])  # the loss on the predictable tokens
            rows.append(torch.stack(row))
    return torch.stack(rows)  # (num_layers, H)
    # END SOLUTION


# %%
check_ablation_losses(ablation_losses)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The check runs your function on small *untrained* models with seeded weights:
# whether the table is right doesn't depend on training, and an untrained model is quick and the
# same on every machine. It hands them over in training mode with gradients on, calls your function
# more than once on the same model (again after its weights change) and looks for what a slip
# leaves behind: a hook never removed (the next forward pass still silences a head), the model's
# mode or `requires_grad` changed, gradients switched off for good, a result kept from an earlier
# call. `with silence_heads(...)` and `with torch.no_grad()` undo themselves when the block ends,
# even after an error. Silencing one head at a time is the question here; silencing a whole layer
# answers another one.
# <!-- END SOLUTION -->
#
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
# BEGIN SOLUTION
batch = repeated_segments(256, 24, VOCAB_SIZE, (4, 8), generator=torch.Generator().manual_seed(1)).to(device)
with torch.no_grad():
    logits, weights = model(batch.tokens, return_weights=True)  # weights: one (B, H, L, L) per layer
intact = losses(logits, batch)[1].item()
previous = torch.stack([previous_token_score(w) for w in weights]).cpu()  # (num_layers, H)
induction = torch.stack([induction_score(w, batch) for w in weights]).cpu()  # (num_layers, H)
silenced = ablation_losses(model, batch).cpu()  # (num_layers, H)
base_previous, base_induction = uniform_previous_token_score(24), uniform_induction_score(batch)


def row(values):
    return "  ".join(f"{v:5.2f}" for v in values.tolist())


print(f"intact model: loss on the predictable tokens {intact:.2f}  (a uniform guess: ln {VOCAB_SIZE} = "
      f"{math.log(VOCAB_SIZE):.2f})")
print(f"uniform baselines: previous-token {base_previous:.2f}, induction {base_induction:.2f}\n")
heads = "  ".join(f"{f'h{h}':>5}" for h in range(model.num_heads))  # column labels: head 0, 1, ...
print(f"{'':10}{'previous-token score':<29}{'induction score':<29}{'loss, head silenced'}")
print(f"{'':10}{heads}   {heads}   {heads}")
for l in range(model.num_layers):
    print(f"layer {l + 1}   {row(previous[l])}   {row(induction[l])}   {row(silenced[l])}")
# END SOLUTION

# %%
# SOLUTION ONLY
# What the model answer below says, checked on this model. The thresholds come from baselines
# alone (chapter 08): a role is a score at least halfway from uniform attention to 1; "needed" is
# a loss back above half of ln 64, halfway to not copying at all.
from mha_lib.induction import duplicate_token_score
from mha_lib.induction.run import role_threshold

phase = math.log(VOCAB_SIZE) / 2
duplicate = torch.stack([duplicate_token_score(w, batch) for w in weights]).cpu()
needed = [(l, h) for l in range(2) for h in range(4) if silenced[l, h] >= phase]
assert intact < phase  # the model copies
assert (induction[1] >= role_threshold(base_induction)).all() and (induction[0] < role_threshold(base_induction)).all()
assert (previous < role_threshold(base_previous)).all()  # no previous-token head anywhere
assert len(needed) == 1 and needed[0][0] == 0  # one head of layer 1, and only it, is needed
key_head = needed[0][1]
assert duplicate[0, key_head] >= role_threshold(base_induction)  # ... and it is a duplicate-token head
second = [h for h in range(4) if h != key_head and duplicate[0, h] >= role_threshold(base_induction)]
assert len(second) == 1 and duplicate[0, second[0]] < duplicate[0, key_head]  # one more, weaker duplicate-token head
assert silenced[0, second[0]] < phase  # silencing it alone costs less
print(f"needed: layer 1, head {key_head}; silenced, the loss rises past half of ln 64; "
      "it is a duplicate-token head, not a previous-token head")

# %% [markdown]
# Which heads do the work? Say what each score and each ablation tells, compared with the uniform
# baselines and with the intact model's loss, and whether the scores and the ablation agree.
#
# <!-- BEGIN ANSWER -->
# **Model answer.** *(The facts below are asserted in the cell above, on this shipped model;
# chapter 08's seed study says how far they hold for other runs.)*
#
# The model copies: its loss on the predictable tokens is about 1.0, far below the 4.16 of a
# uniform guess.
#
# *Layer 2 holds the induction heads.* All four of its heads score about 0.8 as induction heads,
# against 0.06 for uniform attention: from the second copy, they look at the token after the
# earlier occurrence of the current token. Yet silencing any one of them costs little (the loss
# rises from about 1.0 to at most about 1.7): the four do the same job, and three of them still
# do most of it.
#
# *Layer 1 has no previous-token head, by the score.* Every head of layer 1 scores *below* the
# uniform baseline as a previous-token head (0.07 or less, against 0.12), and none is an induction
# head. Going by these two scores alone, layer 1 looks idle.
#
# *The ablation says otherwise.* Silencing head 1 of layer 1 takes the loss from about 1.0 to
# about 3.1, most of the way back to a uniform guess; silencing any other head changes much less.
# So the induction heads of layer 2 need that one head of layer 1: the two layers compose. It is
# not the textbook previous-token head: from the second copy it puts about 0.9 of its attention
# on the *earlier occurrence of the current token itself* (`duplicate_token_score`), and elsewhere
# mostly on its own position. Head 2 of layer 1 is a second, weaker duplicate-token head (about
# 0.8): silencing it alone costs less (about 1.45), and it is why silencing head 1 does not take
# the loss all the way back (chapter 08 silences both). Chapter 08 shows through which input the induction heads read it
# (their queries) and that this holds across the runs of its seed study.
#
# The lesson: a score tests a hypothesis chosen in advance ("is this a previous-token head?");
# ablation asks the model which heads it needs. Here they disagree, and the ablation is the one
# that measured what the model does.
# <!-- END ANSWER -->

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
    # BEGIN SOLUTION
    layer = model.layers[0]
    was_training = model.training
    model.eval()  # the weights without dropout
    try:
        with torch.no_grad():
            _, weights = model(tokens, return_weights=True)
    finally:
        model.train(was_training)
    A = weights[0][:, head]  # (B, L, L): layer 1, this head
    rows = slice(head * layer.d_k, (head + 1) * layer.d_k)
    W_v, b_v = layer.W_v.weight[rows], layer.W_v.bias[rows]  # (d_k, D), (d_k,)
    W_o = layer.W_o.weight[:, rows]  # (D, d_k)
    E = model.token_embedding(tokens)  # (B, L, D)
    P = model.position_embedding[: tokens.size(1)]  # (L, D): position j reads row j
    token = A @ (E @ W_v.T @ W_o.T)  # (B, L, D)
    position = A @ (P @ W_v.T @ W_o.T)  # (B, L, D)
    bias = (b_v @ W_o.T).expand_as(token)  # (B, L, D): the rows of A sum to 1
    return token, position, bias
    # END SOLUTION


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
# BEGIN SOLUTION
at_copy = induction_queries(batch)[0].cpu()  # (B, L): the queries second + i, i = 0 ... n - 2
norms = torch.zeros(model.num_heads, 2, 3)  # [head, (at the second copy, elsewhere), (token, position, bias)]
for h in range(model.num_heads):
    with torch.no_grad():
        parts = head_parts(model, batch.tokens, h)
    for k, part in enumerate(parts):
        length = part.norm(dim=-1).cpu()  # (B, L): how much the head writes at each query
        norms[h, 0, k], norms[h, 1, k] = length[at_copy].mean(), length[~at_copy].mean()
names = "".join(f"{name:>9}" for name in ("token", "position", "bias"))
print(f"{'layer 1':9}{'at the second copy':^27}   {'elsewhere':^27}")
print(f"{'':9}{names}   {names}")
for h in range(model.num_heads):
    print(f"head {h:<4}" + "".join(f"{v:9.2f}" for v in norms[h, 0].tolist()) + "   "
          + "".join(f"{v:9.2f}" for v in norms[h, 1].tolist()))
# END SOLUTION

# %%
# SOLUTION ONLY
# What the model answer below says, checked on this model: the parts add up to the head's output,
# and the head that the model needs writes mostly its position part, at the second copy as elsewhere.
with torch.no_grad():
    split = head_parts(model, batch.tokens, key_head)
    assert torch.allclose(sum(split), model.head_outputs(batch.tokens)[0][:, key_head], atol=1e-4)
assert norms[key_head, 0, 1] > 1.5 * norms[key_head, 0, 0] and norms[key_head, 1, 1] > 1.5 * norms[key_head, 1, 0]
assert (norms[key_head, :, 2] < norms[key_head, :, 0] / 4).all()  # the bias part is small
assert norms[second[0], 0, 1] > 1.5 * norms[second[0], 1, 1]  # the weaker duplicate-token head: more position at the copy
print(f"layer 1, head {key_head}: position part {norms[key_head, 0, 1]:.1f} / token part {norms[key_head, 0, 0]:.1f} "
      f"at the second copy")

# %% [markdown]
# Which part dominates what the head that your ablation found necessary writes, at the second
# copy and elsewhere? And does the largest part have to be the one that the next layer uses?
#
# <!-- BEGIN ANSWER -->
# **Model answer.** *(Asserted in the cell above, on the shipped model.)* The necessary head
# (head 1 of layer 1) writes mostly its **position** part: about 2.6 long, against 1.4 for the
# token part and 0.2 for the bias, and that holds at the second copy as much as anywhere else.
# From the second copy it attends to the earlier occurrence of the current token (its
# duplicate-token score), so what it writes there is chiefly *where* that earlier occurrence
# sits. The weaker duplicate-token head (head 2) writes about twice as much position at the
# second copy as elsewhere. Heads 0 and 3 write little of either.
#
# A length says how much a head writes, not what anybody reads: layer 2 could ignore a large
# part and rely on a small one. To find out, remove one part from one input of layer 2 only
# (`mha_lib.induction.circuits.remove_parts`, e.g. the position part of this head from the
# induction heads' *queries*) and watch the loss on the predictable tokens.
# <!-- END ANSWER -->
#
# <!-- BEGIN SOLUTION -->
# **Discussion.** The split is exact because everything after the attention weights is linear:
# `A` mixes the values, `W_v` and `W_o` are matrices, and `E[t_j] + P_j` is a sum, so the sum can
# be taken apart term by term; only the softmax, inside `A`, is not linear, and `A` is kept as it
# is. The slips the check names come from the bookkeeping: `W_o`'s bias counted in a part (it
# belongs to the layer, not to a head), `b_v` forgotten or summed over the keys without the
# weights, the whole position table (`max_len` rows) instead of the first `L`, and slicing
# `nn.Linear` weights by columns where they need rows (`W_v`: rows, `W_o`: columns).
# <!-- END SOLUTION -->
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
    # BEGIN SOLUTION
    attention = model.layers[layer]
    rows = slice(head * attention.d_k, (head + 1) * attention.d_k)
    W_v = attention.W_v.weight[rows]  # (d_k, D)
    W_o = attention.W_o.weight[:, rows]  # (D, d_k)
    return model.unembed.weight @ W_o @ W_v @ model.token_embedding.weight.T  # (V, V): [logit a, source token b]
    # END SOLUTION


# %%
check_ov_circuit(ov_circuit)

# %%
def copying_score(model, layer, head):
    # BEGIN SOLUTION
    with torch.no_grad():
        circuit = ov_circuit(model, layer, head)  # (V, V)
    own = torch.arange(circuit.size(0), device=circuit.device)  # token b's own logit is row b
    return (circuit.argmax(dim=0) == own).float().mean().item()
    # END SOLUTION


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
# BEGIN SOLUTION
torch.manual_seed(0)
untrained = AttentionOnlyTransformer(VOCAB_SIZE, max_len=24).to(device)  # built on the CPU, then moved
copying = torch.tensor([[copying_score(model, l, h) for h in range(model.num_heads)] for l in range(model.num_layers)])
at_random = torch.tensor([[copying_score(untrained, l, h) for h in range(4)] for l in range(2)])
print(f"baseline, weights unrelated to copying: 1/V = {1 / VOCAB_SIZE:.3f} "
      f"(at most 4 of {VOCAB_SIZE} = {4 / VOCAB_SIZE:.3f} for 99.6 % of such heads)\n")
heads = "".join(f"{f'h{h}':>6}" for h in range(model.num_heads))
print(f"{'copying score':14}{'trained':^24}   {'untrained':^24}")
print(f"{'':14}{heads}   {heads}")
for l in range(model.num_layers):
    print(f"layer {l + 1:<8}" + "".join(f"{v:6.2f}" for v in copying[l].tolist()) + "   "
          + "".join(f"{v:6.2f}" for v in at_random[l].tolist()))
# END SOLUTION

# %%
# SOLUTION ONLY
# What the model answer below says, checked on this model. "Copies" here is beyond random weights: a
# score at least halfway from 1/V to 1 (chapter 08 also counts against a stronger baseline, its
# one-layer control); "chance": at most 4 of 64.
chance, copies = 4 / VOCAB_SIZE, role_threshold(1 / VOCAB_SIZE)
assert (copying[1] >= copies).all()  # every layer-2 head copies beyond random weights
assert copying[0, key_head] <= chance  # the necessary head of layer 1 does not
assert (at_random <= chance).all()  # nor does any head of the untrained model
copiers = [h for h in range(4) if h != key_head and copying[0, h] >= copies]
assert len(copiers) == 2 and all(silenced[0, h] < phase for h in copiers)  # two heads of layer 1 copy, unneeded
print(f"layer 2 copies ({copying[1].min():.2f} or more); layer 1's head {key_head} scores {copying[0, key_head]:.3f}; "
      f"layer 1's heads {copiers} copy but are not needed")

# %% [markdown]
# <!-- BEGIN ANSWER -->
# **Model answer.** *(Asserted in the cell above, on the shipped model.)*
#
# *Layer 2's heads copy.* All four heads of layer 2 score 0.6 to 0.7, about forty times the
# 0.016 of weights unrelated to copying: for two thirds of the 64 tokens, attending to a token
# raises that token's own logit more than any other. The untrained model's heads all score at
# most 2 of 64, chance, so the copying was learned.
#
# *The necessary head of layer 1 does not copy.* Head 1 of layer 1 scores 0.03 (2 of 64):
# chance. What it moves is not the token: 8.4 found that it writes mostly its position part.
# Together: from the second copy, this duplicate-token head finds the earlier occurrence of the
# current token and writes *where* it was; the induction heads of layer 2 use that to look one
# position further, and copy *what* they find there. (Which input of layer 2 reads the head's
# position part is what removing it from one input at a time tells; chapter 08 does that.)
#
# *Copying weights are not a used head.* Heads 0 and 3 of layer 1 copy by their weights, beyond
# random weights (0.67 and 0.59), yet silencing either costs little (exercise 8.3). The OV circuit says what a head
# would do with a token if it attended to it; the ablation says whether the model needs what the
# head actually writes. Neither replaces the other.
# <!-- END ANSWER -->

# %% [markdown]
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/08_heads_that_compose.ipynb`, then go on to chapter 10.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 10.
# <!-- END SOLUTION -->
