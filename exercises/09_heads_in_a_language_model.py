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
# # Exercises · Chapter 09 · Heads in a language model
#
# Two exercises on chapter 09's language model of real text (2 layers of 4 heads, trained on
# Python's own test suite), each with a question to answer on the shipped model:
#
# 1. a **score for a head role of your choosing**, next to what uniform attention would score;
#    then which heads of the model have that role, by the chapter's threshold rule, and whether
#    the study's other runs agree;
# 2. **which heads matter for one token class**: the loss on the tokens of that class when each
#    head alone is mean-ablated; then which head matters most for a class you pick.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh inputs (random attention weights, windows of
# text, small untrained models) and says what is wrong, if anything. Each statement says what the
# check enforces. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=09`, or `.venv/bin/python -m mha_course start 09`; see the README), so that
# updates to the course never overwrite your work.

# %%
import torch
import torch.nn.functional as F

from mha_lib import get_device, seed_everything
from mha_lib.checks import check_class_ablation, check_role_baseline, check_role_score
from mha_lib.textlm import load_checkpoint, load_corpus
from mha_lib.textlm.ablation import CLASSES, class_losses, token_classes
from mha_lib.textlm.scores import role_threshold

device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# Both exercises use the shipped model (`mha_lib/textlm/model_seed0.pt`, the run of seed 0) and
# 64 windows of 64 tokens of held-out text, files the model never trained on: `inputs[:, t]` is the
# token before `targets[:, t]`.

# %%
model, tokenizer, _ = load_checkpoint(device=device)  # a TextTransformer in evaluation mode
inputs, targets = load_corpus().val_windows(64, model.config.max_len)  # (64, 64) each, on the CPU
inputs, targets = inputs.to(device), targets.to(device)
print(f"{model.num_layers} layers of {model.num_heads} heads, {len(tokenizer)} tokens; "
      f"inputs {tuple(inputs.shape)}")

# %% [markdown]
# ## Exercise 9.1 · A score for a role of your choosing
#
# The chapter scored the heads for roles named before looking (previous token, first token,
# newline, ...), each next to what uniform attention would score. Now you name one. Pick a role
# from this menu (the check knows these three):
#
# - `"same token"`: from query `t` to the **earlier** keys `s < t` that hold the same token as
#   `t` (a name used again: `self` ... `self`). It applies to the queries that have at least one
#   such key; the others are left out of the mean.
# - `"punctuation"` or `"indent"`: from query `t` to the visible keys `s <= t` whose token is of
#   that class of the chapter's (`CLASSES`: brackets, dots, operators and quotes; or tokens of
#   spaces only). It applies to every query `t = 1 ... L - 1` (query 0 sees only itself).
#
# Write two functions for your role:
#
# 1. `role_score(weights, tokens, tokenizer)`: `weights` are one layer's attention weights
#    `(B, H, L, L)` (rows are queries, columns keys, each row sums to 1 over the keys `0 ... t`),
#    `tokens` the ids `(B, L)` they were computed on, `tokenizer` the model's. Return `(H,)`: each
#    head's weight on the role's keys, summed per query, averaged over the role's queries of the
#    whole batch, pooled (their sum over their number).
# 2. `role_baseline(tokens, tokenizer)`: the score of uniform attention, `1 / (t + 1)` on each key
#    `0 ... t`, as one number (a float).
#
# The class of every key: `token_classes(tokenizer, tokens, tokens)` gives each token's index in
# `CLASSES` (the function classifies a target given the token before it; only *word start* and
# *word piece* depend on that token, so passing the tokens as their own predecessors gives each
# key's class). It returns a CPU tensor.
#
# The cell lays out a helper, `role_masks(tokens, tokenizer)`, for the two masks of Hint 1: fill it
# in and use it in both functions, or write them your own way.
#
# What the check enforces: the scores in the **weights' dtype** (it hands over float32 and float64
# weights); every tensor you create on the **tokens' device** (it runs your functions once more
# on another device); the inputs left unchanged; the baseline a Python float or a one-element
# tensor. It feeds windows of text tokenized by two tokenizers (other ids), rows built for the
# corners (no repeated token at all, the first token coming back, a token seen three times) and
# lengths down to 2. Don't call `mha_lib.textlm.scores.key_class_score`.
#
# <details><summary>Hint 1</summary>
#
# Build two masks first: `keys`, `(B, L, L)` bool, True where key `s` is one of the role's keys
# for query `t`, and `queries`, `(B, L)` bool, True where the role applies. Then the score is two
# sums, `(weights * keys[:, None]).sum(-1)` and a sum over the queries, and the baseline uses
# the same masks.
# </details>
# <details><summary>Hint 2</summary>
#
# `torch.ones(L, L, dtype=torch.bool, device=...).tril(-1)` is True where `s < t`; `.tril()`
# where `s <= t`. `tokens[:, :, None] == tokens[:, None, :]` compares every query's token with
# every key's.
# </details>

# %%
ROLE = "punctuation"  # your choice: "same token", "punctuation" or "indent"


def role_masks(tokens, tokenizer):
    """(keys (B, L, L), queries (B, L)), both bool, on the tokens' device."""
    raise NotImplementedError  # your code here


def role_score(weights, tokens, tokenizer):
    raise NotImplementedError  # your code here


def role_baseline(tokens, tokenizer):
    raise NotImplementedError  # your code here


# %%
check_role_score(role_score, role=ROLE)

# %%
check_role_baseline(role_baseline, role=ROLE)

# %% [markdown]
# ## Which heads have your role?
#
# Apply your functions to the shipped model: each layer's weights on `inputs`
# (`model(inputs, return_weights=True)` returns the logits and one `(B, H, L, L)` per layer),
# every head's score, the baseline, and the chapter's threshold, `role_threshold(baseline)`:
# halfway from the baseline to 1. A head **has the role** when its score reaches the threshold.
# Print the scores rounded to 2 decimals, one line per layer, and the heads that have the role.

# %%
# your code here

# %% [markdown]
# Which heads have your role, and by how much do they clear the threshold? Is a head that stays
# below the threshold but far above the baseline doing the role too?
#
# *Your answer here (double-click this cell to edit it).*
#
# **One run or six?** The shipped model is one run of the chapter's study. The study recorded the
# two class roles, punctuation and indent, for every head of its 6 runs at every evaluation:
# `load_study().runs` (from `mha_lib.textlm.study`) is the list of runs, and for a run `r`,
# `r["probes"][-1]["scores"]["punctuation"]` holds the last evaluation's scores, one list per
# layer, with uniform attention's score in `r["probes"][-1]["scores"]["uniform"]["punctuation"]`.
# They are measured on the study's own held-out windows (128 of them), so they differ from
# yours in the second decimal. For a class role: in how many runs does a head have it? How many
# times uniform attention's score does each run's strongest head reach, and in which layer is
# it? Is the shipped model
# typical? (For "same token", the study's nearest record is chapter 08's duplicate-token score,
# on random tokens: see the chapter's section 7.)

# %%
# your code here

# %% [markdown]
# *Your answer here (double-click this cell to edit it).*
#
# ## Exercise 9.2 · Which heads matter for one token class
#
# A score tests a role you chose; ablation asks the model which heads it needs, and for which
# tokens. Write `class_ablation(model, inputs, targets, classes, cls)` for a `TextTransformer`:
# `inputs` and `targets`, `(B, L)` ids, the targets one token later; `classes`, `(B, L)` long, the
# class of every target (an index into `CLASSES`, as `token_classes` gives it); `cls`, one class's
# index. Return a tensor `(layers, heads)` whose entry `[l, h]` is how much the mean cross-entropy
# (nats) on the targets of class `cls` **rises** when head `h` of layer `l` alone is
# **mean-ablated**:
#
# - head `h`'s output is its `d_k` columns `h * d_k : (h + 1) * d_k` of the input to
#   `model.blocks[l].attn.W_o` (the heads' outputs side by side, `(B, L, D)`, with
#   `d_k = model.blocks[l].attn.d_k`);
# - mean-ablated: those columns replaced, at every position of every sequence, by their mean over
#   the batch **and** the positions, taken from the intact model on the same inputs;
# - the loss of each target: `F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")`,
#   `(B, L)` (`logits[:, t]` predicts `targets[:, t]`); average it over the targets where
#   `classes == cls`, with the head ablated, and subtract the intact model's average on the same
#   targets.
#
# What the check enforces: the result in the **model's dtype** (it hands over float32 and float64
# models); the model left as you found it: its mode (it hands over models in training mode and in
# evaluation mode), `requires_grad`, its weights, no hook left behind, gradients on. It calls your
# function on small untrained models, twice on the same one, and again after the weights change.
# It runs on the CPU. Don't call the functions of `mha_lib.textlm.ablation`.
#
# <details><summary>Hint 1</summary>
#
# A forward pre-hook sees a module's input before the module runs and may replace it:
# `handle = W_o.register_forward_pre_hook(hook)` with `def hook(module, args):` returning
# `(new_input,)`, a changed *copy* of `args[0]`. First run one hook that only records each
# layer's input (for the means), then one hook per ablated head. Call `handle.remove()` in a
# `finally:` block, right after the forward pass.
# </details>
# <details><summary>Hint 2</summary>
#
# `was_training = model.training` before, `model.train(was_training)` after, if you switch to
# evaluation mode; `with torch.no_grad():` keeps autograd out without touching `requires_grad`.
# </details>

# %%
def class_ablation(model, inputs, targets, classes, cls):
    raise NotImplementedError  # your code here


# %%
check_class_ablation(class_ablation)

# %% [markdown]
# ## Which head matters most for your class?
#
# Pick a class of `CLASSES` (`"newline"`, `"indent"`, `"punctuation"`, `"word start"` or
# `"word piece"`). On `inputs` and `targets`, compute the class of every target
# (`token_classes(tokenizer, inputs, targets)`, a CPU tensor: move it to `device`), how many
# targets are of your class, the intact model's loss on them (`class_losses(model, inputs,
# targets, classes)` gives every class's), and your table. Print them rounded to 2 decimals, and
# the head whose ablation raises the loss most.

# %%
CLASS = "punctuation"  # your choice

# your code here

# %% [markdown]
# Which head matters most for your class, and how does its cost compare with the intact loss and
# with the other heads? Does that head have one of the roles the chapter and exercise 9.1 score?
#
# *Your answer here (double-click this cell to edit it).*
#
# ## Recap
#
# - A role is two masks: the keys it names for each query, and the queries it applies to. Its
#   score is the weight on those keys pooled over those queries; its baseline is the same score
#   for uniform attention, `1 / (t + 1)` per visible key, and the chapter's rule puts the bar
#   halfway from that baseline to 1.
# - Mean-ablation replaces a head's output by its average over the batch and the positions, with a
#   forward pre-hook on `W_o` that is removed afterwards; the loss it costs, per token class, says
#   which tokens the head is needed for.

# %% [markdown]
# ## Done?
#
# Compare with `solutions/09_heads_in_a_language_model.ipynb`, then go on to chapter 10.
