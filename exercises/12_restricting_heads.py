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
# # Exercises · Chapter 12 · Restricting each head to half of the sequence
#
# The "Try it yourself" of the source post, in three parts:
#
# 1. build the mask and run restricted multi-head attention (two checks);
# 2. compare it with the unrestricted module on the post's tiny configuration and on a longer
#    sentence: per-head maps, output differences, what each head's output is made of;
# 3. retrain chapter 07's sentiment model with restricted heads and measure how it does on
#    negated sentences whose "not" and sentiment word fall in the same half, and in different
#    halves.
#
# Then write what changed and what it suggests about the role of heads.
#
# Part 1 has two checks, like the other exercises: replace each `raise NotImplementedError`, run
# the cell, then its check. The cells of parts 2 and 3 that say *your code here* have no check:
# compute what the text asks for, then compare with `solutions/12_restricting_heads.ipynb`.
# Work in your own copy (`make exercise N=12`, or `.venv/bin/python -m mha_course start 12`).

# %%
import matplotlib.pyplot as plt
import torch

from mha_lib import MultiHeadAttention, get_device, plot_attention, seed_everything, split_heads
from mha_lib.checks import check_halves_mask, check_restricted_attention

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## Part 1 · The restriction
#
# ### Exercise 12.1 · The halves mask
#
# Write `halves_mask(seq_len)` returning a boolean mask of shape `(2, L, L)`, True = may attend:
# for **every** query, head 0 may attend to the keys `[0, L // 2)` and head 1 to the keys
# `[L // 2, L)`. (For odd `L` the middle key belongs to head 1.)
#
# <details><summary>Hint 1</summary>
#
# Which keys are in the first half is one comparison: `torch.arange(seq_len) < seq_len // 2`.
# </details>
# <details><summary>Hint 2</summary>
#
# Restrict the **keys**, the last axis: `mask[0, :, :L // 2] = True` gives every query of head 0
# the first half.
# </details>

# %%
def halves_mask(seq_len):
    raise NotImplementedError  # your code here


# %%
check_halves_mask(halves_mask)

# %% [markdown]
# ### Exercise 12.2 · Restricted multi-head attention
#
# Write `restricted_attention(mha, x)`: self-attention of `x (B, L, d_model)` through the
# two-head `mha_lib.MultiHeadAttention` `mha`, with head 0 restricted to the first half and
# head 1 to the second. Return `(output, weights)`. Put the mask on `x`'s device (the check runs
# your function once more on another device), and leave the module as you found it: the check
# hands it over in training mode with gradients on and a hook of its own, changes its weights
# between calls, and names a changed mode, `requires_grad`, hook or weight.
#
# <details><summary>Hint</summary>
#
# Chapter 12 showed how an `(H, L, L)` mask broadcasts through the module, and which shape
# would silently restrict *sequences* instead of heads. Mind the device of the mask.
# </details>

# %%
def restricted_attention(mha, x):
    raise NotImplementedError  # your code here


# %%
check_restricted_attention(restricted_attention)

# %% [markdown]
# ## Part 2 · What the restriction changes
#
# The source post's tiny configuration: a batch of 2 sequences of 4 tokens, embeddings of 8,
# 2 heads. The two modules below share their weights; only the mask differs. This part only
# looks, so the module's weights need no gradients (`requires_grad_(False)`): the tensors you
# print then carry no `grad_fn=...` line.

# %%
seed_everything(0)
mha = MultiHeadAttention(d_model=8, num_heads=2).to(device).eval().requires_grad_(False)
x = torch.randn(2, 4, 8).to(device)  # (B, L, d_model)

# %% [markdown]
# ### 2.1 · The per-head maps, side by side
#
# Run the module with and without the restriction (`return_weights=True`) and plot, for the
# first sequence, the four maps: head 0 and head 1, unrestricted and restricted. How much of each
# head's attention did the restriction take away (the weight that used to fall on the other half)?

# %%
# your code here

# %% [markdown]
# ### 2.2 · The output difference, per position and per head
#
# Compute each head's output *before* `W_o` (hint: `split_heads` of the module's concatenated
# heads, or rebuild it from `weights` and the projected values), with and without the
# restriction, and print the size of the change (e.g. the norm of the difference) per position
# and per head; then the change of the final output per position.

# %%
# your code here

# %% [markdown]
# ### 2.3 · Head 0 is now a mix of first-half values only
#
# Show it two ways: (a) head 0's weights on the second half are exactly zero, and its output
# equals its weights on the first half times the first half's values; (b) replace the second
# half's **values** by anything (say, large random numbers), recompute head 0's blend with the
# same weights, and see that it doesn't move, while head 1's does.

# %%
# your code here

# %% [markdown]
# ### 2.4 · A longer sentence
#
# Repeat 2.1 on a sentence of 9 words, "the movie was not bad but the ending was", with the
# words as the maps' axis labels. The cell below makes what you need: after `seed_everything(1)`,
# first a fresh two-head module `mha16`, then random embeddings `emb` for the words. Both draw
# from the same random generator, so the other order would give other weights and other maps.
# Run `mha16` on `emb` with and without the restriction and plot the four maps of the sentence.
# Which keys does each head keep, which head gets the middle word of this odd-length sentence,
# and what does that mean for "not" and "bad"?

# %%
sentence = "the movie was not bad but the ending was".split()
seed_everything(1)
mha16 = MultiHeadAttention(d_model=16, num_heads=2).to(device).eval().requires_grad_(False)  # first the module
emb = torch.randn(1, len(sentence), 16).to(device)  # then the embeddings, (1, 9, 16)

# %%
# your code here

# %% [markdown]
# ## Part 3 · What it costs a trained model
#
# Chapter 07's sentiment model (one encoder layer with two heads, classifying from the `<cls>`
# token at position 0) learned that "not" flips the sentiment word. Here each sentence is
# restricted by **its own** length, as the model sees it: with `n` real tokens (`<cls>` included),
# head 0 may attend to positions `[0, n // 2)` and head 1 to `[n // 2, n)`; padding stays masked.
#
# 1. Write `halves_for_batch(tokens)` returning a bool mask `(B, 2, L, L)` for a batch of padded
#    token ids `(B, L)` (the padding id is `vocab.pad_id`). The halves come from each sentence's
#    own length, not from the padded `L`: with `halves_mask(L)`, a short sentence would lie
#    entirely in head 0's half. The padding keys may stay True: the model masks them anyway.
# 2. Train the unrestricted model as in chapter 07 (seed 0), then measure its held-out accuracy
#    in three groups: plain sentences, negated sentences with "not" and the sentiment word in the
#    **same** half, and in **different** halves. Then apply the restriction to the trained model
#    without retraining, and measure again.
# 3. Retrain with the restriction from the start (seed 0) and measure again.
# 4. One trained model is one sample. Compare yours with the course's **seed study**
#    (`mha_lib.sentiment.load_study()`): the same three measurements over many independent runs,
#    each with its own seed and its own sentences. Where do your numbers fall among theirs?
# 5. Before you explain a gap between the two negated groups, check what else differs between
#    them (3.5 below).
#
# `mha_lib.sentiment` has what you need: `make_datasets`, `Vocab`, `SentimentClassifier`,
# `train_model(model, train, vocab, mask=..., reports=0)` and `predict(model, examples, vocab,
# mask=...)`, whose `mask` may be a function of the batch's tokens, like `halves_for_batch`. An
# `Example` knows its `tokens`, `negated`, `negation_pos` and `sentiment_pos` (word indices:
# word `i` sits at position `i + 1`, after `<cls>`). The models train on one CPU thread, as in
# chapter 07 and in the study: fastest for a model this small.

# %%
from mha_lib.sentiment import SentimentClassifier, Vocab, load_study, make_datasets, predict, train_model

torch.set_num_threads(1)  # this notebook's choice: a model this small trains fastest on one thread
train, test = make_datasets()
vocab = Vocab.for_task()

# %%
# your code here

# %%
# NBVAL_IGNORE_OUTPUT
# (training numbers differ in the last digits between machines, so the accuracies can too)
# your code here

# %% [markdown]
# Whatever you printed is one run: on another machine the same seed may give other numbers
# (chapter 07). Which of your observations would hold for any seed? The seed study tells. Plot
# its runs, one dot per run, with your models as stars: `mha_lib.sentiment.plots.plot_runs(ax,
# study, {label: fn(run)}, where=..., yours={label: value})` draws such a plot. Count only the
# study's independent two-head runs, those for which `mha_lib.sentiment.findings.independent(run)`
# holds: each has its own seed and its own sentences. (The study repeats the two-head runs on a
# second CPU kernel path, as a check on rounding; such a replica is the same run computed again,
# not a new sample, and measures no halves.) Each independent run holds
# `run["halves"][model][group]`, with `model` one of `"free, tested free"`, `"free, tested
# restricted"` and `"trained restricted"`, and `group` one of `"plain"`, `"same half"` and
# `"different halves"`; its thresholds, derived from chance, are in `run["baselines"]`
# (`"learned_at"`, 95%, a tenth of a guess's errors; `"near_chance"`, below 72.5%, closer to
# chance than to learned). Whether the freely trained model learned the task (95% or more on
# the negated and on the plain sentences): `mha_lib.sentiment.findings.learned(run)`.

# %%
# your code here

# %% [markdown]
# ### 3.5 · The halves, or the template?
#
# The two groups of negated sentences differ in more than the halves. Where "not" and the
# sentiment word fall is decided by the template that drew the sentence ("the movie was not
# good", "i did not find the plot boring", "not a good film") and by its optional words. Count
# the templates in each group of the held-out sentences: `template_of(example)` in
# `mha_lib.sentiment.probes` names one. If one template is harder than another for a restricted
# model, for any reason, the gap between the groups would show it, and look like an effect of
# the halves.
#
# To take the template out, compare same and different halves only **within strata**:
# sentences of one run, of the same template and the same number of words. `halves_strata(test)`
# gives `{(template, words): {"same half": [...], "different halves": [...]}}`;
# `stratified_halves([(correct, test), ...])` compares the two groups inside every stratum that
# holds both and averages over the strata, each weighted by `n_same · n_diff / (n_same + n_diff)`;
# its `gap` is **different halves minus same half**: positive when the sentences whose two words
# lie in different halves do better.
# The study records which held-out sentence each model got right, in `run["halves_correct"][model]`
# (a string of `0`/`1`, one per held-out sentence of the run, in the order of
# `make_datasets(study.config["n_train"], study.config["n_test"], seed=run["data_seed"])[1]`).
# Over the study's runs: does a gap of the restricted model survive inside the strata, and in
# which direction? In how many runs is it positive, in how many negative, and how many would a
# coin give (if the halves did not matter, a run's gap would be as likely negative as positive)?

# %%
import math

from mha_lib.sentiment.probes import TEMPLATES, halves_strata, stratified_halves, template_of

# your code here

# %% [markdown]
# ## Part 4 · What changed, and what it suggests
#
# Write a few sentences: what changed in the outputs, and what does this suggest about the role
# of attention heads? Back each claim with a number you measured above, and say which of your
# claims you would expect to hold for any seed, and which are about the model you trained.
#
# *Your answer here (double-click this cell to edit it).*
#
# ## Done?
#
# That was the course's last exercise. Compare your results and your answer with
# `solutions/12_restricting_heads.ipynb`.
