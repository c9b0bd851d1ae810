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
# # Chapter 08 · Heads that compose
#
# In chapter 07 every head worked alone: the model had one layer, and each head read the
# embeddings and wrote to the classifier. Real transformers stack dozens of layers, and a head
# of a later layer reads what the heads before it wrote. This chapter shows the best-studied
# case of heads working **together**: the **induction head**, which continues a pattern it has
# seen earlier in the context (`... A B ... A` → `B`). No single layer can build one; two layers
# can, and we watch them learn it in well under a minute, then take the model apart to see *how*.
#
# **By the end of this chapter you will be able to**
#
# - build a task whose only learnable part is copying from earlier in the sequence, and say
#   which tokens are predictable and why the copy must move from one sequence to the next;
# - build an attention-only transformer from the course's `MultiHeadAttention` and train a
#   one-layer and a two-layer version side by side, and see a **phase change** in the loss;
# - define scores that say what a head does (previous-token, duplicate-token, induction) and
#   compare each with what uniform attention would score;
# - find by **ablation** which first-layer heads the second layer needs, and through which of
#   their inputs they read them: queries, keys or values (**Q-, K- and V-composition**);
# - measure the mechanism: split a head's output into its token, position and bias parts and
#   remove one part from one input, measure whether a head **copies** (its OV circuit), and read
#   composition off the **weights** (Elhage et al.'s composition scores), each against a baseline;
# - tell the textbook circuit from the one these models actually learn, and say which choice of
#   positions decides between them; judge all of it over many independent runs.
#
# *Sources.* Elhage et al., "A Mathematical Framework for Transformer Circuits" (Transformer
# Circuits Thread, 2021): attention-only transformers, the residual stream as a sum of head
# outputs, Q-, K- and V-composition, and induction heads; Olsson et al., "In-context Learning and
# Induction Heads" (2022): the phase change, its link to in-context learning, and induction heads
# defined by two halves, matching and copying; Wang et al., "Interpretability in the Wild: a
# Circuit for Indirect Object Identification in GPT-2 small" (2022): duplicate-token heads;
# Singh et al., "What needs to go right for an induction head? A mechanistic study of in-context
# learning circuits and their formation" (ICML 2024): an induction head taken apart into the
# sub-circuits that must each form, measured one at a time, as section 6 does here. Heads as
# detectives that each look for a different clue are from Priyesh Dave's post "Day 28:
# Multi-Head Attention" (DEV Community); here the clue one head finds is what another needs.
# Rotary positions are from Su et al., "RoFormer" (2021), built in chapter 06.

# %% [markdown]
# ## Set-up
#
# As in every chapter: pick the device (set `MHA_DEVICE=cpu` to force the CPU) and seed. The
# models here are small; like chapter 07's, they train fastest on one CPU thread.

# %%
import statistics

import matplotlib.pyplot as plt
import torch

from mha_lib import causal_mask, get_device, plot_attention, seed_everything
from mha_lib.induction import (
    PHASE_RECORDS,
    AttentionOnlyTransformer,
    losses,
    phase_change_step,
    repeated_segments,
    silence_heads,
    train_induction,
)
from mha_lib.induction.circuits import (
    PARTS,
    composition_scores,
    copying_eigenvalues,
    copying_score,
    head_parts,
    mean_ablate,
    ov_circuit,
    remove_parts,
)
from mha_lib.induction.findings import (
    STATED,
    STATED_HEADS,
    check_findings,
    copying_control,
    count_findings,
    count_head_findings,
    duplicate_heads,
    share_back,
    top_head,
)
from mha_lib.induction.plots import plot_curves, plot_scores
from mha_lib.induction.run import CONFIGS, baselines, eval_batch, measure
from mha_lib.induction.study import load_study, load_trained

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_num_threads(1)  # this notebook's choice: models this small train fastest on one thread
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. A task that only copying can solve
#
# Each sequence is 24 tokens drawn uniformly at random from a vocabulary of 64. Somewhere in it,
# a **segment** of 4 to 8 tokens appears twice: the second copy starts after the first one ends.
# Nothing about random tokens can be learned, except this: once the second copy has begun,
# every next token is the one that followed the same token in the first copy. Those tokens are
# **predictable**; no others are. `repeated_segments` draws a batch with tensor operations and a
# CPU generator, so the numbers are the same on every device:

# %%
task = CONFIGS["learned"]["task"]  # the set-up of the whole chapter (and of its seed study)
print(task)
batch = repeated_segments(4, task["seq_len"], task["vocab_size"], tuple(task["segment"]),
                          generator=torch.Generator().manual_seed(0))
print("tokens:", tuple(batch.tokens.shape), batch.tokens.dtype, " predictable:", tuple(batch.predictable.shape))
print("first copy starts at", batch.first.tolist(), " second at", batch.second.tolist(),
      " length", batch.length.tolist(), " offset", (batch.second - batch.first).tolist())

# %% [markdown]
# Here is the first sequence, with the first copy in `[ ]`, the second in `< >`, and a `*` on
# each predictable token:

# %%
row, (f, s, n) = 0, (batch.first[0].item(), batch.second[0].item(), batch.length[0].item())
cells = []
for t, token in enumerate(batch.tokens[row].tolist()):
    text = f"{token}" + ("*" if batch.predictable[row, t] else "")
    text = f"[{text}]" if f <= t < f + n else f"<{text}>" if s <= t < s + n else text
    cells.append(text)
print(" ".join(cells))
assert torch.equal(batch.tokens[row, f:f + n], batch.tokens[row, s:s + n])  # a real copy
assert batch.predictable[row].sum() == n - 1  # the copy's first token follows a random one: unpredictable

# %% [markdown]
# Tokens are drawn independently, so a token can also occur twice by chance, even inside the
# segment: above, `3` appears twice in each copy. At the second `<3>` there are then three
# earlier `3`s, and only one of them, the one at the same place in the first copy, is followed
# by the right token. Such tokens are harder to predict, and the scores below always name that
# one occurrence. Most tokens of the second copy have a single earlier twin.
#
# **What a model that cannot copy scores.** The tokens are uniform, so without copying the best
# prediction is 1/64 for every token: a cross-entropy loss of $\ln 64 \approx 4.16$ nats. A model
# that copies perfectly scores 0 on the predictable tokens. The loss on those tokens is the one
# number to watch, and half of $\ln 64$ (halfway from knowing nothing to copying perfectly) is
# the threshold. Training records that loss on one batch every 10 steps, and a single batch of
# 64 sequences can dip below the threshold by chance; so the **phase change** is the first of
# **5 records in a row** below it (50 steps): one noisy batch cannot make one. Both numbers, and
# the 5, are fixed before any model is trained:

# %%
base = baselines(CONFIGS["learned"])
print(f"no copying: ln 64 = {base['no_copy_loss']:.2f} nats;  phase change: {PHASE_RECORDS} records in a row "
      f"below {base['phase_threshold']:.2f}")

# %% [markdown]
# **Why the copy moves.** The offset between the two copies, `second - first`, differs from row
# to row (12, 8, 7 and 10 in the four rows above). If it were always, say, 10, one head
# attending 9 positions back would copy the next token by position alone. With a moving offset
# the model has to *find* the earlier occurrence of the current token by its content, and then
# read the token after it.

# %% [markdown]
# ## 2. An attention-only transformer
#
# The model of Elhage et al. keeps only what this chapter is about: token embeddings plus
# learned positions (chapter 06), then layers of the course's own `MultiHeadAttention` with a
# causal mask, each **adding** its output to a running vector per token, the **residual stream**:
# `x = x + attention(x)`. No feed-forward network and no layer norm, so everything a layer
# reads is a plain sum of what came before: the embeddings and every earlier head's output. A
# linear **unembedding** turns each position's final vector into 64 logits for the next token.

# %%
seed_everything(0)  # seed, then build: the starting weights come from the seed (the study does the same)
two = AttentionOnlyTransformer(task["vocab_size"], num_layers=2, max_len=task["seq_len"],
                               **CONFIGS["learned"]["model"]).to(device)
print(two)
print("parameters:", sum(p.numel() for p in two.parameters()))
logits, weights = two(batch.tokens.to(device), return_weights=True)
print("logits:", tuple(logits.shape), "(B, L, V): position t predicts token t + 1")
print("weights:", len(weights), "layers of", tuple(weights[0].shape), "(B, H, L, L)")

# %% [markdown]
# **The stream is a sum of heads.** A layer's output is `W_o` applied to its heads side by side,
# so it splits into one term per head: head `h`'s output times its own slice of `W_o` (plus the
# bias, which belongs to no head). `head_outputs` returns those terms, `(B, H, L, D)` per layer;
# they add up to the layer's output. This is what lets a later head *read* an earlier one, and
# what lets us *remove* one head from one place (section 5).

# %%
with torch.no_grad():
    x0 = two.embed(batch.tokens.to(device))  # (B, L, D)
    per_head = two.head_outputs(batch.tokens.to(device))[0]  # (B, H, L, D), layer 1
    layer_out = two.layers[0](x0, x0, x0, causal_mask(task["seq_len"], device=device))
print("layer 1's heads:", tuple(per_head.shape), "(B, H, L, D)")
assert torch.allclose(per_head.sum(1) + two.layers[0].W_o.bias, layer_out, atol=1e-5)
print("sum of the heads' terms + W_o's bias == the layer's output")

# %% [markdown]
# ## 3. One layer and two, side by side
#
# `train_induction` trains next-token prediction on every position, the usual language-model
# loss, with AdamW (learning rate 0.01) on fresh batches of 64 sequences, and records the loss
# on the predictable tokens every 10 steps. We train the two-layer model for 650 steps (the
# study below trains 800) and a one-layer model, built the same way, for 200 (it costs time
# and, as the study shows, never changes phase). The cells print timings and the digits of *your* run, which differ
# between machines (chapter 07 explains why), so the tests run them without comparing output.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings, and the digits of a training run, vary by machine)
training = {k: v for k, v in CONFIGS["learned"]["training"].items() if k != "steps"}
two_history = train_induction(two, steps=650, seed=0, segment=tuple(task["segment"]), **training)

# %%
# NBVAL_IGNORE_OUTPUT
seed_everything(0)
one = AttentionOnlyTransformer(task["vocab_size"], num_layers=1, max_len=task["seq_len"],
                               **CONFIGS["learned"]["model"]).to(device)
one_history = train_induction(one, steps=200, seed=0, segment=tuple(task["segment"]), **training)

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.4), layout="constrained")
ax.plot(two_history["step"], two_history["loss"], color="tab:blue", lw=2, label="2 layers (your run)")
ax.plot(one_history["step"], one_history["loss"], color="tab:orange", lw=2, label="1 layer (your run)")
ax.set_title("Your runs: the loss of 2 layers and of 1 layer while they train")
ax.axhline(base["no_copy_loss"], color="grey", ls=":", label="no copying, ln 64")
ax.axhline(base["phase_threshold"], color="black", ls="--", lw=0.8, label="phase change threshold")
ax.set_xlabel("training step")
ax.set_ylabel("loss on the predictable tokens")
ax.legend(fontsize=8)
plt.show()

two_phase = phase_change_step(two_history, base["phase_threshold"])
one_phase = phase_change_step(one_history, base["phase_threshold"])
assert one_phase is None  # held in every run of the study (below), and section 8 says why

# %% [markdown]
# Your two-layer loss most likely sits near $\ln 64$ for a few hundred steps, then **drops below
# the threshold** and settles near 1 nat: a phase change, the shape Olsson et al. found in models
# thousands of times larger. The one-layer loss creeps down a little and stays there. When the
# drop comes differs between seeds, and between machines for one seed (chapter 07 says why);
# the study below counts both.
#
# **One run is one sample.** The **seed study** (`mha_lib/induction/study.json`; `make study`
# re-runs it) trained both models from 24 seeds, each run with its own initialisation *and* its
# own data (seed `s` builds the model after `seed_everything(s)` and draws its batches from a
# generator seeded with `s`), for 800 steps, measured as in this chapter on its own held-out
# batch. Every run is drawn below; the counts come from the file, and the cells assert them.

# %%
study = load_study()
counts = count_findings(study)  # {finding: (k, n)}: it holds in k of the n runs it speaks to
learned = lambda n: (lambda r: r["config"] == "learned" and r["num_layers"] == n)  # noqa: E731
phases = [p for p in study.values(lambda r: r["phase_change"], where=learned(2)) if p is not None]

fig, ax = plt.subplots(figsize=(7.5, 3.4), layout="constrained")
plot_curves(ax, study, "learned", 2, colour="tab:blue")
plot_curves(ax, study, "learned", 1, colour="tab:orange")
ax.set_title("The seed study: every run of 2 layers (blue) and of 1 layer (orange)")
ax.axhline(base["no_copy_loss"], color="grey", ls=":")
ax.axhline(base["phase_threshold"], color="black", ls="--", lw=0.8)
ax.set_xlabel("training step")
ax.set_ylabel("loss on the predictable tokens")
ax.legend(fontsize=8)
plt.show()

k, n = counts["two layers change phase"]
print(f"two layers: changed phase in {k} of {n} runs, at step {statistics.median(phases):.0f} (median; "
      f"the {k} runs from {min(phases)} to {max(phases)})")
k1, n1 = counts["one layer never changes phase"]
print(f"one layer: changed phase in {n1 - k1} of {n1} runs")
held = counts["two layers: a phase change is a held-out loss below the threshold"]
print(f"two-layer runs whose held-out loss is below the threshold exactly when they changed phase: "
      f"{held[0]} of {held[1]}")
assert (k, n) == (19, 24) and counts["one layer never changes phase"] == (24, 24)
assert (statistics.median(phases), min(phases), max(phases)) == (530, 450, 740)
assert held == STATED["two layers: a phase change is a held-out loss below the threshold"]

# %%
# NBVAL_IGNORE_OUTPUT
# (your run)
where = (f"changed phase at step {two_phase}" if two_phase is not None
         else "stayed on the plateau for all 650 steps")
print(f"your two-layer run {where}; your one-layer run did not change phase")

# %% [markdown]
# Two layers changed phase in **19 of the 24 runs**, at step 530 in the middle run; the earliest
# of the 19 at step 450, the latest at 740. That is the range of these 19 runs, not a bound:
# another seed can fall outside it. The other 5 were still on the plateau at step 800, at the
# one-layer level. **No one-layer run changed phase.** The criterion agrees with the held-out
# batch, which no run trained on: in 34 of the 34 two-layer runs (rotary ones included,
# section 7) the final held-out loss is below the threshold exactly when the run changed phase.
# So the drop is what two layers usually do, and when it comes differs by hundreds of steps from
# one run to the next; a single curve would have told neither.
#
# ## 4. What the heads look at
#
# To take a trained model apart on the same footing everywhere, the rest of the chapter uses
# the study's run of seed 0 (it changed phase at step 510), trained once and shipped with the
# course (`mha_lib/induction/model_seed0.pt`; `python -m mha_lib.induction model` rewrites it):
# the same weights on every machine, whatever path your own run took. Here are its attention
# maps on one held-out sequence. Rows are queries, columns keys; the labels are the tokens, with
# the first copy in `[ ]` and the second in `< >`.
#
# *Numbering.* The text counts layers from 1 (layer 1 reads the embeddings) and heads from 0, as
# the plots and printouts do; in code, layers are indices from 0 (`maps[0]` is layer 1).

# %%
model = load_trained(device=device)  # the study's two-layer run of seed 0, in evaluation mode
held_out = eval_batch(0)  # its held-out batch: 512 sequences it never trained on
with torch.no_grad():
    _, maps = model(held_out.tokens.to(device), return_weights=True)
r = 0
f, s, n = held_out.first[r].item(), held_out.second[r].item(), held_out.length[r].item()
labels = [f"[{tok}]" if f <= t < f + n else f"<{tok}>" if s <= t < s + n else str(tok)
          for t, tok in enumerate(held_out.tokens[r].tolist())]
for layer in range(2):
    fig = plot_attention(maps[layer][r], labels, title=f"layer {layer + 1}", panel_size=3.0, annotate=False)
    plt.show()

# %% [markdown]
# In layer 2 the rows of the second copy light up one diagonal: the query at `<A>` looks at the
# key right after `[A]`, the token that came next last time. In layer 1, heads 1 and 2 look
# from `<A>` at the earlier `[A]` itself; elsewhere head 1 looks mostly at its own position,
# while heads 0 and 3 spread their weight over the past. To say this for every head and every
# sequence, not one picture, we use scores **fixed in advance** (in `scores.py`), with
# thresholds from baselines alone, each a mean
# attention weight on one chosen key, and put each next to what a head attending **uniformly**
# to the past would score:
#
# - **previous-token**: query `t` → key `t − 1`, over every `t ≥ 1`;
# - **duplicate-token**: in the second copy, query `<A>` → the earlier `[A]`;
# - **induction**: in the second copy, query `<A>` → the key right after the earlier `[A]`.
#
# The last two use the queries `second` to `second + n − 2` of each sequence, the second copy
# except its last token (whose successor is not in the first copy). A uniform head at query `t`
# gives each of its `t + 1` keys weight `1/(t + 1)`, so its score is the mean of `1/(t + 1)`
# over the scored queries; as the second copy sits late in the sequence, that is smaller for
# the induction score than for the previous-token score.
#
# A head "has" a role when its score is at least halfway from uniform attention to a head that
# puts all its weight on that key. These thresholds come from the baselines alone:

# %%
print(f"uniform attention: previous-token {base['uniform_previous_token']:.3f}, "
      f"induction (and duplicate-token) {base['uniform_induction']:.3f}")
print(f"thresholds: previous-token head >= {base['previous_token_head']:.3f}, "
      f"induction pattern or duplicate-token head >= {base['induction_head']:.3f}")

measured = measure(model, held_out, mechanism=False)  # scores, losses, ablations: as the study measured them
changed = lambda r: learned(2)(r) and r["phase_change"] is not None  # noqa: E731
fig, axes = plt.subplots(1, 3, figsize=(10, 2.8), layout="constrained", sharey=True)
for ax, (key, name, u, thr) in zip(axes, [
        ("previous_token", "previous-token", base["uniform_previous_token"], base["previous_token_head"]),
        ("duplicate", "duplicate-token", base["uniform_induction"], base["induction_head"]),
        ("induction", "induction", base["uniform_induction"], base["induction_head"])]):
    plot_scores(ax, [layer[key] for layer in measured["scores"]], u, thr, title=f"{name} score",
                study_scores=study.values(lambda r: [s for layer in r["scores"] for s in layer[key]], where=changed))
axes[0].legend(fontsize=7, loc="upper left")
axes[0].set_ylabel("mean weight on the chosen key")
plt.show()

# %% [markdown]
# The bars are the shipped model's heads (layer 1 blue, layer 2 orange), the dots every run of
# the study that changed phase. Which head takes which role differs from seed to seed, so the
# dots above one bar are not one role: read them as the spread over runs. The counts:

# %%
for name in ("learned: all four layer-2 heads have the induction pattern", "learned: no previous-token head in layer 1",
             "learned: a duplicate-token head in layer 1", "untrained: no head has a role"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
assert counts["learned: all four layer-2 heads have the induction pattern"] == (19, 19)
assert counts["learned: no previous-token head in layer 1"] == (24, 24)
assert counts["learned: a duplicate-token head in layer 1"] == (19, 19)
assert counts["untrained: no head has a role"] == (58, 58)
layer_1_previous = study.values(lambda r: max(r["scores"][0]["previous_token"]), where=learned(2))
print(f"layer 1's best previous-token score: at most {max(layer_1_previous):.3f} in any run "
      f"(uniform attention: {base['uniform_previous_token']:.3f})")
assert max(layer_1_previous) < base["uniform_previous_token"]  # below uniform, in every run
seed_0 = next(r for r in study.runs if learned(2)(r) and r["seed"] == 0)  # the shipped model's run
shipped = seed_0 | measured  # what this cell measured, and the study's other records of the run (section 6 redoes some)
atypical = {"learned: one duplicate-token head only",  # seed 0 has two (section 5)
            "learned: all four layer-2 heads copy beyond the one-layer control",  # three of its four do (section 6)
            "learned: all four layer-2 heads are induction heads"}
assert {name for name, holds in check_findings(shipped).items() if not holds} == atypical  # one of those runs

# %% [markdown]
# In every run that changed phase, **all four heads of layer 2 have the induction pattern**:
# they attend from `<A>` to the token after the earlier `[A]`. Two names, used the same way to
# the end of the chapter: a head with an induction score over its threshold has the **induction
# pattern**, the attention half; it is an **induction head** only when it also *copies* the token
# it attends to, the half section 6 measures. The
# textbook circuit (Elhage et al.) puts a **previous-token head** in layer 1, which writes "the
# token before me was A" at each position, and layer 2's keys read it (section 7 shows how).
# **No run has one** (every layer-1 head scores *below* uniform attention there). What layer 1
# has instead, in every run that changed phase, is a **duplicate-token head** (Wang et al.'s
# name for the heads they found doing this in GPT-2 small): from `<A>` it attends to the earlier
# `[A]`. None of this is there before training: no head of any untrained model reaches a
# threshold.
#
# ## 5. Which heads does layer 2 need?
#
# Scores say where a head looks, not whether the model needs it. **Ablation** does: silence one
# head (`silence_heads`, chapter 07) and measure the loss on the predictable tokens.

# %%
# NBVAL_IGNORE_OUTPUT
# (a model's losses may differ in the last digit between machines)
print(f"intact: {measured['loss']['predictable']:.2f} nats on the predictable tokens")
for layer, row in enumerate(measured["ablation"]):
    print(f"layer {layer + 1}, each head silenced in turn: " + "  ".join(f"h{h} {x:.2f}" for h, x in enumerate(row)))
# the numbers the next sentences quote, to within what a machine's last digits can move
assert abs(measured["loss"]["predictable"] - 0.92) < 0.01 and abs(measured["ablation"][0][1] - 2.98) < 0.01
assert abs(max(measured["ablation"][1]) - 1.58) < 0.01 and max(measured["ablation"][1]) < measured["ablation"][0][1]
duplicate = measured["scores"][0]["duplicate"]  # layer 1's duplicate-token scores, head by head
assert abs(duplicate[1] - 0.91) < 0.01 and abs(duplicate[2] - 0.81) < 0.01

# %% [markdown]
# Silencing the stronger duplicate-token head (layer 1, head 1) takes the loss from 0.92 to
# 2.98 nats, two thirds of the way back to $\ln 64$. Any one head of layer 2 can go at a cost
# (to at most 1.58 nats): the other three do the same job. Why does silencing head 1 not take the
# loss all the way back? Head 2 is a weaker duplicate-token head (its score is 0.81, against
# 0.91). Silence both, and the model copies no better than the one-layer models of the study,
# which cannot copy the repeated segment:

# %%
# NBVAL_IGNORE_OUTPUT
# (a model's losses may differ in the last digit between machines)
with torch.no_grad(), silence_heads(model.layers[0], [1, 2]):  # layer 1's heads 1 and 2 together
    both = losses(model(held_out.tokens.to(device)), held_out.to(device))[1].item()
one_layer_losses = study.values(lambda r: r["loss"]["predictable"], where=learned(1))
print(f"layer 1, heads 1 and 2 silenced together: {both:.2f} nats (one layer: {min(one_layer_losses):.2f} to "
      f"{max(one_layer_losses):.2f}; ln 64 = {base['no_copy_loss']:.2f})")
assert both > max(one_layer_losses)  # no better than a model that cannot copy

# %% [markdown]
# Head 2 stands in for part of head 1's job; together they are what layer 2's heads need.
#
# **Seed 0 is not a typical run.** Two duplicate-token heads, as here, are the exception: count
# the layer-1 heads that reach the duplicate-token threshold in every run that changed phase.
# Where there is only one, silencing it takes the loss much further back towards $\ln 64$. The
# share of the way back is `(silenced − intact) / (ln 64 − intact)`: 0 if nothing changes, 1 if
# the model copies no better than chance. Here is seed 0 next to the typical run, the one in
# the middle of the runs with a single duplicate-token head (all numbers from the study file):

# %%
changed_runs = study.values(lambda r: r, where=lambda r: learned(2)(r) and r["phase_change"] is not None)
single = sorted((r for r in changed_runs if len(duplicate_heads(r)) == 1), key=share_back)
typical = single[len(single) // 2]  # the median run of those with a single duplicate-token head
k_single, n_changed = counts["learned: one duplicate-token head only"]
print(f"one duplicate-token head in layer 1: {k_single} of {n_changed} runs; two: {n_changed - k_single}")
print(f"silencing the duplicate-token head, share of the way back to ln 64: seed 0 {share_back(seed_0):.0%}; "
      f"the {len(single)} runs with one such head {share_back(single[0]):.0%} to {share_back(single[-1]):.0%}")
fig, axes = plt.subplots(1, 2, figsize=(9, 2.8), layout="constrained", sharey=True)
for ax, run in zip(axes, (seed_0, typical)):
    dup_heads = duplicate_heads(run)
    bars = run["ablation"][0] + run["ablation"][1]  # layer 1's heads, then layer 2's
    ax.bar(range(8), bars, color=["tab:red" if i in dup_heads else "tab:blue" if i < 4 else "tab:orange"
                                  for i in range(8)])
    ax.axhline(run["loss"]["predictable"], color="green", lw=1, label="intact")
    ax.axhline(base["phase_threshold"], color="black", ls="--", lw=0.8, label="phase-change threshold")
    ax.axhline(base["no_copy_loss"], color="grey", ls=":", label="no copying, ln 64")
    ax.set_xticks(range(8), [f"L{i // 4 + 1}.h{i % 4}" for i in range(8)], fontsize=8)
    ax.set_title(f"seed {run['seed']}: {len(dup_heads)} duplicate-token head{'s' * (len(dup_heads) > 1)} (red)",
                 fontsize=10)
axes[0].set_ylabel("loss, one head silenced")
axes[1].legend(fontsize=7, loc="center right")
plt.show()
assert (k_single, n_changed) == STATED["learned: one duplicate-token head only"] and len(duplicate_heads(seed_0)) == 2
assert share_back(seed_0) < share_back(single[0])  # seed 0's silenced head is needed less than in any single-head run

# %% [markdown]
# In 15 of the 19 runs one duplicate-token head does the job alone, and silencing it
# takes the loss 90 % to 93 % of the way back to $\ln 64$; seed 0 is one of the
# 4 with two, and its 64 % is below all of them. Everything below holds in seed 0 *and* is
# counted over all 19 runs, so the choice of seed changes the picture of one head's weight, not
# the mechanism.
#
# **Through which input?** A layer-2 head reads the stream three times: for its queries, its
# keys and its values. Because the stream is a sum, we can subtract one layer-1 head's term
# from **one** of those inputs only and leave everything else as it was:
# `model(tokens, remove_from={"k": [(0, h)]})` removes layer 1's head `h` from layer 2's keys.
# If the loss rises, layer 2 *reads* that head through its keys; if it rises back above half of
# $\ln 64$, layer 2 *needs* it there. The study counts the second: **K-composition** (and
# likewise **Q-** and **V-composition**, Elhage et al.). Each line also gives the highest
# induction score left among layer 2's heads.

# %%
# NBVAL_IGNORE_OUTPUT
for which, name in (("q", "queries"), ("k", "keys"), ("v", "values")):
    parts = measured["composition"][which]
    print(f"removed from layer 2's {name:7s}: loss " + "  ".join(f"h{h} {x:.2f}" for h, x in enumerate(parts["loss"]))
          + "   best layer-2 induction score " + " ".join(f"{x:.2f}" for x in parts["best_induction"]))

# %%
for name in ("learned: layer 2 needs it in its queries", "learned: no layer-1 head is needed in the keys",
             "learned: no layer-1 head is needed in the values"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs that changed phase")
assert counts["learned: layer 2 needs it in its queries"] == (19, 19)
assert counts["learned: no layer-1 head is needed in the keys"] == (19, 19)
assert counts["learned: no layer-1 head is needed in the values"] == (19, 19)

# %% [markdown]
# Removed from layer 2's **queries** alone, the duplicate-token head takes the loss back above
# half of $\ln 64$, in every run that changed phase; removed from the **keys**, no layer-1 head
# does, in any of them, nor from the **values**. In this chapter that is what **Q-composition**
# means, as measured: layer 2 *needs* a layer-1 head in its query input, in that removing the
# head from that input alone takes the loss back above the threshold (and likewise K- and
# V-composition). These models compose through the **queries**, not through the keys of the
# textbook circuit. Section 6 reads composition from the weights too, input by input.
#
# A reading of how that works, which the next two sections put to a test: at `<A>`, the
# duplicate-token head copies into the stream what sat at the earlier `[A]`, and that includes
# its **learned position vector**. A layer-2 head's query can then ask for "the position
# right after that one", and every key carries its own position. That is a pointer to a
# position, and it needs positions *in the residual stream*.
#
# ## 6. The mechanism, measured
#
# The pointer reading makes claims we can measure: what layer 2's queries need from the
# duplicate-token head is its **position**, not its token; layer 2's heads **copy** the token
# they attend to; and the **weights** of the two layers compose through the queries.
#
# **A head's output in three parts.** Layer 1 reads the embeddings, $x_j = E[t_j] + P_j$ (token
# plus position). Head $h$ at query $i$ writes
# $\sum_j A_{ij}\,(E[t_j] + P_j)\,W_v^h W_o^h + b_v^h W_o^h$ (the rows of $A$ sum to 1), so its
# output is the sum of a **token part**, a **position part** and a **bias part**. `head_parts`
# returns the three, each `(B, H, L, D)`; they add up to what `head_outputs` gives (W_o's own
# bias belongs to no head):

# %%
tokens = held_out.tokens.to(device)  # (512, 24)
with torch.no_grad():
    split = head_parts(model, tokens)  # {part: (B, H, L, D)}
    whole = model.head_outputs(tokens)[0]  # (B, H, L, D), layer 1
print({part: tuple(x.shape) for part, x in split.items()})
assert torch.allclose(split["token"] + split["position"] + split["bias"], whole, atol=1e-4)
print("token + position + bias == each head's output")

# %% [markdown]
# `remove_parts(model, tokens, {"q": [(1, "position")]})` subtracts the position part of layer
# 1's head 1 from layer 2's **query** input only, as `remove_from` does with a whole head
# (removing all three parts is `remove_from`; `tests/test_induction_circuits.py` checks it).
# Each part of the duplicate-token head, removed from the queries in turn, and, for comparison,
# all four layer-1 heads removed whole from the keys and from the values at once:

# %%
# NBVAL_IGNORE_OUTPUT
# (a model's losses may differ in the last digit between machines)
dup = top_head(seed_0, 0, "duplicate")  # layer 1's strongest duplicate-token head: head 1
intact_loss = measured["loss"]["predictable"]


def loss_without(**remove):
    with torch.no_grad():
        return losses(remove_parts(model, tokens, remove), held_out.to(device))[1].item()


from_q = {part: loss_without(q=[(dup, part)]) for part in PARTS}  # e.g. q=[(1, "position")]
every = {which: measured["composition"][which]["all"] for which in "kv"}  # all four heads, whole
print(f"intact: {intact_loss:.2f} nats")
print(f"head {dup}'s part removed from layer 2's queries: " + "  ".join(f"{p} {x:.2f}" for p, x in from_q.items()))
print(f"all four layer-1 heads removed from the keys: {every['k']:.2f}, from the values: {every['v']:.2f}")
assert abs(from_q["position"] - 2.62) < 0.02 and abs(from_q["token"] - 0.99) < 0.02
assert max(from_q["token"], from_q["bias"], *every.values()) < base["phase_threshold"]

# %% [markdown]
# Only one removal takes the loss back above the threshold: the **position part** of the
# duplicate-token head, from the **queries** (0.92 to 2.62 nats). Its token part costs 0.07
# nats, its bias nothing; and layer 2 can do without all four layer-1 heads in its keys (1.01)
# or in its values (0.82, lower than intact). What layer 2's queries read from this head is
# *where* the earlier `[A]` sits.
#
# Removing a head replaces its output by zero, a value it never takes. **Mean-ablation**
# replaces it by its mean over the batch at each position instead, which keeps what it writes
# on average and removes only what depends on the sequence (`mean_ablate`):

# %%
# NBVAL_IGNORE_OUTPUT
# (a model's losses may differ in the last digit between machines)
with torch.no_grad():
    mean_q = losses(mean_ablate(model, tokens, {"q": [dup]}), held_out.to(device))[1].item()
zero_q = measured["composition"]["q"]["loss"][dup]
print(f"head {dup} in layer 2's queries: removed (zero) {zero_q:.2f} nats, mean-ablated {mean_q:.2f}")
assert abs(zero_q - 2.86) < 0.02 and abs(mean_q - 2.58) < 0.02

# %% [markdown]
# The two agree: the queries need what this head writes *for this sequence*. Over every run of
# the study that changed phase, the same removals of its duplicate-token head (the dots; the
# green band spans the runs' intact losses):

# %%
kinds = [("position from q", lambda r: r["parts"]["q"]["position"][top_head(r, 0, "duplicate")]),
         ("token from q", lambda r: r["parts"]["q"]["token"][top_head(r, 0, "duplicate")]),
         ("bias from q", lambda r: r["parts"]["q"]["bias"][top_head(r, 0, "duplicate")]),
         ("whole, mean, q", lambda r: r["mean_ablation"]["q"][top_head(r, 0, "duplicate")]),
         ("whole, zero, q", lambda r: r["composition"]["q"]["loss"][top_head(r, 0, "duplicate")]),
         ("all 4 heads from k", lambda r: r["composition"]["k"]["all"]),
         ("all 4 heads from v", lambda r: r["composition"]["v"]["all"])]
fig, ax = plt.subplots(figsize=(8.5, 3.2), layout="constrained")
for x, (label, fn) in enumerate(kinds):
    values = [fn(r) for r in changed_runs]
    ax.scatter([x] * len(values), values, s=12, color="tab:red" if x < 5 else "tab:purple", alpha=0.6)
intact_losses = [r["loss"]["predictable"] for r in changed_runs]
ax.axhspan(min(intact_losses), max(intact_losses), color="green", alpha=0.2, label="intact")
ax.axhline(base["phase_threshold"], color="black", ls="--", lw=0.8, label="phase-change threshold")
ax.axhline(base["no_copy_loss"], color="grey", ls=":", label="no copying, ln 64")
ax.set_xticks(range(len(kinds)), [label for label, _ in kinds], fontsize=8)
ax.set_ylabel("held-out loss")
ax.set_title(f"What layer 2 needs, over the {len(changed_runs)} runs that changed phase", fontsize=10)
ax.legend(fontsize=7, loc="upper right")
plt.show()
for name in ("learned: the position part is needed in the queries", "learned: the token part is not needed in the queries",
             "learned: the bias part is not needed in the queries", "learned: mean-ablated in the queries, it is needed too",
             "learned: all four layer-1 heads at once are not needed in the keys",
             "learned: all four layer-1 heads at once are not needed in the values"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
    assert counts[name] == STATED[name]

# %% [markdown]
# Over the runs, the pointer reading holds: in 19 of the 19 runs removing the position
# part of the duplicate-token head from the queries takes the loss back above the threshold
# (2.51 to 3.94 nats, from an intact 0.86 to 1.33); its token part is needed in
# none (0.89 to 1.42), nor its bias; mean-ablation agrees with removal in 19 of 19;
# and no run needs all four layer-1 heads in its keys (19 of 19 do without) or its values
# (19 of 19).
#
# **Copying.** The second half of an induction head: it **copies** the token it attends to,
# raising that token's logit. That is in the head's **OV circuit**: follow a token's embedding
# through the head's values and output and the unembedding, $W_U\,W_o^h W_v^h\,E[b]$, and you
# get what the head adds to every logit when it attends fully to token $b$. For all 64 tokens
# that is a `(V, V)` matrix, one column per token attended to (Elhage et al.):

# %%
circuit = ov_circuit(model, 1, 1).detach().cpu()  # (V, V): layer 2, head 1
print("OV circuit of layer 2's head 1:", tuple(circuit.shape), "(logit, token attended to)")
fig, ax = plt.subplots(figsize=(3.6, 3.4), layout="constrained")
ax.imshow(circuit, cmap="RdBu_r", vmin=-circuit.abs().max(), vmax=circuit.abs().max())
ax.set_xlabel("token attended to")
ax.set_ylabel("logit it raises")
ax.set_title("layer 2, head 1: its OV circuit", fontsize=10)
plt.show()

# %% [markdown]
# Two measures read copying off this matrix, and they ask different questions:
#
# - the **copying score** (`copying_score`): the share of the 64 tokens whose own logit is the
#   one the head raises *most* when it attends to them, the largest entry of the column on the
#   diagonal. Random weights score about $1/64$.
# - the **eigenvalue measure** (`copying_eigenvalues`, Elhage et al.): $\sum_k \lambda_k /
#   \sum_k |\lambda_k|$ over the matrix's eigenvalues, between −1 and 1, about 0 for random
#   weights. The sum of the eigenvalues is the sum of the diagonal, so the measure is high when
#   attending to a token raises that token's own logit, on the whole, whatever it does to the
#   other 63; the copying score asks, token by token, for more than any other logit.
#
# **Which baseline?** Random weights are the obvious one, with the chapter's rule for every role:
# a head copies when it scores at least halfway from the baseline to 1. But training alone
# teaches heads some copying: a token already in the context is likelier than one that is not,
# and even the one-layer models learn that (section 8). Their 96 heads, trained on the same
# task in the same way, cannot have the induction pattern; as a **control** they are the
# stronger baseline: halfway from their mean copying score to 1. The line is read from the
# one-layer runs only. Every head of the study that changed phase, counted against each line:

# %%
control = copying_control()  # from the 24 one-layer runs' 96 heads
lines = {"copies beyond random weights": f"copying score >= {base['copying_head']:.3f} (random: 1/64)",
         "copies beyond the one-layer control": f"copying score >= {control['threshold']:.3f} "
                                                f"(control: mean {control['mean']:.3f})",
         "copies by the eigenvalue measure": f"eigenvalue measure >= {base['copying_eigen_head']:.3f} (random: 0)",
         "induction pattern": f"induction score >= {base['induction_head']:.3f} (section 4)",
         "induction head": "induction pattern and copying beyond the control"}
groups = ("learned, layer 2", "learned, layer 1", "rotary, layer 2", "rotary, layer 1")
head_counts = count_head_findings(study)  # {finding: (k, n)} over heads, not runs
print(f"{'heads (two layers: the runs that changed phase)':58}" + "".join(f"{g:>18}" for g in groups) + f"{'one layer':>12}")
for what, line in lines.items():
    row = [head_counts[f"{g}: {what}"] for g in groups]
    one_layer = head_counts.get(f"one layer: {what}")
    print(f"{line:58}" + "".join(f"{k:>12} of {n:>2}" for k, n in row)
          + (f"{one_layer[0]:>6} of {one_layer[1]}" if one_layer else ""))
assert head_counts == STATED_HEADS
assert (round(control["mean"], 3), round(control["max"], 3), round(control["threshold"], 3)) == (0.252, 0.344, 0.626)
for name in ("learned: all four layer-2 heads are induction heads", "rotary: all four layer-2 heads are induction heads",
             "untrained: no head copies, by either measure"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
    assert counts[name] == STATED[name]

# %% [markdown]
# The eigenvalue measure passes nearly every trained head: all 96 of the control, 70 of the 76
# layer-1 heads with learned positions, every layer-2 head. It says that training made the
# heads' circuits raise the tokens they read, not which heads copy more than that. The copying
# score against random weights passes 23 of those 76 layer-1 heads, although none has the
# induction pattern; against the control, 2 of them, and 50 of the 76 layer-2 heads. No head of
# any untrained model copies by either measure (58 of 58 runs). So, from here on, as in Olsson et al.'s two halves,
# "prefix matching" and copying:
#
# - a head has the **induction pattern** when its induction score reaches its threshold;
# - it **copies** when its copying score reaches the control's line, 0.626;
# - it is an **induction head** when it does both.
#
# With learned positions, 50 of the 76 layer-2 heads are induction heads, all four of a run's
# in 7 of the 19 runs; no layer-1 head is one. The rotary runs of section 7 are where the two
# measures part: 36 of their 40 layer-2 heads have the induction pattern and, by the eigenvalue
# measure, all 40 copy, but by the copying score none does, against either baseline. By this
# chapter's definition no rotary head is an induction head, although those models predict the
# copy well (section 7); how their heads share the copying out, this chapter does not measure.
# Which of the shipped model's layer-1 heads copy, and does the one that layer 2 needs? Exercise
# 8.5 lets you measure it. The shipped model's layer-2 heads, measured on your machine:

# %%
# NBVAL_IGNORE_OUTPUT
# (a near tie between two logits may fall the other way on another machine)
copy = [copying_score(model, 1, h) for h in range(4)]  # layer 2 (layer 1's heads: exercise 8.5)
eigen = [copying_eigenvalues(model, 1, h) for h in range(4)]
print("layer 2, copying score per head:     " + "  ".join(f"h{h} {x:.2f}" for h, x in enumerate(copy)))
print("layer 2, eigenvalue measure per head: " + "  ".join(f"h{h} {x:.2f}" for h, x in enumerate(eigen)))
print("the study's record of this run:      ", seed_0["copying"]["score"][1], seed_0["copying"]["eigen"][1])
assert max(abs(a - b) for a, b in zip(copy, seed_0["copying"]["score"][1])) < 0.05  # within 3 of 64 tokens
assert min(eigen) > 0.98 and min(copy) >= base["copying_head"]
assert [x >= control["threshold"] for x in seed_0["copying"]["score"][1]] == [False, True, True, True]

# %% [markdown]
# In the study's record of seed 0, three of the four layer-2 heads copy against the control
# (0.69 to 0.70) and are induction heads; head 0 (0.61) has the induction pattern and copies
# against random weights only.
#
# **Composition from the weights.** Removing a head tests what the model *needs*. Elhage et al.
# also read composition off the weights alone. A layer-2 head scores a query $x_q$ against a
# key $x_k$ as $x_q^\top W_{QK} x_k$, with $W_{QK} = W_Q^{\top} W_K$ `(D, D)`; a layer-1 head
# writes $W_{OV} x$, with $W_{OV} = W_O W_V$ `(D, D)`. If layer 1's output enters the query,
# the score reads $W_{QK}^{\top} W_{OV}$; the **Q-composition score** is how much of the two
# matrices survives the product,
# $\lVert W_{QK}^{h_2 \top} W_{OV}^{h_1}\rVert_F / (\lVert W_{QK}^{h_2}\rVert_F \lVert W_{OV}^{h_1}\rVert_F)$;
# the K-score uses $W_{QK}^{h_2} W_{OV}^{h_1}$, the V-score $W_{OV}^{h_2} W_{OV}^{h_1}$. The
# baseline is random matrices of the same shapes (1,000 draws): their mean, and their 99th
# percentile as the line above which a score is "high":

# %%
with torch.no_grad():
    comp = {name: x.cpu() for name, x in composition_scores(model).items()}  # each (4, 4): [layer-1 head, layer-2 head]
print(f"random heads: mean {base['random_composition']:.3f}, 99th percentile {base['random_composition_p99']:.3f}")
fig, axes = plt.subplots(1, 3, figsize=(10, 2.8), layout="constrained", sharey=True)
for ax, (name, scores) in zip(axes, comp.items()):
    for h1 in range(4):
        ax.scatter([h1] * 4, scores[h1], s=18, color="tab:red" if h1 == dup else "tab:blue")
    ax.axhline(base["random_composition"], color="grey", ls=":", label="random: mean")
    ax.axhline(base["random_composition_p99"], color="black", ls="--", lw=0.8, label="random: 99th percentile")
    ax.set_xticks(range(4), [f"L1.h{h}" for h in range(4)], fontsize=8)
    ax.set_title(f"{name.upper()}-composition with the 4 layer-2 heads", fontsize=10)
axes[0].set_ylabel("composition score")
axes[0].legend(fontsize=7)
plt.show()
print("Q-composition, head", dup, "with each layer-2 head:", [round(x, 2) for x in comp["q"][dup].tolist()])
assert comp["q"][dup].min() > base["random_composition_p99"] > comp["k"].max()
for name in ("learned: high Q-composition of the duplicate-token head with every layer-2 head",
             "learned: the layer-1 heads with high Q-composition are the duplicate-token heads",
             "learned: a second duplicate-token head is not needed in the queries",
             "learned: no high K-composition score", "learned: a high V-composition score",
             "learned: no duplicate-token head has a high V-composition score",
             "learned: all four layer-1 heads removed from the values lower the loss"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
    assert counts[name] == STATED[name]
second = [r["composition"]["q"]["loss"][h] for r in changed_runs for h in duplicate_heads(r)
          if h != top_head(r, 0, "duplicate")]  # the weaker duplicate-token head, removed from the queries
print(f"the weaker duplicate-token head removed from the queries: {min(second):.2f} to {max(second):.2f} nats")
assert (round(min(second), 2), round(max(second), 2)) == (1.10, 1.45)

# %% [markdown]
# In the shipped model the duplicate-token head's Q-composition score with each layer-2 head
# is about twice what random heads score. Input by input, over the 19 runs, the weights and the
# removals of section 5:
#
# - **Q, they agree.** In 19 of the 19 runs the layer-1 heads with a high Q-composition score
#   with every layer-2 head are exactly the duplicate-token heads, and the strongest is needed
#   in the queries (19 of 19). In the 4 runs with two, the weaker one composes as strongly by
#   its weights, but removed from the queries it takes the loss only to 1.10 to 1.45 nats
#   (4 of 4 below the threshold): read, not needed.
# - **K, they agree.** No K-composition score is high (19 of 19), and no layer-1 head is
#   needed in the keys (19 of 19).
# - **V, they do not.** 15 of the 19 runs have a high V-composition score, never on a
#   duplicate-token head (19 of 19); yet no layer-1 head is needed in the values (19 of 19),
#   and removing all four from the values *lowers* the loss (19 of 19).
#
# Weights need no data: a high score says a path *could* carry something, a removal whether
# the model needs what it does carry. For the values they part.
#
# ## 7. The textbook circuit: take the positions out of the stream
#
# Chapter 06's **rotary positions** add nothing to the stream: they rotate each head's queries
# and keys inside the head, so a head still knows how far apart two tokens are, but no token's
# vector says where it sits. If the reading above is right, the pointer route is closed, and a
# model is expected to mark each position with the token *before* it instead: a previous-token
# head in layer 1, read by layer 2's **keys**. The study trained the same two-layer model with
# `positions="rotary"` from 10 seeds, for 2,400 steps (too long for this notebook):

# %%
rotary = lambda r: r["config"] == "rotary"  # noqa: E731
rotary_phases = [p for p in study.values(lambda r: r["phase_change"], where=rotary) if p is not None]
fig, ax = plt.subplots(figsize=(7.5, 3.4), layout="constrained")
plot_curves(ax, study, "rotary", 2, colour="tab:green", label="2 layers, rotary positions")
plot_curves(ax, study, "learned", 2, colour="tab:blue", label="2 layers, learned positions")
ax.set_title("The seed study: 2 layers with rotary and with learned positions")
ax.axhline(base["no_copy_loss"], color="grey", ls=":")
ax.axhline(base["phase_threshold"], color="black", ls="--", lw=0.8)
ax.set_xlabel("training step")
ax.set_ylabel("loss on the predictable tokens")
ax.legend(fontsize=8)
plt.show()
k, n = counts["rotary: two layers change phase"]
print(f"rotary: changed phase in {k} of {n} runs, at step {statistics.median(rotary_phases):.0f} (median; "
      f"the {k} runs from {min(rotary_phases)} to {max(rotary_phases)})")
for name in ("rotary: all four layer-2 heads have the induction pattern", "rotary: a previous-token head in layer 1",
             "rotary: layer 2 needs it in its keys"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
assert (k, n) == STATED["rotary: two layers change phase"]
assert (statistics.median(rotary_phases), min(rotary_phases), max(rotary_phases)) == (1370.0, 1100, 1930)
for name in ("rotary: all four layer-2 heads have the induction pattern", "rotary: a previous-token head in layer 1",
             "rotary: layer 2 needs it in its keys"):
    assert counts[name] == STATED[name]

# %% [markdown]
# With rotary positions the phase change comes later (step 1,370 in the middle run, the ten from
# 1,100 to 1,930; learned positions: 530, from 450 to 740). In 9 of the 10 runs all four layer-2
# heads have the induction pattern (none copies by the copying score, section 6), and **the
# textbook circuit appears**: a layer-1 head puts most of its attention on the previous token,
# and removing it from layer 2's **keys** alone takes the loss back above half of $\ln 64$. The
# previous-token head writes at each position "the token before me was A"; at `<A>` a layer-2
# head's query looks for a key that says so, which is the key
# right after the earlier `[A]` (Elhage et al.'s K-composition); in the same 9 runs it is the
# previous-token head's **token part** that the keys need. The tenth run, seed 9, changed phase
# last (step 1,930); by step 2,400 it had neither a previous-token head nor the induction pattern, and
# still leaned on layer 1 through its queries.
#
# The duplicate-token head has not gone away: 8 of the rotary runs still have one. Removing the
# layer-1 head with the highest duplicate-token score from layer 2's queries alone raises the
# loss in every run, but a removal can move the loss a little by itself. The **noise floor** is
# a control removal: the layer-1 head with the *lowest* duplicate-token score, removed from the
# queries the same way (in the 9 runs with the textbook circuit, that is the previous-token
# head, whose job is in the keys):

# %%
textbook = lambda r: rotary(r) and check_findings(r)["rotary: layer 2 needs it in its keys"]  # noqa: E731
rise = lambda r, h: r["composition"]["q"]["loss"][h] - r["loss"]["predictable"]  # noqa: E731  removed from the queries
lowest = lambda r: min(range(4), key=r["scores"][0]["duplicate"].__getitem__)  # noqa: E731  the control head
dup_rise = study.values(lambda r: rise(r, top_head(r, 0, "duplicate")), where=rotary)
floor = study.values(lambda r: rise(r, lowest(r)), where=textbook)
seed_9_rises = next(r for r in study.runs if rotary(r) and r["seed"] == 9)
intact = study.values(lambda r: r["loss"]["predictable"], where=textbook)
print(f"the 9 textbook runs, intact: {min(intact):.2f} to {max(intact):.2f} nats on the predictable tokens")
print(f"best duplicate-token head removed from the queries: the loss rises {min(dup_rise):.2f} to {max(dup_rise):.2f} nats")
print(f"control head removed from the queries, the 9 textbook runs: {min(floor):+.3f} to {max(floor):+.3f} nats; "
      f"seed 9: {rise(seed_9_rises, lowest(seed_9_rises)):+.2f} (every head there: "
      f"{min(rise(seed_9_rises, h) for h in range(4)):.2f} or more)")
for name in ("rotary: a duplicate-token head in layer 1", "rotary: the queries still read the duplicate-token head",
             "rotary: it raises the loss more than the control head does",
             "rotary: no layer-1 head is needed in the queries"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
    assert counts[name] == STATED[name]
assert (round(min(dup_rise), 2), round(max(dup_rise), 2)) == (0.54, 1.27) and max(floor) < 0 < min(dup_rise)
assert (round(min(intact), 2), round(max(intact), 2)) == (0.71, 0.77)
assert max(intact) < min(r["loss"]["predictable"] for r in changed_runs)  # below every run with learned positions
assert study.values(lambda r: r["seed"], where=lambda r: rotary(r) and not textbook(r)) == [9]

# %% [markdown]
# In the 9 runs with the textbook circuit (intact 0.71 to 0.77 nats, lower than any run with
# learned positions) the control moves the loss by less than 0.01 nats
# (down, in all 9), while the duplicate-token head's removal raises it by 0.54 nats or more.
# In seed 9 every layer-1 head removed from the queries costs 0.74 nats or more, the control
# 0.76, the duplicate-token head 1.04. So the duplicate-token head raises the loss more than the
# control in 10 of the 10 runs; but in 9 of the 10 (all but seed 9) no layer-1 head removed
# from the queries takes it above half of $\ln 64$. It helps; the previous-token head read by
# the keys is what the model needs.

# %% [markdown]
# Seed 9 is where the phase-change criterion matters. One of its training batches dips below the
# threshold long before the loss stays there; counted by single records, it would have "changed
# phase" there. Five records in a row put its phase change later, and what it has learned by the
# end is less than the others:

# %%
seed_9 = next(r for r in study.runs if rotary(r) and r["seed"] == 9)
steps = study.about["steps"]["rotary"]
first_dip = next(step for step, loss in zip(steps, seed_9["history"]) if loss < base["phase_threshold"])
later = seed_9["history"][steps.index(first_dip):]
above = sum(loss >= base["phase_threshold"] for loss in later) / len(later)
print(f"seed 9: one batch below the threshold first at step {first_dip}, but {above:.0%} of the records from "
      f"there on are above it again; {PHASE_RECORDS} in a row from step {seed_9['phase_change']}")
ind = seed_9["scores"][1]["induction"]
print(f"seed 9 at the end: held-out loss {seed_9['loss']['predictable']:.2f} nats; layer-2 induction scores "
      f"{min(ind):.2f} to {max(ind):.2f} (uniform {base['uniform_induction']:.3f}, threshold {base['induction_head']:.3f})")
assert (first_dip, seed_9["phase_change"]) == (1710, 1930) and max(ind) < base["induction_head"]

# %% [markdown]
# With learned positions, these models read a duplicate-token head through their queries; with
# rotary positions, 9 in 10 learn the textbook circuit. That fits the pointer reading, but the
# rotary runs also differ in how heads see distance and in training 2,400 steps, so this
# comparison alone does not show that positions in the stream are the cause. Most open language
# models today use rotary positions (chapter 06); whether large models learn the same circuit,
# this small study cannot say.
#
# ## 8. Why one layer cannot, and what this has to do with in-context learning
#
# In one layer, the key at position `j` is built from token `j` and position `j` alone, and the
# query at `t` from token `t` and position `t`. To land on "the token after the earlier `A`",
# either the key must know the token *before* it (only a head can bring it there: K-composition)
# or the query must know *where* the earlier `A` is (only a head can find it: Q-composition).
# With one layer there is no earlier head, so no run got there: no one-layer head has the
# induction pattern (24 of 24 runs). What one layer can learn is that tokens already in the
# context are likelier than others (the repeated tokens all occurred before), the copying of
# section 6's control; it is worth a little, and the model pays for it on the tokens that can't
# be predicted (their loss rises above $\ln 64$):

# %%
one_final = study.span(lambda r: r["loss"]["predictable"], where=learned(1))
print(f"one layer, after 800 steps: {one_final[0]:.2f} to {one_final[1]:.2f} nats on the predictable tokens "
      f"(no copying: {base['no_copy_loss']:.2f}; two layers that changed phase: "
      f"{min(study.values(lambda r: r['loss']['predictable'], where=changed)):.2f} to "
      f"{max(study.values(lambda r: r['loss']['predictable'], where=changed)):.2f})")
assert counts["one layer: no induction pattern"] == (24, 24)
one_other = study.span(lambda r: r["loss"]["other"], where=learned(1))
print(f"one layer, the other tokens: {one_other[0]:.2f} to {one_other[1]:.2f} nats (no copying: {base['no_copy_loss']:.2f})")
assert one_other[0] > base["no_copy_loss"] > one_final[1]  # in-context tokens likelier, the others less likely

# %% [markdown]
# **In-context learning.** The sequences are random: no model can have memorised what follows a
# token. After the phase change the model predicts it anyway, from the context it is reading.
# That is in-context learning in its smallest form. Olsson et al. found that in transformers of
# many sizes induction heads form in a phase change early in training, at the same time as the
# models become much better at using earlier context, and argue that induction heads are one of
# the mechanisms behind in-context learning in large models.
#
# ## Recap
#
# - A head of a later layer reads what earlier heads wrote into the **residual stream**, a sum
#   of head outputs, through its **queries, keys or values** (Q-, K-, V-composition).
# - Continuing `... A B ... A` with `B` takes two layers: one cannot, two learn it in a sudden
#   **phase change** (19 of 24 runs within 800 steps, none with one layer).
# - **Scores** defined in advance, against uniform attention, say where a head looks;
#   **ablation**, of a whole head or of one input only, says what the model needs.
# - A head has the **induction pattern** when it attends to the token after the earlier
#   occurrence (induction score), and **copies** when its OV circuit gives the attended token
#   the largest logit for more tokens than a control does: halfway from the one-layer models'
#   mean copying score to 1. An **induction head** does both: with learned positions, 50 of the 76 layer-2
#   heads; all 76 have the pattern. The eigenvalue measure of copying passes nearly every
#   trained head, and says the rotary runs' layer-2 heads copy where the copying score says
#   none does: name the measure with the count.
# - With learned positions in the stream, these models find the earlier token with a
#   duplicate-token head read by the queries (**Q-composition**: removing it from the queries
#   alone undoes the copying); what the queries need from it is its **position part**. The
#   weights' Q- and K-composition scores agree; their V-scores do not (high in 15 of 19 runs,
#   while no layer-1 head is needed in the values). With rotary positions, 9 runs in 10 learn the textbook
#   previous-token head read by the keys. Which circuit appears is itself a finding, measured
#   over independent runs.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/08_heads_that_compose.ipynb`: build the
# repeated-segment batch, write the previous-token and induction scores, and find by ablation
# which heads a trained model needs; each exercise checks itself and tells you what is wrong. See
# the README for how to start your own copy.
#
# ## What comes next
#
# Chapters 07 and 08 trained toys, each built so that one mechanism would solve it. **Chapter
# 09** trains a small language model of real text, Python's own test suite, on your CPU in a few
# minutes, and asks which of this chapter's findings carry over: does it grow previous-token and
# induction heads, does it copy, and which heads does it need for which tokens?
