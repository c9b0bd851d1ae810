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
# # Solutions · Chapter 12 · Restricting each head to half of the sequence
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/12_restricting_heads.ipynb`:
# > the same exercises, with the solutions filled in, every comparison computed, and a model
# > answer to the written question, backed by the measurements above it.
# <!-- END SOLUTION -->
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
# <!-- EXERCISE ONLY
# Part 1 has two checks, like the other exercises: replace each `raise NotImplementedError`, run
# the cell, then its check. The cells of parts 2 and 3 that say *your code here* have no check:
# compute what the text asks for, then compare with `solutions/12_restricting_heads.ipynb`.
# Work in your own copy (`make exercise N=12`, or `.venv/bin/python -m mha_course start 12`).
# -->

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
    # BEGIN SOLUTION
    first = torch.arange(seq_len) < seq_len // 2  # (L,) keys in the first half
    per_head = torch.stack([first, ~first])  # (2, L): head 0 -> first half, head 1 -> second half
    return per_head[:, None, :].expand(2, seq_len, seq_len)  # the same for every query
    # END SOLUTION


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
    # BEGIN SOLUTION
    mask = halves_mask(x.size(1)).to(x.device)  # (2, L, L) -> broadcast as (1, 2, L, L)
    return mha(x, x, x, mask=mask, return_weights=True)
    # END SOLUTION


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
# BEGIN SOLUTION
with torch.no_grad():
    out_free, w_free = mha(x, x, x, return_weights=True)  # (2, 4, 8), (2, 2, 4, 4)
    out_half, w_half = restricted_attention(mha, x)

tokens = [f"x{i}" for i in range(4)]
maps = torch.stack([w_free[0, 0], w_free[0, 1], w_half[0, 0], w_half[0, 1]])  # (4, L, L)
plot_attention(maps, tokens, head_titles=["head 0, free", "head 1, free", "head 0, first half", "head 1, second half"],
               title="Sequence 0: the same heads, without and with the restriction")
plt.show()

half = x.size(1) // 2
lost_0 = w_free[:, 0, :, half:].sum(-1).mean().item()  # head 0's weight on the second half, before
lost_1 = w_free[:, 1, :, :half].sum(-1).mean().item()  # head 1's weight on the first half, before
print(f"weight the restriction took away: head 0 {lost_0:.2f}, head 1 {lost_1:.2f} (of 1.00 per query)")
# END SOLUTION

# %% [markdown]
# ### 2.2 · The output difference, per position and per head
#
# Compute each head's output *before* `W_o` (hint: `split_heads` of the module's concatenated
# heads, or rebuild it from `weights` and the projected values), with and without the
# restriction, and print the size of the change (e.g. the norm of the difference) per position
# and per head; then the change of the final output per position.

# %%
# BEGIN SOLUTION
def head_outputs(weights):
    """Each head's output before W_o, (B, H, L, d_k), from the module's own values."""
    v = split_heads(mha.W_v(x), mha.num_heads)  # (B, H, L, d_k)
    return weights @ v


with torch.no_grad():
    heads_free, heads_half = head_outputs(w_free), head_outputs(w_half)  # (2, 2, 4, 4)
    per_head = (heads_half - heads_free).norm(dim=-1).mean(dim=0)  # (H, L), averaged over the batch
    per_position = (out_half - out_free).norm(dim=-1).mean(dim=0)  # (L,)
    head_size = heads_free.norm(dim=-1).mean().item()
    size = out_free.norm(dim=-1).mean().item()

print("change of each head's output (norm, mean over the batch):")
for h in range(2):
    print(f"  head {h}: " + "  ".join(f"x{i} {per_head[h, i]:.2f}" for i in range(4)))
print("change of the final output:  " + "  ".join(f"x{i} {per_position[i]:.2f}" for i in range(4)))
print(f"(typical sizes, unrestricted: a head's output {head_size:.2f}, a final output vector {size:.2f})")
# END SOLUTION

# %% [markdown]
# ### 2.3 · Head 0 is now a mix of first-half values only
#
# Show it two ways: (a) head 0's weights on the second half are exactly zero, and its output
# equals its weights on the first half times the first half's values; (b) replace the second
# half's **values** by anything (say, large random numbers), recompute head 0's blend with the
# same weights, and see that it doesn't move, while head 1's does.

# %%
# BEGIN SOLUTION
with torch.no_grad():
    v = split_heads(mha.W_v(x), mha.num_heads)  # (B, H, L, d_k)
    assert (w_half[:, 0, :, half:] == 0).all() and (w_half[:, 1, :, :half] == 0).all()
    first_half_only = w_half[:, 0, :, :half] @ v[:, 0, :half]  # (B, L, d_k)
    assert torch.allclose(heads_half[:, 0], first_half_only, atol=1e-6)

    v_other = v.clone()
    v_other[:, :, half:] = 100 * torch.randn(2, 2, 4 - half, 4).to(device)  # scramble the second half's values
    blend = w_half @ v_other  # (B, H, L, d_k)
    print("head 0 unchanged when the second half's values change:", torch.allclose(blend[:, 0], heads_half[:, 0]))
    print("head 1 unchanged when the second half's values change:", torch.allclose(blend[:, 1], heads_half[:, 1]))
# END SOLUTION

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
# BEGIN SOLUTION
with torch.no_grad():
    _, w_long_free = mha16(emb, emb, emb, return_weights=True)
    _, w_long_half = restricted_attention(mha16, emb)
plot_attention(torch.cat([w_long_free[0], w_long_half[0]]), sentence,
               head_titles=["head 0, free", "head 1, free", "head 0, first half", "head 1, second half"],
               title=f"{len(sentence)} words: head 0 keeps keys 0-{len(sentence) // 2 - 1}, head 1 the rest")
plt.show()
print("keys of head 0:", sentence[: len(sentence) // 2], " keys of head 1:", sentence[len(sentence) // 2 :])
# END SOLUTION

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# With `L = 9`, head 0 keeps keys 0-3 (`the movie was not`) and head 1 keys 4-8: the middle word,
# `bad`, goes to the second half. So "not" and "bad" now reach every query through *different*
# heads. With random weights the maps say nothing about language: the point is the shape of
# the restriction, the same blank half in every row.
# <!-- END SOLUTION -->
#
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
# BEGIN SOLUTION
def halves_for_batch(tokens):
    B, L = tokens.shape
    lengths = (tokens != vocab.pad_id).sum(dim=1)  # (B,) <cls> and the words
    first = torch.arange(L, device=tokens.device)[None, :] < (lengths // 2)[:, None]  # (B, L) head 0's keys
    return torch.stack([first, ~first], dim=1)[:, :, None, :].expand(B, 2, L, L)  # (B, H, Lq, Lk)


def groups(examples):
    """Indices of the plain sentences, and of the negated ones by where "not" falls."""
    found = {"plain": [], "same half": [], "different halves": []}
    for i, e in enumerate(examples):
        if not e.negated:
            found["plain"].append(i)
            continue
        split = (len(e.tokens) + 1) // 2  # in positions, <cls> included
        same = (e.negation_pos + 1 < split) == (e.sentiment_pos + 1 < split)
        found["same half" if same else "different halves"].append(i)
    return found


labels = torch.tensor([e.label for e in test])
test_groups = groups(test)
CHANCE = 0.5  # two balanced labels: a guess is right half the time
LEARNED_AT = 1 - (1 - CHANCE) / 10  # chapter 07's "learned": a tenth of a guess's errors, 95%
NEAR_CHANCE = (CHANCE + LEARNED_AT) / 2  # closer to chance than to learned: below 72.5%


def accuracy_by_group(model, mask=None):
    correct = predict(model, test, vocab, mask=mask) == labels
    return {name: correct[idx].float().mean().item() for name, idx in test_groups.items()}


print("held-out sentences per group:", {name: len(idx) for name, idx in test_groups.items()})
# END SOLUTION

# %%
# SOLUTION ONLY
# The seed study measured with the library's copies of these two functions; they agree with ours.
from mha_lib.sentiment import batch_examples
from mha_lib.sentiment.probes import halves_for_batch as shipped_halves, halves_groups

batch = batch_examples(test[:64], vocab)
assert torch.equal(halves_for_batch(batch), shipped_halves(batch)) and groups(test) == halves_groups(test)
print("halves_for_batch and groups agree with mha_lib.sentiment.probes")

# %%
# NBVAL_IGNORE_OUTPUT
# (training numbers differ in the last digits between machines, so the accuracies can too)
# BEGIN SOLUTION
results = {}
seed_everything(0)
free = SentimentClassifier(len(vocab)).to(device)
train_model(free, train, vocab, seed=0, reports=0)
results["free, tested free"] = accuracy_by_group(free)
results["free, tested restricted"] = accuracy_by_group(free, mask=halves_for_batch)

seed_everything(0)
restricted = SentimentClassifier(len(vocab)).to(device)
train_model(restricted, train, vocab, seed=0, mask=halves_for_batch, reports=0)
results["trained restricted"] = accuracy_by_group(restricted, mask=halves_for_batch)

names = list(test_groups)
print(f"{'your models (seed 0)':25}" + "".join(f"{n:>18}" for n in names))
for row, accs in results.items():
    print(f"{row:25}" + "".join(f"{accs[n]:>18.0%}" for n in names))
# The one finding about these rows that held in every run of the seed study that learned (see below):
# restricted at test time, the freely trained model falls below 95% in some group.
assert min(results["free, tested restricted"].values()) < LEARNED_AT
# END SOLUTION

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
# BEGIN SOLUTION
from mha_lib.sentiment.findings import independent, learned
from mha_lib.sentiment.plots import plot_runs


def independent_halves(run):
    """A run that counts (two heads, its own seed and sentences, not a replica), halves measured."""
    return independent(run) and "halves" in run


study = load_study()
runs = [run for run in study.runs if independent_halves(run)]
assert all(run["baselines"]["learned_at"] == LEARNED_AT and run["baselines"]["near_chance"] == NEAR_CHANCE
           for run in runs)  # the study's thresholds are ours
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True, layout="constrained")
for ax, model_name in zip(axes, results):
    plot_runs(ax, study, {g: (lambda r, m=model_name, g=g: r["halves"][m][g]) for g in names},
              where=independent_halves, yours=results[model_name], title=model_name, legend=ax is axes[-1])
fig.suptitle(f"Held-out accuracy by group: {len(runs)} independent runs of the seed study, and your models")
plt.show()
# END SOLUTION

# %%
# SOLUTION ONLY
import statistics


# Restricting a model at test time can only break what it had learned: its claims count the
# runs whose freely trained model learned the task. The model trained restricted is a model of
# its own: its claims count every run.
learned_runs = [run for run in runs if learned(run)]


def count(model, holds, selected=runs):
    """(k, n): holds(accuracies by group) in k of the n runs selected."""
    return sum(bool(holds(run["halves"][model])) for run in selected), len(selected)


def supports(word, k, n):
    """Whether k of n runs support the model answer's word: "every", "most" (more than two in three,
    as in chapter 07: `mha_lib.sentiment.findings.wording`), "some", or the count itself, (k, n)."""
    if isinstance(word, tuple):
        return word == (k, n)
    return {"every": k == n, "most": 3 * k > 2 * n, "some": k > 0}[word]


def median(model, group, selected=runs):
    return statistics.median(run["halves"][model][group] for run in selected)


def span(model, group, selected=runs):
    values = [run["halves"][model][group] for run in selected]
    return min(values), max(values)


stated = {  # what the model answer says, the count behind it, and the word it uses
    "free, tested restricted: some group below learned": (
        count("free, tested restricted", lambda a: min(a.values()) < LEARNED_AT, learned_runs), "every"),
    "free, tested restricted: some group near chance": (
        count("free, tested restricted", lambda a: min(a.values()) < NEAR_CHANCE, learned_runs), "every"),
    "trained restricted: different halves learned": (
        count("trained restricted", lambda a: a["different halves"] >= LEARNED_AT), "most"),
    "trained restricted: same half near chance": (
        count("trained restricted", lambda a: a["same half"] < NEAR_CHANCE), "most"),
    "trained restricted: different halves > same half": (
        count("trained restricted", lambda a: a["different halves"] > a["same half"]), "most"),
    "trained restricted: same half learned": (
        count("trained restricted", lambda a: a["same half"] >= LEARNED_AT), "some"),
    "trained restricted: plain not near chance": (
        count("trained restricted", lambda a: a["plain"] >= NEAR_CHANCE), "every"),
    "trained restricted: plain learned": (
        count("trained restricted", lambda a: a["plain"] >= LEARNED_AT), (20, 40)),
}
print(f"thresholds: chance {CHANCE:.0%}, learned {LEARNED_AT:.0%}, near chance below {NEAR_CHANCE:.1%}")
print(f"independent two-head runs: {len(runs)}; the freely trained model learned the task in {len(learned_runs)}")
for claim, ((k, n), word) in stated.items():
    print(f"{claim:52} {k:2d} of {n} runs ({word if isinstance(word, str) else 'as counted'})")
    assert supports(word, k, n), (claim, k, n, word)
negated_medians = {g: median("free, tested restricted", g, learned_runs) for g in names[1:]}
print("free, tested restricted, medians over the runs that learned:",
      ", ".join(f"{g} {m:.0%}" for g, m in negated_medians.items()))
assert all(m < NEAR_CHANCE for m in negated_medians.values())  # "the medians of both negated groups: near chance"
low, high = span("trained restricted", "plain")
print(f"trained restricted, plain: {low:.0%} to {high:.0%}, median {median('trained restricted', 'plain'):.0%}")
low, high = span("trained restricted", "same half")
print(f"trained restricted, same half: {low:.0%} to {high:.0%}")

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

# BEGIN SOLUTION
print("held-out sentences of data seed 0, by template:")
for name in names[1:]:
    found = [template_of(test[i]) for i in test_groups[name]]
    print(f"  {name:17}" + "".join(f"  {t!r}: {found.count(t):3d}" for t in TEMPLATES))
print("strata holding both groups:", {key: {g: len(i) for g, i in groups.items()}
                                      for key, groups in halves_strata(test).items() if all(groups.values())})

n_train, n_test = study.config["n_train"], study.config["n_test"]
tests = {run["data_seed"]: make_datasets(n_train, n_test, seed=run["data_seed"])[1] for run in runs}  # each run's own
assert all(len(run["halves_correct"]["trained restricted"]) == len(tests[run["data_seed"]]) for run in runs)


def within_strata(model, selected=runs):
    return stratified_halves([(run["halves_correct"][model], tests[run["data_seed"]]) for run in selected])


def needed_by_a_coin(n, level=0.05):
    """The fewest positive runs out of n that a fair coin reaches with probability at most `level`
    (n + 1 when even n of n is that likely, as with very few runs)."""
    return next((k for k in range(n + 1) if sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n <= level), n + 1)


per_run = {model: [within_strata(model, [run]) for run in runs] for model in results}
for model in results:
    pooled = within_strata(model)
    gaps = [r["gap"] for r in per_run[model]]
    positive, negative = sum(g > 0 for g in gaps), sum(g < 0 for g in gaps)
    print(f"{model:24} within strata ({pooled['sentences']} sentences, {pooled['strata']} strata): "
          f"same half {pooled['same half']:.0%}, different halves {pooled['different halves']:.0%}; "
          f"gap (different - same) > 0 in {positive}, < 0 in {negative}, tied in {len(gaps) - positive - negative} runs "
          f"(a coin reaches {needed_by_a_coin(positive + negative)} or more only 5% of the time)")

columns = {"same half\n(all)": lambda r: r["halves"]["trained restricted"]["same half"],
           "different halves\n(all)": lambda r: r["halves"]["trained restricted"]["different halves"]}
strata_of = {id(run): result for run, result in zip(runs, per_run["trained restricted"])}
columns |= {f"{g}\n(within strata)": (lambda r, g=g: strata_of[id(r)][g]) for g in ("same half", "different halves")}
fig, ax = plt.subplots(figsize=(8, 3.4), layout="constrained")
plot_runs(ax, study, columns, where=lambda r: id(r) in strata_of,
          title="Trained restricted: same vs different halves, all sentences and within strata")
plt.show()
# END SOLUTION

# %%
# SOLUTION ONLY
# What the model answer says about the templates and the strata, asserted over every run's sentences.
same = [template_of(t[i]) for t in tests.values() for i in halves_groups(t)["same half"]]
movie_share = same.count(TEMPLATES[0]) / len(same)
assert movie_share > 0.9 and TEMPLATES[1] not in same  # "almost every", and no "i did not find ..."
both = {key for t in tests.values() for key, groups in halves_strata(t).items() if all(groups.values())}
assert both == {(TEMPLATES[2], 7), (TEMPLATES[0], 9)}  # the two kinds of strata the model answer names
print(f"same half, over the runs' held-out sentences: {movie_share:.0%} read 'the movie was not ...', "
      f"none 'i did not find ...'; strata with both groups: {sorted(both)}")


def signs(model):
    gaps = [r["gap"] for r in per_run[model]]
    return sum(g > 0 for g in gaps), sum(g < 0 for g in gaps)


positive, negative = signs("trained restricted")
assert positive >= needed_by_a_coin(positive + negative)  # more runs than a coin would give
assert within_strata("trained restricted")["gap"] > 0  # pooled: same half below different halves
positive, negative = signs("free, tested free")
assert max(positive, negative) < needed_by_a_coin(positive + negative)  # no gap the free model can't explain by chance
assert 6 <= within_strata("trained restricted")["sentences"] / len(runs) <= 24  # "about a dozen per run"
print("the model answer's statements about the strata hold")

# %% [markdown]
# ## Part 4 · What changed, and what it suggests
#
# Write a few sentences: what changed in the outputs, and what does this suggest about the role
# of attention heads? Back each claim with a number you measured above, and say which of your
# claims you would expect to hold for any seed, and which are about the model you trained.
#
# <!-- BEGIN ANSWER -->
# **Model answer.** *(Part 2's numbers come from untrained modules with seeded weights, the
# same on every machine. Part 3's come from the seed study's independent two-head runs, each
# with its own seed and its own sentences, counted in the cells above; your own models are one
# run each. What the restriction does to a freely trained model is counted over the runs in
# which that model had learned the task; what a model trained restricted does, over every run.
# "Near chance" means below 72.5%, closer to chance (50%) than to the 95% of a model that
# learned.)*
#
# *What changed in the outputs.* The restriction only takes options away: each head's softmax
# is renormalised over the half it may see. In the tiny example each head had put about half of
# its attention on the other half (0.46 for head 0, 0.48 for head 1), so both maps changed a lot,
# and so did every head's output: changes of 0.43 to 0.73, for head outputs of typical size
# 0.60, so as large as the outputs themselves. Head 0's output is now exactly a blend of
# first-half values: its weights on the second half are zero, and scrambling the second half's
# values leaves it unchanged while head 1's changes. The *final* output changed at every
# position (0.41 to 0.51, against a typical size of 0.84), because `W_o` mixes both heads into
# every output feature: restricting what one head sees is felt everywhere downstream.
#
# *What it cost the trained model.* Restricted at test time without retraining, the freely
# trained model breaks: in every run in which it had learned the task, at least one of the three
# groups fell below 95%, and one fell near chance, and the medians of both negated
# groups are near chance. The heads had learned to fetch specific words from anywhere; a head
# that can no longer reach its word delivers something the rest of the model was never trained
# to read. Retrained with the restriction, the model learns the sentences where "not" and the
# sentiment word lie in **different** halves (95% or more) in most runs, while the
# **same-half** sentences stay near chance in most runs, and the different-halves group beats
# the same-half group in most runs. Plain sentences are never near chance, and reach 95% in
# 20 of the 40 runs (their range is printed above).
#
# *The halves, or the template?* As measured, the two groups also differ by template: almost
# every same-half sentence reads "the movie was not …", and every "i did not find …" sentence
# falls in different halves. A template that is harder for the restricted model, for any
# reason, would pass for an effect of the halves. Compared only within strata, sentences of one
# run with the same template and the same length (two kinds of strata hold both groups: "not a
# good film in the end" beside "not a really good film to me", and "the long movie was not good
# in the end" beside "the movie was not really good in the end"), the gap remains: pooled over
# the runs, the same-half sentences are still below the different-halves ones, and the gap
# within the strata is positive in more runs than a fair coin would give more than 5% of the
# time. The freely trained model, tested freely, shows no gap within the strata that a coin
# would not give, as it should: nothing in it depends on the halves. So the restriction, not
# the template, is what makes the same-half sentences hard. Two limits: the strata are small
# (about a dozen sentences per run), and within a stratum the sentences still differ in their
# optional words (an adjective, an intensifier, the ending).
#
# *Why, perhaps.* In the same half, both words can reach `<cls>` only through one head, mixed
# into one weighted average, while words in different halves arrive through two heads, side by
# side, just as the negation head and the other head deliver them in most freely trained models
# that learned (chapter 07). That is a hypothesis: the study does not look inside the restricted model's heads.
#
# *One run would have misled.* Across the runs, the restricted model's same-half accuracy spans
# the whole range, near chance in most runs and 95% or more in some: trained with one seed, you
# could have concluded either way. Your own models are one dot each in the plots above.
#
# *What this suggests about heads.* Heads are separate channels: each computes its own weighted
# average over what it may see, and only `W_o` and the layers after it combine them. A relation
# between two words is easiest to use when each word can travel through its own head, and a
# head's view decides which relations it can carry at all. Trained heads are specialised to the
# view they were trained with (taking it away breaks them), but a model trained under the
# restriction finds another division of labour where the view allows one: the role of a head
# is learned, not fixed by the architecture.
# <!-- END ANSWER -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# That was the course's last exercise. Compare your results and your answer with
# `solutions/12_restricting_heads.ipynb`.
# -->
# <!-- BEGIN SOLUTION -->
# ## The end
#
# That was the course's last exercise.
# <!-- END SOLUTION -->
