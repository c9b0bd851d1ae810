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
# - find by **ablation** which first-layer heads the induction heads need, and through which of
#   their inputs they read them: queries, keys or values (**Q-, K- and V-composition**);
# - tell the textbook circuit from the one these models actually learn, and say which choice of
#   positions decides between them; judge all of it over many independent runs.
#
# *Sources.* Elhage et al., "A Mathematical Framework for Transformer Circuits" (Transformer
# Circuits Thread, 2021): attention-only transformers, the residual stream as a sum of head
# outputs, Q-, K- and V-composition, and induction heads; Olsson et al., "In-context Learning and
# Induction Heads" (2022): the phase change and its link to in-context learning. Heads as
# detectives that each look for a different clue are from Priyesh Dave's post "Day 28:
# Multi-Head Attention" (DEV Community); here the clue one head finds is what another needs.
# Rotary positions are from Su et al., "RoFormer" (2021), built in chapter 06.

# %% [markdown]
# ## Set-up
#
# As in every chapter: pick the device (set `MHA_DEVICE=cpu` to force the CPU) and seed. The
# models here are small; like chapter 07's, they train fastest on one CPU thread.

# %%
import matplotlib.pyplot as plt
import torch

from mha_lib import causal_mask, get_device, plot_attention, seed_everything
from mha_lib.induction import (
    AttentionOnlyTransformer,
    losses,
    phase_change_step,
    repeated_segments,
    silence_heads,
    train_induction,
)
from mha_lib.induction.findings import check_findings, count_findings, top_head
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
# number to watch; we call the step where it first falls below half of $\ln 64$ (halfway from
# knowing nothing to copying perfectly) the **phase change**. Both numbers are fixed before any
# model is trained:

# %%
base = baselines(CONFIGS["learned"])
print(f"no copying: ln 64 = {base['no_copy_loss']:.2f} nats;  phase change: below {base['phase_threshold']:.2f}")

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
# on the predictable tokens every 10 steps. We train the two-layer model for 800 steps and a
# one-layer model, built the same way, for 400 (it costs time and, as the study below shows,
# never changes phase). The cells print timings and the digits of *your* run, which differ
# between machines (chapter 07 explains why), so the tests run them without comparing output.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings, and the digits of a training run, vary by machine)
training = {k: v for k, v in CONFIGS["learned"]["training"].items() if k != "steps"}
two_history = train_induction(two, steps=800, seed=0, segment=tuple(task["segment"]), **training)

# %%
# NBVAL_IGNORE_OUTPUT
seed_everything(0)
one = AttentionOnlyTransformer(task["vocab_size"], num_layers=1, max_len=task["seq_len"],
                               **CONFIGS["learned"]["model"]).to(device)
one_history = train_induction(one, steps=400, seed=0, segment=tuple(task["segment"]), **training)

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
assert one_phase is None  # held in every run of the study (below), and section 7 says why

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
print(f"two layers: changed phase in {k} of {n} runs, at steps {min(phases)} to {max(phases)}")
k1, n1 = counts["one layer never changes phase"]
print(f"one layer: changed phase in {n1 - k1} of {n1} runs")
assert (k, n) == (19, 24) and counts["one layer never changes phase"] == (24, 24)
assert (min(phases), max(phases)) == (450, 740)

# %%
# NBVAL_IGNORE_OUTPUT
# (your run)
where = (f"changed phase at step {two_phase}" if two_phase is not None
         else "stayed on the plateau for all 800 steps")
print(f"your two-layer run {where}; your one-layer run did not change phase")

# %% [markdown]
# Two layers changed phase in **19 of the 24 runs**, anywhere from step 450 to step 740; the
# other 5 were still on the plateau at step 800, at the one-layer level. **No one-layer run
# changed phase.** (A run's phase change is the first recorded step, every 10 steps, whose
# training batch puts the loss below the threshold.) So the drop is what two layers usually do, and when it comes differs by
# hundreds of steps from one run to the next; a single curve would have told neither.
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
      f"induction or duplicate-token head >= {base['induction_head']:.3f}")

measured = measure(model, held_out)  # scores, losses and ablations, exactly as the study measured them
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
for name in ("learned: all four layer-2 heads are induction heads", "learned: no previous-token head in layer 1",
             "learned: a duplicate-token head in layer 1", "untrained: no head has a role"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
assert counts["learned: all four layer-2 heads are induction heads"] == (19, 19)
assert counts["learned: no previous-token head in layer 1"] == (24, 24)
assert counts["learned: a duplicate-token head in layer 1"] == (19, 19)
assert counts["untrained: no head has a role"] == (58, 58)
layer_1_previous = study.values(lambda r: max(r["scores"][0]["previous_token"]), where=learned(2))
print(f"layer 1's best previous-token score: at most {max(layer_1_previous):.3f} in any run "
      f"(uniform attention: {base['uniform_previous_token']:.3f})")
assert max(layer_1_previous) < base["uniform_previous_token"]  # below uniform, in every run
seed_0 = next(r for r in study.runs if learned(2)(r) and r["seed"] == 0)  # the shipped model's run
shipped = dict(measured, config="learned", num_layers=2, phase_change=seed_0["phase_change"], untrained=seed_0["untrained"])
assert all(check_findings(shipped).values())  # the shipped model is one of those runs

# %% [markdown]
# In every run that changed phase, **all four heads of layer 2 are induction heads**. The
# textbook circuit (Elhage et al.) puts a **previous-token head** in layer 1, which writes "the
# token before me was A" at each position, and layer 2's keys read it (section 6 shows how).
# **No run has one** (every layer-1 head scores *below* uniform attention there). What layer 1 has instead,
# in every run that changed phase, is a **duplicate-token head**: from `<A>` it attends to the
# earlier `[A]`. None of this is there before training: no head of any untrained model reaches
# a threshold.
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
# 2.98 nats, two thirds of the way back to $\ln 64$. Any one induction head can go at a cost
# (to at most 1.58 nats): the other three do the same job. Why does silencing head 1 not take the
# loss all the way back? Head 2 is a weaker duplicate-token head (its score is 0.81, against
# 0.91). Silence both, and the model copies no better than the one-layer models of the study,
# which cannot copy at all:

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
# Head 2 stands in for part of head 1's job; together they are what layer 2's induction heads
# need.
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
# does, in any of them, nor from the **values**. So these models compose through the
# **queries**: **Q-composition**, not the K-composition of the textbook circuit.
#
# A reading of how that works, which the next section puts to a test: at `<A>`, the
# duplicate-token head copies into the stream what sat at the earlier `[A]`, and that includes
# its **learned position vector**. The induction head's query can then ask for "the position
# right after that one", and every key carries its own position. That is a pointer to a
# position, and it needs positions *in the residual stream*.
#
# ## 6. The textbook circuit: take the positions out of the stream
#
# Chapter 06's **rotary positions** add nothing to the stream: they rotate each head's queries
# and keys inside the head, so a head still knows how far apart two tokens are, but no token's
# vector says where it sits. If the reading above is right, the pointer route is closed, and a
# model is expected to mark each position with the token *before* it instead: a previous-token
# head in layer 1, read by layer 2's **keys**. The study trained the same two-layer model with
# `positions="rotary"` from 10 seeds, for 2,400 steps (too long for this notebook):

# %%
rotary = lambda r: r["config"] == "rotary"  # noqa: E731
rotary_phases = study.values(lambda r: r["phase_change"], where=rotary)
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
print(f"rotary: changed phase in {counts['rotary: two layers change phase'][0]} of 10 runs, "
      f"at steps {min(rotary_phases)} to {max(rotary_phases)}")
for name in ("rotary: all four layer-2 heads are induction heads", "rotary: a previous-token head in layer 1",
             "rotary: layer 2 needs it in its keys"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
assert counts["rotary: two layers change phase"] == (10, 10) and (min(rotary_phases), max(rotary_phases)) == (1100, 1720)
assert [counts[name] for name in ("rotary: all four layer-2 heads are induction heads",
                                  "rotary: a previous-token head in layer 1",
                                  "rotary: layer 2 needs it in its keys")] == [(9, 10)] * 3

# %% [markdown]
# With rotary positions the phase change comes later (steps 1,100 to 1,720, against 450 to 740)
# and, in 9 of the 10 runs, **the textbook circuit appears**: a layer-1 head puts most of its
# attention on the previous token, and removing it from layer 2's **keys** alone takes the loss
# back above half of $\ln 64$. The previous-token head writes at each position "the token before
# me was A"; at `<A>` the induction head's query looks for a key that says so, which is the key
# right after the earlier `[A]` (Elhage et al.'s K-composition). The tenth run, seed 9, changed
# phase second to last (step 1,710); by step 2,400 it had neither a previous-token head nor
# induction heads, and still leaned on layer 1 through its queries.
#
# The duplicate-token head has not gone away: 8 of the rotary runs still have one, and removing
# the best of them from layer 2's queries alone raises the loss in every run, but in 9 of the 10
# (all but seed 9) no layer-1 head removed from the queries takes it above half of $\ln 64$. It
# helps; the previous-token head read by the keys is what the model needs:

# %%
for name in ("rotary: a duplicate-token head in layer 1", "rotary: the queries still read the duplicate-token head",
             "rotary: no layer-1 head is needed in the queries"):
    print(f"{name}: {counts[name][0]} of {counts[name][1]} runs")
assert counts["rotary: a duplicate-token head in layer 1"] == (8, 10)
assert counts["rotary: the queries still read the duplicate-token head"] == (10, 10)
assert counts["rotary: no layer-1 head is needed in the queries"] == (9, 10)
textbook = lambda r: rotary(r) and check_findings(r)["rotary: layer 2 needs it in its keys"]  # noqa: E731
raised = study.values(lambda r: r["composition"]["q"]["loss"][top_head(r, 0, "duplicate")], where=textbook)
intact = study.values(lambda r: r["loss"]["predictable"], where=textbook)
print(f"the {len(intact)} runs with the textbook circuit: intact {min(intact):.2f} to {max(intact):.2f} nats; "
      f"best duplicate-token head removed from the queries {min(raised):.2f} to {max(raised):.2f}")
assert study.values(lambda r: (r["seed"], r["phase_change"]), where=lambda r: rotary(r) and not textbook(r)) == [(9, 1710)]
assert sorted(rotary_phases)[-2] == 1710  # seed 9 changed phase second to last

# %% [markdown]
# With learned positions, these models read a duplicate-token head through their queries; with
# rotary positions, 9 in 10 learn the textbook circuit. That fits the pointer reading, but the
# rotary runs also differ in how heads see distance and in training 2,400 steps, so this
# comparison alone does not show that positions in the stream are the cause. Most open language
# models today use rotary positions (chapter 06); whether large models learn the same circuit,
# this small study cannot say.
#
# ## 7. Why one layer cannot, and what this has to do with in-context learning
#
# In one layer, the key at position `j` is built from token `j` and position `j` alone, and the
# query at `t` from token `t` and position `t`. To land on "the token after the earlier `A`",
# either the key must know the token *before* it (only a head can bring it there: K-composition)
# or the query must know *where* the earlier `A` is (only a head can find it: Q-composition).
# With one layer there is no earlier head, so no run got there. What one layer can learn is that
# tokens already in the context are likelier than others (the repeated tokens all occurred
# before), which is worth a little, and which it pays for on the tokens that can't be predicted
# (their loss rises above $\ln 64$):

# %%
one_final = study.span(lambda r: r["loss"]["predictable"], where=learned(1))
print(f"one layer, after 800 steps: {one_final[0]:.2f} to {one_final[1]:.2f} nats on the predictable tokens "
      f"(no copying: {base['no_copy_loss']:.2f}; two layers that changed phase: "
      f"{min(study.values(lambda r: r['loss']['predictable'], where=changed)):.2f} to "
      f"{max(study.values(lambda r: r['loss']['predictable'], where=changed)):.2f})")
assert counts["one layer: no induction head"] == (24, 24)
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
# - An **induction head** continues `... A B ... A` with `B`. One layer cannot build it; two
#   layers learn it in a sudden **phase change** (19 of 24 runs within 800 steps, none with one
#   layer).
# - **Scores** defined in advance, against uniform attention, say where a head looks;
#   **ablation**, of a whole head or of one input only, says what the model needs.
# - With learned positions in the stream, these models find the earlier token with a
#   duplicate-token head read by the queries; with rotary positions, 9 runs in 10 learn the
#   textbook previous-token head read by the keys. Which circuit appears is itself a finding,
#   measured over independent runs.
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
# Every attention map in chapters 07 and 08 was an `L × L` matrix. For long sequences that matrix
# is the bottleneck: **chapter 09** builds `mha_lib.EfficientMultiHeadAttention` with fused
# projections and PyTorch's fast attention kernels, and explains flash attention.
