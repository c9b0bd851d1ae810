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
# # Chapter 07 · Heads at work
#
# Chapters 02 to 05 built multi-head attention and proved it right. This chapter
# trains a model and asks the sources' question: do the heads of a trained model
# **specialize**, like detectives who each look for a different clue? Measured over many
# training runs, the answer is less tidy than the metaphor.
#
# **By the end of this chapter you will be able to**
#
# - build a transformer **encoder layer** (attention, a feed-forward network, residual
#   connections, dropout, layer normalization), explain pre-norm and post-norm, and prove it
#   equal to `nn.TransformerEncoderLayer`;
# - train a two-head classifier on sentences with negations ("the movie was not bad" is
#   positive) in seconds on a CPU;
# - **measure** what each head attends to, against what uniform attention would give;
# - **ablate** a head three ways (zero, mean, resample), read the damage group by group (an
#   **inverted** group is not one near chance), and split the prediction into one term per head
#   (**direct logit attribution**);
# - test whether a model recognises a word by its **absence**;
# - compare one, two, four and eight heads on the same task, show why one head read out
#   linearly cannot compute its *exclusive or*, and count how the one-head runs failed;
# - judge a finding by the number of **independent runs** it holds in, counting one by hand from
#   the study's file.
#
# *Sources.* "The movie was not bad" and the encoder layer are from *Transformers in Action*
# (Manning), sections 1.1.4 and 2.2.1; heads as detectives who each look for a different clue,
# from Priyesh Dave's post "Day 28: Multi-Head Attention" (DEV Community). Also cited: Vaswani
# et al., "Attention Is All You Need" (2017); Xiong et al., "On Layer Normalization in the
# Transformer Architecture" (2020); Devlin et al., "BERT" (2019); Michel et al., "Are Sixteen
# Heads Really Better than One?" (2019); Voita et al., "Analyzing Multi-Head Self-Attention"
# (2019); Elhage et al., "A Mathematical Framework for Transformer Circuits" (2021); Zhang and
# Nanda, "Towards Best Practices of Activation Patching in Language Models" (2024); Bhojanapalli
# et al., "Low-Rank Bottleneck in Multi-head Attention Models" (2020).

# %% [markdown]
# ## Set-up
#
# As in every chapter: pick the device (set `MHA_DEVICE=cpu` to force the CPU) and seed the
# random generators.

# %%
from collections import Counter
from statistics import median

import matplotlib.pyplot as plt
import numpy as np
import torch
from torch import nn

from mha_lib import (
    EncoderLayer,
    combine_heads,
    get_device,
    padding_mask,
    plot_attention,
    scaled_dot_product_attention,
    seed_everything,
    split_heads,
)
from mha_lib.sentiment import (
    SentimentClassifier,
    Vocab,
    attention_shares,
    batch_examples,
    evaluate,
    feed_forward_off,
    four_groups,
    load_study,
    make_datasets,
    predict,
    silence_heads,
    train_model,
)
from mha_lib.sentiment.attribution import ABLATIONS, ablated_accuracy, logit_attribution
from mha_lib.sentiment.findings import (
    ABLATION_FINDINGS,
    CONTROL_FINDINGS,
    FINDINGS,
    LABELS,
    MEAN_CONTROLS,
    STATED,
    colliding_pairs,
    count_findings,
    findings_table,
    independent,
    outcomes_table,
    kernel_path_changes,
    learned,
    negation_head_of,
    other_head_of,
    robust_seeds,
    sent_token,
    wording,
)
from mha_lib.sentiment.plots import plot_runs
from mha_lib.sentiment.run import baselines

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. The encoder layer
#
# Multi-head attention is one half of a transformer **encoder layer**. The other half is a
# **position-wise feed-forward network**: each token's vector, on its own, goes through the same
# small network, `Linear(d_model, d_ff) → ReLU → Linear(d_ff, d_model)`. Attention mixes
# *across* positions; the feed-forward network transforms *each* position.
#
# The book wraps each of the two sublayers in three things:
#
# - a **residual connection**, `x + sublayer(x)`: the sublayer learns a correction to `x`, and
#   the gradient has a direct path back through the `+`, which keeps deep stacks trainable;
# - **dropout** on the sublayer's output, in training only: random entries are zeroed (the rest
#   scaled up), so the model can't rely on any single feature;
# - **layer normalization**: each token's vector is shifted and scaled to mean 0 and variance 1
#   over its `d_model` features (then multiplied and shifted by two learned vectors), which
#   keeps the numbers in a steady range however many layers are stacked.
#
# Layer norm works token by token: one token's 8 features, whatever their size, come out with
# mean 0 and standard deviation 1.

# %%
norm = nn.LayerNorm(8)
token = 5 * torch.randn(1, 1, 8) + 3  # (B, L, d_model) with large, off-centre features
normalized = norm(token)
print(f"before: mean {token.mean():.2f}, std {token.std(unbiased=False):.2f}")
print(f"after:  mean {normalized.mean().abs():.2f}, std {normalized.std(unbiased=False):.2f}")

# %% [markdown]
# **Where does the normalization go?** The original Transformer (and the book) normalizes
# *after* adding the residual, **post-norm**:
#
# $$x \leftarrow \text{LayerNorm}\big(x + \text{Dropout}(\text{Sublayer}(x))\big)$$
#
# Most models today normalize the sublayer's *input* instead, **pre-norm**:
#
# $$x \leftarrow x + \text{Dropout}\big(\text{Sublayer}(\text{LayerNorm}(x))\big)$$
#
# `mha_lib.EncoderLayer` is pre-norm: the residual path carries `x` through untouched, and the
# model trains stably without the learning-rate *warm-up* post-norm needs (Xiong et al., 2020).
# The price: a stack ends with one more `LayerNorm`, since nothing normalizes the last layer's
# output. PyTorch calls it `nn.TransformerEncoderLayer(..., norm_first=True)`.
#
# The layer, with chapter 03's tiny sizes (`d_model` 8, 2 heads) and `d_ff = 4 · d_model`:

# %%
layer = EncoderLayer(d_model=8, num_heads=2, d_ff=32).to(device)
print(layer)

# %%
x = torch.randn(2, 5, 8).to(device)  # (B, L, d_model)
out, weights = layer(x, return_weights=True)
print("input:  ", tuple(x.shape), "(B, L, d_model)")
print("output: ", tuple(out.shape), "(B, L, d_model): same shape, so layers can be stacked")
print("weights:", tuple(weights.shape), "(B, H, L, L): one map per head")

# %% [markdown]
# The whole forward pass is four lines. Written out by hand with the layer's own parts, it
# must give the same output (dropout is 0 here, so it is the identity):

# %%
def encoder_layer_by_hand(layer, x, mask=None):
    h = layer.norm1(x)                                # pre-norm
    x = x + layer.self_attn(h, h, h, mask=mask)       # 1) attention sublayer + residual
    x = x + layer.feed_forward(layer.norm2(x))        # 2) feed-forward sublayer + residual
    return x                                          # (B, L, d_model)


keep = padding_mask([5, 3]).to(device)  # (B, 1, 1, L): the second sentence has 3 real tokens
for mask in (None, keep):
    assert torch.allclose(encoder_layer_by_hand(layer, x, mask), layer(x, mask=mask), atol=1e-6)
print("by hand == EncoderLayer, with and without a padding mask")

# %% [markdown]
# PyTorch's own layer, with the same weights copied in, must agree too. It keeps $W_q, W_k, W_v$
# stacked in one matrix (chapter 05), and its masks mean *True = blocked*, the opposite of ours.

# %%
reference = nn.TransformerEncoderLayer(
    d_model=8, nhead=2, dim_feedforward=32, dropout=0.0, activation="relu",
    batch_first=True, norm_first=True,
).to(device)
attn = layer.self_attn
with torch.no_grad():
    reference.self_attn.in_proj_weight.copy_(torch.cat([attn.W_q.weight, attn.W_k.weight, attn.W_v.weight]))
    reference.self_attn.in_proj_bias.copy_(torch.cat([attn.W_q.bias, attn.W_k.bias, attn.W_v.bias]))
    reference.self_attn.out_proj.load_state_dict(attn.W_o.state_dict())
    reference.linear1.load_state_dict(layer.feed_forward[0].state_dict())
    reference.linear2.load_state_dict(layer.feed_forward[3].state_dict())
    reference.norm1.load_state_dict(layer.norm1.state_dict())
    reference.norm2.load_state_dict(layer.norm2.state_dict())

real = keep[:, 0, 0]  # (B, L): True at the real tokens
ours, theirs = layer(x, mask=keep), reference(x, src_key_padding_mask=~real)
assert torch.allclose(ours[real], theirs[real], atol=1e-5)  # padded positions' outputs are never used
print("EncoderLayer == nn.TransformerEncoderLayer(norm_first=True) on the real tokens (within 1e-5)")

# %% [markdown]
# Dropout is active only in training mode. In evaluation mode (`.eval()`) the layer is a
# deterministic function; in training mode (`.train()`) two calls differ.

# %%
noisy = EncoderLayer(8, 2, 32, dropout=0.3).to(device)
noisy.train()
print("train mode, two calls equal:", torch.equal(noisy(x), noisy(x)))
noisy.eval()
print("eval mode,  two calls equal:", torch.equal(noisy(x), noisy(x)))

# %% [markdown]
# ## 2. A sentiment task with negations
#
# To see heads at work we need a task where one relation between words decides the answer.
# `mha_lib.sentiment.make_datasets` draws short movie-review sentences from three templates
# (parts in brackets are optional):
#
# - "the [long] movie was [not] [really] good [overall]"
# - "i [found | did not find] the [long] plot [really] boring [overall]"
# - "[not] a [really] good film [overall]"
#
# Each word stands for a slot: *the* is one of {the, this, that}, *movie*, *plot* and *film* one of 10
# nouns, *was* one of {was, is, seemed, felt}, *long* one of 5 adjectives, *really* one of 4
# intensifiers, *overall* one of 4 endings (and "at all" after a "not"); *good* and *boring*
# stand for any of 7 positive and 7 negative sentiment words. The **label is the sentiment after
# negation**. Half the sentences are negated, so the sentiment word alone gets every negated
# sentence wrong, and "not" alone says nothing: the model must relate the two words, the point
# of the book's "The movie was not bad". The held-out sentences differ from the training ones.

# %%
train, test = make_datasets(n_train=2000, n_test=500, seed=0)
print(f"{len(train)} training and {len(test)} held-out sentences")
print("held-out sentences seen in training:", len({e.tokens for e in train} & {e.tokens for e in test}))
print(f"negated: {sum(e.negated for e in train) / len(train):.0%} of training, "
      f"{sum(e.negated for e in test) / len(test):.0%} of held-out")
print()
for e in train[:8]:
    print(f"{'positive' if e.label else 'negative':8}  {'negated' if e.negated else 'plain':7}  {e.text}")

# %% [markdown]
# **Tokens and ids.** A `Vocab` maps each word to an integer id. Three special tokens come
# first: `<pad>` (0) fills up short sentences, `<unk>` (1) stands for a word the task never
# uses, and `<cls>` (2) is put in front of every sentence; section 3 says why.

# %%
vocab = Vocab.for_task()
print("vocabulary size:", len(vocab), " first ids:", vocab.itos[:6])
ids = vocab.encode("The movie was not bad")
print("encode:", ids, " decode:", vocab.decode(ids))

# %% [markdown]
# `batch_examples` stacks sentences into one `(B, L)` tensor: `<cls>`, the words, then `<pad>`
# up to the longest sentence. The model will mask the padding, so that no token attends to it
# (chapter 04).

# %%
sentences = ["the movie was not bad", "a good film", "i did not find the plot boring"]
tokens = batch_examples(sentences, vocab)
print("tokens:", tuple(tokens.shape), "(B, L)")
print(tokens)
for row in tokens:
    print(vocab.decode(row))

# %% [markdown]
# ## 3. The model
#
# `SentimentClassifier` is as small as a transformer classifier gets:
#
# 1. **token embedding + learned position embedding** (attention ignores word order, chapter 02;
#    this is chapter 06's learned table);
# 2. **one `EncoderLayer`** with `d_model = 48`, **2 heads** of 24 features and `d_ff = 96`;
# 3. a final `LayerNorm` (the layer is pre-norm);
# 4. a linear **classifier** on the vector of `<cls>`: two logits, negative and positive.
#
# `<cls>` is the same token at the same position in every sentence (as in BERT), so its vector
# differs between sentences only through what its attention brings back. In this one-layer
# model, only **the `<cls>` row of each attention map reaches the prediction**: that is the row
# to watch.
# (The model also accepts an extra mask, e.g. one per head; chapter 12 uses it.)

# %%
seed_everything(0)  # seed, then build: the starting weights come from the seed (the seed study does the same)
model = SentimentClassifier(len(vocab), d_model=48, num_heads=2, num_layers=1, d_ff=96).to(device)
print(model)
print("parameters:", sum(p.numel() for p in model.parameters()))

# %%
logits, weights = model(tokens.to(device), return_weights=True)
print("tokens:", tuple(tokens.shape), "(B, L)")
print("logits:", tuple(logits.shape), "(B, 2)")
print("attention weights:", len(weights), "layer(s) of", tuple(weights[0].shape), "(B, H, L, L)")

# %% [markdown]
# ## 4. Training
#
# `train_model` runs AdamW (learning rate 0.005) on the cross-entropy loss, 12 passes (epochs)
# over the training sentences in batches of 32, with dropout 0, on **one CPU thread** (the
# operations are too small to share out).
#
# **One run is one sample.** Another seed gives another model, and so can another machine: a
# different CPU may run different kernels (AVX-512 or plain C++) that add numbers in a different
# order, and over 756 optimizer steps the rounding can change the run's path. So this chapter never tells you what *your* run printed. It quotes a **seed study**
# (`mha_lib/sentiment/study.json`; `make study` re-runs it):
#
# - **independent runs**: run *s* seeds its weights with *s* and draws its own sentences with
#   seed *s*; 40 runs with two heads, 24 each with one, four and eight (section 8);
# - **thresholds fixed in advance, from baselines**: a guess is right half the time (*chance*);
#   a run has *learned* when it errs at most a tenth as often as a guess, on negated and plain
#   sentences alike (95%); *near chance* is below 72.5%, closer to chance than to 95% (or
#   below chance). If `<cls>` attended uniformly to its `n` tokens, each would get `1/n`, about
#   13% here (*uniform*); a head *has a role* for a word when it gives it at least halfway from
#   uniform to everything (about 57%);
# - **counts**: each finding is printed with its number of runs; the text says *all*, *most*
#   (more than two runs in three: 17 of 24 is "most", 16 of 24 is not) or gives the count,
#   "16 of 24", when it is fewer. A bare majority is not "most": one run more or less could tip it.
#
# Your held-out sentences are run 0's, so their baselines must be run 0's:

# %%
torch.set_num_threads(1)  # this notebook's choice: a model this small trains fastest on one thread
study = load_study()
two_heads = [run for run in study.runs if independent(run) and "heads" in run]  # seeds 0-39
two_learned = lambda run: run in two_heads and learned(run)  # noqa: E731
print("independent runs per number of heads:",
      dict(Counter(run["num_heads"] for run in study.runs if independent(run, None))))
base = baselines(test)
print("baselines of your held-out sentences:", base)
assert base == two_heads[0]["baselines"] and two_heads[0]["seed"] == 0

# %% [markdown]
# **A finding, by hand.** The study file is plain JSON: one record per run. Before any helper
# counts for us, count one finding straight from the file: *before training, no head has a
# role*. A run's `"untrained"` record holds, per head, the share of `<cls>`'s attention on
# "not" and on the sentiment word; the threshold is the run's own `role`, from its baselines.
# Replicas repeat a seed on other rounding (below), so they are not counted as samples.

# %%
import json

from mha_lib.sentiment.study import STUDY_FILE

records = json.loads(STUDY_FILE.read_text())["runs"]
print("one run's record:", sorted(records[0]), "\n")
samples = [r for r in records if not r["replica"]]  # every head count, replicas left out
holds = [max(r["untrained"]["cls_to_not"] + r["untrained"]["cls_to_word"]) < r["baselines"]["role"]
         for r in samples]
print(f"no untrained head has a role: {sum(holds)} of {len(holds)} independent runs")

# %% [markdown]
# `findings_table` does exactly this for every finding of the chapter (each one a pair in
# `mha_lib.sentiment.findings.FINDINGS`: which runs it speaks to, and a test on one run), and
# fails when a count stops supporting the wording the text uses:

# %%
print(findings_table(study, ["untrained: no head has a role"]))
assert count_findings(study)["untrained: no head has a role"] == (sum(holds), len(holds))

# %% [markdown]
# No head of an untrained model has a role: random weights don't pass the threshold.
#
# Now train. `train_run` does what the study does for one run (seed, build, train), and records
# after every epoch each head's share of `<cls>`'s attention on "not" in negated sentences.


# %%
def train_run(seed, train, test):
    """Seed, build and train a two-head model as the study does. Returns the model, its
    accuracy curves and, per epoch, each head's share of <cls>'s attention on "not"."""
    seed_everything(seed)
    model = SentimentClassifier(len(vocab), d_model=48, num_heads=2, num_layers=1, d_ff=96)
    negated = [e for e in test if e.negated]
    on_not = []  # one [head 0, head 1] pair per epoch

    def record(epoch, model):
        on_not.append(attention_shares(model, negated, vocab)["not"].tolist())

    history = train_model(model.to(device), train, vocab, test=test, epochs=12, batch_size=32,
                          lr=5e-3, seed=seed, on_epoch=record, reports=3)
    return model, history, on_not


# %%
# NBVAL_IGNORE_OUTPUT
# (timings, and the digits of a training run, vary by machine)
model, history, on_not = train_run(0, train, test)

# %% [markdown]
# Run 0 learned in the study, and again when the study repeated it on a second CPU *kernel
# path* (PyTorch's plain C++ code instead of its AVX-512 code). Rounding alone changes some
# outcomes, though:

# %%
k, n = kernel_path_changes(study)
print(f"the same seed learned on one kernel path and not on the other: {k} of {n} seeds")
assert wording(k, n) == "some" and 0 in robust_seeds(study)

# %% [markdown]
# So should your run fall short, the next cell trains the next seed that learned on both paths,
# with its own sentences (at most three times); the assert says the model learned.

# %%
# NBVAL_IGNORE_OUTPUT
# (the accuracy of your run; the assert checks what must hold)
seed = 0
backups = [s for s in robust_seeds(study) if s != 0][:3]
while min(evaluate(model, test, vocab)[g] for g in ("negated", "plain")) < 0.95 and backups:
    seed = backups.pop(0)
    print(f"fell short of 95%; training seed {seed} on its own sentences")
    train, test = make_datasets(n_train=2000, n_test=500, seed=seed)
    model, history, on_not = train_run(seed, train, test)
    base = baselines(test)
accuracy = evaluate(model, test, vocab)
assert accuracy["negated"] >= 0.95 and accuracy["plain"] >= 0.95, accuracy
print(f"held-out accuracy of your model (seed {seed}): "
      f"negated {accuracy['negated']:.0%}, plain {accuracy['plain']:.0%}")

# %% [markdown]
# How did the runs learn? Held-out accuracy after each epoch for every two-head run (blue:
# learned; orange: did not), and, for the runs that learned, the share of `<cls>`'s attention
# on "not" of the head that ends up looking at it most (section 5). Yours is in black.

# %%
epochs = range(1, 13)
fig, axes = plt.subplots(1, 3, figsize=(12, 3.3), layout="constrained")
for run in two_heads:
    curves, colour = run["heads"]["history"], "tab:blue" if learned(run) else "tab:orange"
    axes[0].plot(epochs, curves["plain"], color=colour, alpha=0.25, lw=1)
    axes[1].plot(epochs, curves["negated"], color=colour, alpha=0.25, lw=1)
    if learned(run):
        h = negation_head_of(run)
        axes[2].plot(epochs, [shares[h] for shares in curves["cls_to_not"]], color=colour, alpha=0.25, lw=1)
yours_h = max(range(2), key=lambda h: on_not[-1][h])
axes[0].plot(epochs, history["test_plain"], "k.-", label="your run")
axes[1].plot(epochs, history["test_negated"], "k.-", label="your run")
axes[2].plot(epochs, [shares[yours_h] for shares in on_not], "k.-", label="your run")
axes[2].axhline(base["role"], color="grey", ls="--", lw=1, label="role threshold")
axes[2].axhline(base["uniform"], color="grey", ls=":", lw=1, label="uniform attention")
for ax, title in zip(axes, ("Plain sentences", "Negated sentences", "Negation head: <cls> on 'not'")):
    ax.set(xlabel="epoch", ylim=(-0.03, 1.03), title=title)
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.legend(loc="lower right", fontsize=7)
axes[0].set_ylabel("held-out accuracy")
axes[2].set_ylabel("share of attention")
plt.show()

print(findings_table(study, ["2 heads: learned", "not learned: negated sentences near chance",
                             "plain sentences learned first", "plain and negated learned together",
                             "negated sentences learned first",
                             "negation head in place when negated sentences are learned"]))

# %% [markdown]
# 24 of the 40 two-head runs learned; of the other 16, 9 stayed near chance on negated
# sentences. In 14 of the 24 runs that learned, plain sentences reached 95% at an earlier epoch
# than negated ones (in 8 at the same epoch, in 2 later): a tendency, not a rule. In most, a head
# had its role for "not" by the epoch negated sentences got there (an epoch is a coarse clock:
# "by" includes the same epoch).
#
# Your model on a few sentences of our own ("not bad" alone fits none of the templates):

# %%
# NBVAL_IGNORE_OUTPUT
# (the predictions of your run)
mine = ["the movie was not bad", "this film is really good", "the plot was not good at all",
        "i did not find the ending boring", "not a great film", "the acting was not very clever",
        "not bad", "the cast was truly awful"]
seen = {e.text for e in train}
for sentence, label in zip(mine, predict(model, mine, vocab).tolist()):
    note = "  (in the training set)" if sentence in seen else ""
    print(f"{'positive' if label else 'negative':8}  {sentence}{note}")

# %% [markdown]
# ## 5. What do the heads look at?
#
# Each head has its own attention map: rows are queries (the token that looks), columns are
# keys. Only the `<cls>` row, the top one, reaches the classifier.

# %%
def labels_of(sentence):
    return vocab.decode(batch_examples([sentence], vocab)[0])


def weights_of(sentences):
    """Attention weights of the model's one layer, on the CPU: (B, H, L, L)."""
    with torch.no_grad():
        _, (w,) = model(batch_examples(sentences, vocab).to(device), return_weights=True)
    return w.cpu()


sentence = "the movie was not bad"
plot_attention(weights_of([sentence])[0], labels_of(sentence), title=f'"{sentence}": both heads')
plt.show()

# %% [markdown]
# Only the `<cls>` rows, for negated and plain sentences with positive and negative words:

# %%
examples = ["the movie was not bad", "the movie was bad", "this film is really good",
            "i did not find the long plot boring", "not a truly great film"]
fig, axes = plt.subplots(len(examples), 1, figsize=(7.5, 1.25 * len(examples)))
for ax, sentence in zip(axes, examples):
    words = labels_of(sentence)
    cls_rows = weights_of([sentence])[0, :, 0, :]  # (H, L): where <cls> looks, per head
    ax.imshow(cls_rows, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for h in range(cls_rows.size(0)):
        for j in range(cls_rows.size(1)):
            w = cls_rows[h, j].item()
            ax.text(j, h, f"{w:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if w > 0.6 else "black")
    ax.set_xticks(range(len(words)), words)
    ax.set_yticks(range(cls_rows.size(0)), [f"head {h}" for h in range(cls_rows.size(0))])
fig.suptitle("Where <cls> looks, head by head (your model)")
fig.tight_layout()
plt.show()

# %% [markdown]
# Five sentences can mislead, so let's **measure**. The held-out sentences fall into four groups:
# `plain+` ("good"), `plain-` ("bad"), `negated+` ("not good", label negative) and `negated-`
# ("not bad"). The + and − are the sentiment word's own polarity, not the label.
# `attention_shares` averages, per group and head, `<cls>`'s share on itself, on "not", on the
# sentiment word and on other words.

# %%
# NBVAL_IGNORE_OUTPUT
# (the attention of your run)
groups = four_groups(test)  # {"plain+": [...], "plain-": [...], "negated+": [...], "negated-": [...]}
shares = {name: attention_shares(model, examples, vocab) for name, examples in groups.items()}
roles = list(shares["plain+"])  # <cls>, not, sentiment word, other words
H = model.num_heads
negated = groups["negated+"] + groups["negated-"]
plain = groups["plain+"] + groups["plain-"]
for h in range(H):
    print(f"{f'head {h}: <cls> attends to':22}" + "".join(f"{role:>15}" for role in roles))
    for name in groups:
        print(f"  {name:20}" + "".join(f"{shares[name][role][h].item():15.0%}" for role in roles))

# %% [markdown]
# **The negation head** is the head that puts the most of `<cls>`'s attention on "not" in
# negated sentences; the **other head** is the other one. Which head takes which job is chance,
# so the code finds out:

# %%
# NBVAL_IGNORE_OUTPUT
# (which head it is depends on your run)
not_share = attention_shares(model, negated, vocab)["not"]  # (H,)
negation_head = int(not_share.argmax())
other_head = 1 - negation_head
print(f"your model: negation head = head {negation_head}, other head = head {other_head}")


# %%
def head_of(run, who):
    """A run's negation head or other head (for two heads, the one that is not the negation head)."""
    return negation_head_of(run) if who == "negation" else other_head_of(run)


def on_word(shares, h):
    """Head h's share of <cls>'s attention on the sentiment word: the higher of the two negated groups."""
    return max(float(shares[g]["sentiment word"][h]) for g in ("negated+", "negated-"))


def word_group(run):
    """Where a run's other head has a role for the sentiment word."""
    h, role = head_of(run, "other"), run["baselines"]["role"]
    on = tuple(run["heads"]["cls_shares"][g]["sentiment word"][h] >= role for g in ("negated+", "negated-"))
    return {(True, False): "not good", (False, True): "not bad", (True, True): "both"}.get(on, "neither")


won = [run for run in two_heads if learned(run)]
print("runs that learned, by their negation head:", dict(Counter(f"head {negation_head_of(r)}" for r in won)))
print("... by where their other head brings the sentiment word:", dict(Counter(map(word_group, won))))
assert {negation_head_of(r) for r in won} == {0, 1}  # either head can take either job
assert {"not good", "not bad"} <= set(map(word_group, won))  # and both negated groups occur

# %% [markdown]
# Which head becomes the negation head can only depend on the seed: the two heads' starting
# weights are drawn alike, and either head takes either job. Both negated groups occur too.
# Over the study's runs that learned, one dot per run ("other head on the
# sentiment word": the higher of "not good" and "not bad"):

# %%
columns = {
    "negation head\non 'not'": lambda r: r["heads"]["cls_to_not"][head_of(r, "negation")],
    "other head\non 'not'": lambda r: r["heads"]["cls_to_not"][head_of(r, "other")],
    "other head on\nthe sentiment word": lambda r: on_word(r["heads"]["cls_shares"], head_of(r, "other")),
}
yours = dict(zip(columns, (not_share[negation_head].item(), not_share[other_head].item(),
                           on_word(shares, other_head))))
fig, ax = plt.subplots(figsize=(8, 3.4), layout="constrained")
plot_runs(ax, study, columns, where=two_learned, yours=yours, chance=False,
          ylabel="share of <cls>'s attention", title="Negated sentences, one dot per run that learned")
for name in ("role", "uniform"):
    ax.axhline(base[name], color="grey", ls="--" if name == "role" else ":", lw=1)
    ax.text(2.45, base[name], f" {name}", va="center", fontsize=8)
plt.show()
print(findings_table(study, ["a negation head", "the other head brings the sentiment word",
                             "the other head brings the word in both negated groups",
                             "the other head looks at 'not' in the other negated group",
                             "plain: the negation head brings the sentiment word",
                             "the sentiment word looks at 'not' more than uniform attention"]))

# %% [markdown]
# In most runs that learned, the negation head has a role for "not"; in every one, the other head
# has one for the sentiment word in "not good" or in "not bad" (in both, in only 4 of 24). In the
# other group it looks at "not", in most runs. The plot's column averages both negated groups, so
# about 100% in one and about 0% in the other gives the dots near 50%: "not good" and "not bad"
# send `<cls>` different tokens. In plain sentences, in most runs, the negation head brings the
# sentiment word in "good" or in "bad" sentences.
#
# **And "bad" looking at "not", as in the book?** In most runs the sentiment word's row gives
# "not" more than uniform attention would in one of its heads, but here that row never reaches
# the classifier.
#
# **Where is "bad"?** Look back at the `<cls>` rows above: in some sentences neither head puts
# much on the sentiment word at all (in your model, perhaps "the movie was bad"). A model can
# know a word by its **absence**: if its heads fetch the positive words, and only those, a plain
# sentence from which they fetch nothing is negative. Two measurements test that reading. First,
# for plain sentences, does some head give the sentiment word a role in "good" sentences, in
# "bad" ones, or in both? Second, delete the sentiment word (`without_sentiment_word`: "the movie
# was bad" becomes "the movie was") and ask the model: if it reads absence, it calls these
# sentences the polarity that no head looks at.

# %%
# NBVAL_IGNORE_OUTPUT
# (your run's attention and predictions)
from mha_lib.sentiment.probes import without_sentiment_word

for name in ("plain+", "plain-"):
    on = shares[name]["sentiment word"]  # (H,): <cls>'s share on the word, per head
    print(f"{name}: share on the sentiment word per head {[f'{w:.0%}' for w in on.tolist()]}, "
          f"a role (>= {base['role']:.0%}): {bool(on.max() >= base['role'])}")
deleted = without_sentiment_word(plain)
positive = predict(model, deleted, vocab).float().mean().item()
print(f"\n{len(deleted)} plain sentences with their word deleted, e.g. {' '.join(deleted[0])!r}: "
      f"{positive:.0%} called positive")

# %%
print(findings_table(study, ["plain: one polarity's word gets a role, the other's none",
                             "plain, word deleted: read as the polarity no head looks at"]))

# %% [markdown]
# In 10 of the 24 runs that learned, no head gives the words of one polarity a role in plain
# sentences, and in all 10 the model calls the word-deleted sentences that polarity (72.5% of
# them or more, the bar of "near chance"). In the other 14, some head fetches both polarities.
#
# **A control.** A sentence without its sentiment word is one the model never saw, and it must
# call it something. So run the same test where no polarity goes unattended: those 14 runs.
# If they answer one way just as firmly, a firm answer is not the evidence; the *direction* is.
# In them a polarity can still be fetched by fewer heads (one head against two), and the
# prediction is the same: the word-deleted sentences are read as the polarity fewer heads fetch.

# %%
print(findings_table(study, ["both polarities looked at: word deleted, read one way",
                             "plain, word deleted: read as the polarity fewer heads look at"]))
counts = count_findings(study)
none_k, none_n = counts["plain, word deleted: read as the polarity no head looks at"]
fewer_k, fewer_n = counts["plain, word deleted: read as the polarity fewer heads look at"]
print(f"\nfewer heads = none: {none_k} of {none_n} runs; one head against two: {fewer_k - none_k} of {fewer_n - none_n}")
assert (none_k, none_n) == (10, 10) and (fewer_k - none_k, fewer_n - none_n) == (7, 8)

# %% [markdown]
# Firm answers are everywhere: 12 of the 14 control runs give one label to at least 72.5% of the
# word-deleted sentences. The direction is not: it goes to the polarity fewer heads fetch in 17
# of the 18 runs where there is one (all 10 where that is no head; 7 of 8 where it is one head
# against two), where a coin would pick it half the time. What this shows: with its word gone,
# the model falls back on the polarity its heads fetch less, as if "bad" were "no good word
# here". What it does not show: how the model reads real "bad" sentences. A word-deleted
# sentence tests the model's default, off its training data. Attention maps show what a model
# reads; a missing stripe can be information too.
#
# ## 6. Silencing heads, three ways
#
# Attention shows where a head *looks*, not that the model *uses* it. The test is **ablation**:
# replace a head's output and measure what breaks. The heads' outputs are concatenated, head $h$
# in features `[h·d_k, (h+1)·d_k)`, before $W_o$ mixes them (chapter 03); **zero-ablation** sets
# that slice to zero. `silence_heads(attention, heads)` (in `mha_lib.heads`) does it with a
# *forward pre-hook*, a function PyTorch calls on `W_o`'s input just before `W_o` runs, removed
# when the `with` block ends. It must agree with the computation by hand:

# %%
attn = model.layers[0].self_attn
with torch.no_grad():
    h = torch.randn(1, 6, attn.d_model).to(device)  # (B, L, d_model)
    q, k, v = (split_heads(W(h), attn.num_heads) for W in (attn.W_q, attn.W_k, attn.W_v))  # (1, H, L, d_k)
    heads, _ = scaled_dot_product_attention(q, k, v)  # (1, H, L, d_k)
    heads[:, negation_head] = 0                       # silence the negation head
    by_hand = attn.W_o(combine_heads(heads))          # (1, L, d_model)
    with silence_heads(attn, [negation_head]):
        hooked = attn(h, h, h)
    assert torch.allclose(by_hand, hooked, atol=1e-6)
    assert not torch.allclose(by_hand, attn(h, h, h), atol=1e-3)  # outside the block the head is back
print("silence_heads == zeroing the head's slice before W_o by hand")

# %% [markdown]
# But zeros are not "no report": the head never wrote them in training, so the model may read
# them as a strange report. Two replacements stay on what the model knows
# (`mha_lib.sentiment.attribution`; at `<cls>`, the one position that reaches the classifier):
#
# - **mean-ablation**: the head's mean output over the training sentences, what it says "on
#   average";
# - **resample-ablation**: its output on another training sentence drawn at random, a real
#   report about the wrong sentence.
#
# Your model, each head replaced three ways, group by group:

# %%
# NBVAL_IGNORE_OUTPUT
# (the accuracies of your run)
ablation = {}  # {(who, how): {group: accuracy}}
group_of = [("negated" if e.negated else "plain") + ("+" if e.word_is_positive else "-") for e in test]  # as four_groups
print(f"{'accuracy with ... ablated':33}" + "".join(f"{name:>10}" for name in groups))
for who, head in (("negation", negation_head), ("other", other_head)):
    for how in ABLATIONS:
        right = ablated_accuracy(model, test, vocab, [head], how, train)  # (N,) bool, as the study measures
        ablation[who, how] = {name: right[[g == name for g in group_of]].float().mean().item() for name in groups}
        print(f"{f'{how}-ablation, {who} head':33}" + "".join(f"{a:10.0%}" for a in ablation[who, how].values()))
# as in every study run that learned: without the other head, a negated group is near chance or worse
assert min(ablation["other", "mean"][name] for name in ("negated+", "negated-")) < base["near_chance"]

# %% [markdown]
# **Read each group on its own.** An average over two groups can hide what happened: 50% on
# negated sentences may be 100% on "not good" and 0% on "not bad". And 0% is not "near chance":
# the model gives the *opposite* label every time, which means it still reads something, wrongly.
# So each group's accuracy gets one of four outcomes, from the run's baselines (`outcome` in
# `mha_lib.sentiment.findings`): **still learned** (95% or more), **hurt** (below that, down to
# 72.5%), **near chance** (72.5% down to 27.5%, closer to a guess than to having learned) and
# **inverted** (below 27.5%: as far below chance as "near chance" reaches above it).
#
# Over the study's runs that learned, each head ablated each way, the number of runs with each
# outcome, group by group (still learned / hurt / near chance / inverted):

# %%
print(outcomes_table(study))

# %% [markdown]
# The same for mean-ablation, one dot per run (dashed: near chance; dotted: inverted below it):

# %%
def ablated(who, how, group):
    """A run's held-out accuracy on `group` with its negation or other head ablated `how`."""
    return lambda run: run["heads"]["ablation"][how][f"head {head_of(run, who)}"][group]


cases = [(who, "mean", name) for who in ("negation", "other") for name in groups]
labels = [f"{who} head:\n{name}" for who, _, name in cases]
fig, ax = plt.subplots(figsize=(11, 3.6), layout="constrained")
plot_runs(ax, study, {label: ablated(*case) for label, case in zip(labels, cases)}, where=two_learned,
          yours={label: ablation[who, how][name] for label, (who, how, name) in zip(labels, cases)},
          title="Held-out accuracy with one head mean-ablated, one dot per run that learned")
ax.axhline(base["near_chance"], color="grey", ls="--", lw=1)
ax.axhline(base["inverted"], color="grey", ls=":", lw=1)
plt.show()

# %%
print(findings_table(study, [name for name in ABLATION_FINDINGS if name in STATED]
                     + ["negation head, negated: zero-ablation costs more than mean",
                        "negation head, negated: resample costs more than mean"]))

# %% [markdown]
# - **The other head**: ablated any of the three ways, it leaves a negated group near chance or
#   worse in every run that learned. Mean-ablated, that group is **inverted** in most runs (wrong
#   on more than 72.5% of its sentences), and the two negated groups are never both inverted:
#   one of "not good" and "not bad" gets the wrong label while the other can stay right. The
#   other head is what tells them apart. Asserted on your model above.
# - **The negation head**: the damage lands on the sentences **without** "not". Mean-ablated, it
#   leaves a plain group near chance or worse in most runs (21 of 24), and inverted in 16 of 24
#   (both plain groups in 5): "good" sentences get the label of "not good", or "bad" ones that of
#   "not bad". Both negated groups stay learned in 15 of 24. Which plain group breaks depends on
#   the run: in the table, "good" and "bad" sentences are inverted about equally often. Why the
#   plain sentences break is the next question.
# - **The methods disagree**: the negation head zeroed leaves a plain group near chance or worse
#   in 16 of 24 runs, resampled in all 24; resampled, it also hurts the negated sentences in
#   every run, where its mean leaves both negated groups learned in 15 of 24. Zeros are a report
#   the head never gives; a resampled report is about another sentence, half the time one with
#   no "not" in it. Each measures something different: name yours with the number (Zhang and
#   Nanda, 2024).
#
# **A control for the mean.** The mean that replaces the negation head is taken over all the
# training sentences, plain and negated mixed, so it is partly a report that "not" is there, and
# mean-ablation writes that report into every plain sentence. An inverted plain group may be the
# model reading that "not", not the loss of anything the head does. So replace the head with its
# mean over the plain sentences only, on average "no 'not' here", and, the other way, with its
# mean over the negated ones only: the same `ablated_accuracy`, another reference. Your model:

# %%
# NBVAL_IGNORE_OUTPUT
# (the accuracies of your run)
references = {"all": train, "plain only": [e for e in train if not e.negated],
              "negated only": [e for e in train if e.negated]}
print(f"{'negation head, mean over ...':33}" + "".join(f"{name:>10}" for name in groups))
for kind, reference in references.items():
    right = ablated_accuracy(model, test, vocab, [negation_head], "mean", reference)  # (N,) bool
    print(f"{kind:33}" + "".join(f"{right[[g == name for g in group_of]].float().mean().item():10.0%}"
                                 for name in groups))

# %% [markdown]
# The study records both (`"mean_from"` in each two-head run); over its runs that learned,
# outcomes as above:

# %%
print(outcomes_table(study, [("negation", how) for how in ("mean", *MEAN_CONTROLS)]), "\n")
print(findings_table(study, [name for name in CONTROL_FINDINGS if name in STATED]))

# %% [markdown]
# Read the rows top to bottom. Written into plain sentences, the head's mean over **negated**
# sentences inverts a plain group in all 24 runs: the model reads this head's output as a yes or
# no about "not", and a "yes" makes "good" read as "not good". The mean over all sentences
# carries part of that "yes", and that is part of why the plain sentences broke above: with the
# mean over **plain** sentences only, a plain group is near chance or worse in 12 of 24 runs
# (inverted in 10), against 21 (16) with the mixed mean, and those 12 are among the 21. So the
# reading "needed to report that no 'not' is there" was in part the mixed mean's artefact. What
# the control supports: the model reads the negation head as a report of "not" either way. In negated
# sentences its average report is all the model needs from it (both negated groups stay learned
# with the negated-only mean in 23 of 24 runs); in plain sentences the average "no 'not'" keeps
# both plain groups above near chance in only 12 of 24. In the other 12 the model needs the
# head's own report, sentence by sentence, and this control does not say what in it.
#
# ## 7. What each head adds to the logit
#
# **Direct logit attribution** leaves the model alone and splits its answer. After the layer,
# `<cls>`'s vector $x$ is a **sum**: its embedding, one term per head (its output through its
# slice of $W_o$), $W_o$'s bias and the feed-forward output. The classifier reads
# $\text{LayerNorm}(x)$, whose scale $\sigma$ is the one non-linear step; holding $\sigma$ at
# its value for the sentence, the logit difference is a sum of one part per term $t$:
#
# $$\text{logit}_+ - \text{logit}_- = \sum_{t} w \cdot \frac{\gamma \odot (t - \bar t)}{\sigma} + \text{const}$$
#
# with $\bar t$ the mean of $t$'s entries, $w$ the difference of the classifier's two rows,
# $\gamma, \beta$ the LayerNorm's gain and bias, and const $= w \cdot \beta + b_+ - b_-$
# (Elhage et al., 2021). *Direct*: what a head does through the feed-forward network counts
# as the network's. The parts add up to the logit difference exactly:

# %%
# NBVAL_IGNORE_OUTPUT
# (your run's attributions)
with torch.no_grad():
    logits = model(batch_examples(negated, vocab).to(device)).cpu()  # (N, 2)
terms = logit_attribution(model, negated, vocab)  # {term: (N,)}
assert torch.allclose(sum(terms.values()), logits[:, 1] - logits[:, 0], atol=1e-4)
print("the terms add up to the logit difference")
toward = {}  # {group: {term: mean push toward the right label}}
for name, examples in groups.items():
    sign = torch.tensor([1.0 if e.label else -1.0 for e in examples])  # + pushes toward the right label
    toward[name] = {term: (value * sign).mean().item()
                    for term, value in logit_attribution(model, examples, vocab).items()}
print(f"\n{'toward the right label':24}" + "".join(f"{name:>10}" for name in groups))
for term in terms:
    print(f"{term:24}" + "".join(f"{toward[name][term]:10.2f}" for name in groups))

# %% [markdown]
# Each number is a term's mean push toward the right label, in logits. Over the study:

# %%
def pushes(term, kind):
    """A run's mean push toward the right label of a term over "negated" or "plain" sentences."""
    def value(run):
        key = "feed-forward" if term == "feed-forward" else f"head {head_of(run, term)}"
        return sum(run["heads"]["logit_attribution"][kind + sign][key] for sign in "+-") / 2
    return value


def yours_push(term, kind):
    """The same for your model (from the table above)."""
    key = {"negation": f"head {negation_head}", "other": f"head {other_head}"}.get(term, term)
    return (toward[kind + "+"][key] + toward[kind + "-"][key]) / 2


cases = [(term, kind) for kind in ("negated", "plain") for term in ("negation", "other", "feed-forward")]
labels = [f"{term}{'' if term == 'feed-forward' else ' head'}:\n{kind}" for term, kind in cases]
fig, ax = plt.subplots(figsize=(10, 3.4), layout="constrained")
plot_runs(ax, study, {label: pushes(*case) for label, case in zip(labels, cases)}, where=two_learned,
          yours={label: yours_push(*case) for label, case in zip(labels, cases)}, percent=False,
          chance=False, ylabel="logits toward the right label",
          title="Direct logit attribution, one dot per run that learned")
ax.axhline(0, color="grey", lw=1)
plt.show()
print(findings_table(study, ["negated: other head's logit term > negation head's",
                             "feed-forward term toward the right label in every group",
                             "without the feed-forward network: still learned"]))

# %%
# NBVAL_IGNORE_OUTPUT
# (your run's accuracy without its feed-forward network)
with feed_forward_off(model):
    no_ffn = evaluate(model, test, vocab)
print(f"your model without its feed-forward network: "
      f"negated {no_ffn['negated']:.0%}, plain {no_ffn['plain']:.0%}")

# %% [markdown]
# In negated sentences, the other head pushes toward the right label more than the negation head
# in most runs, as the ablations said. The feed-forward term pushes toward it in every group of
# every run, yet with it switched off after training (`feed_forward_off`), 16 of 24 models still
# reach 95% on both groups. Attribution asks what a term contributes, ablation what the model
# needs.
#
# ## 8. How many heads does the task need?
#
# The study trained the same model with 1, 2, 4 and 8 heads at `d_model = 48`, so each head has
# `d_k = 48 / H` features: more heads, each narrower. The comparison is **paired**: run *s* of
# every head count draws the same sentences (data seed *s*) and the same shuffling, so two head
# counts differ in their model, not in their data.


# %%
def median_or_dash(values):
    return f"{median(values):g}" if values else "-"


def heads_with_role(run):
    """How many heads have a role for "not", and how many for the sentiment word (negated)."""
    role, heads = run["baselines"]["role"], range(run["num_heads"])
    on_not = sum(share >= role for share in run["heads"]["cls_to_not"])
    return on_not, sum(on_word(run["heads"]["cls_shares"], h) >= role for h in heads)


print(f"{'H':>2} {'d_k':>4} {'learned':>9} {'negated, median':>16} {'heads on not':>13}"
      f" {'heads on word':>14}")
for H_ in (1, 2, 4, 8):
    runs = [r for r in study.runs if independent(r, H_) and "heads" in r]
    roles_ = [heads_with_role(r) for r in runs if learned(r)]
    negated_accuracy = median(r["heads"]["accuracy"]["negated"] for r in runs)
    print(f"{H_:>2} {48 // H_:>4} {sum(map(learned, runs)):>3} of {len(runs):<2} {negated_accuracy:16.0%}"
          f" {median_or_dash([n for n, _ in roles_]):>13} {median_or_dash([w for _, w in roles_]):>14}")
print("(heads with a role for 'not' / for the sentiment word: the median over the runs that learned)\n")
print(findings_table(study, [name for name in FINDINGS if name[0].isdigit()]))

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.2), layout="constrained")
rng = np.random.default_rng(0)
for x, H_ in enumerate((1, 2, 4, 8)):
    runs = [r for r in study.runs if independent(r, H_) and "heads" in r]
    values = [r["heads"]["accuracy"]["negated"] for r in runs]
    ax.scatter(x + rng.uniform(-0.2, 0.2, len(values)), values, s=14, alpha=0.6, linewidths=0,
               color=["tab:blue" if learned(r) else "tab:orange" for r in runs])
ax.axhline(0.5, color="grey", ls=":", lw=1, label="chance (50%)")
ax.axhline(base["learned_at"], color="tab:blue", ls="--", lw=1, label=f"learned ({base['learned_at']:.0%})")
ax.axhline(base["near_chance"], color="tab:orange", ls="--", lw=1, label=f"near chance (< {base['near_chance']:.1%})")
ax.legend(fontsize=8, loc="lower right")
ax.set_xticks(range(4), [f"H = {H_}\nd_k = {48 // H_}" for H_ in (1, 2, 4, 8)])
ax.set(ylabel="held-out accuracy, negated", ylim=(-0.03, 1.03),
       title="One dot per independent run (blue: learned; orange: did not)")
ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
plt.show()

# %% [markdown]
# (Orange dots at or above 95%: runs whose plain sentences fell short.)
#
# **Why not one head?** The label is an *exclusive or* of two facts: is there a "not", and is the
# word positive? With one head, `<cls>` receives one weighted average of value vectors per
# sentence. Take the extreme first, a head that puts (nearly) all its attention on the one
# token with the highest score among those present. Whatever order the scores of "not",
# "good" and "bad" take, two sentences that need opposite labels receive the same token, and so
# the same vector, whatever reads it afterwards:

# %%
from itertools import combinations, permutations

group_tokens = {"good": ("good",), "bad": ("bad",), "not good": ("not", "good"), "not bad": ("not", "bad")}
label = {"good": "+", "bad": "-", "not good": "-", "not bad": "+"}
for order in permutations(("not", "good", "bad")):  # highest score first
    sent = {g: min(tokens, key=order.index) for g, tokens in group_tokens.items()}  # the top token present
    clash = [f"{a} / {b}" for a, b in combinations(group_tokens, 2) if sent[a] == sent[b] and label[a] != label[b]]
    print(f"{' > '.join(order):16} sends: " + ", ".join(f"{g} -> {t}" for g, t in sent.items())
          + f"   same token, opposite labels: {', '.join(clash)}")
    assert clash

# %% [markdown]
# A head that **splits** its attention the same way in both negated sentences does no better
# for a read-out that is linear. Say it gives "not" a share `a` and the word `1 - a` in "not
# good" and in "not bad", and a fixed vector `w` reads the mix. Then the difference between "not
# good" and "not bad" is `(1 - a) · w·(v_good - v_bad)`: the same sign as between "good" and
# "bad", only smaller. A read-out that puts "good" above "bad" puts "not good" above "not bad",
# the wrong way round, whatever `w` and `a` (checked below on random vectors). One head has two
# ways out: a split that differs between the two sentences (its scores do depend on which word
# is there, and the extreme above shows where that ends), or a non-linear step after the head,
# the feed-forward network or the LayerNorm. So the argument is about one head whose mix is read
# linearly; it does not prove that no one-head model can learn the task. What the one-head runs
# did is counted below.

# %%
g = torch.Generator().manual_seed(0)
v_not, v_good, v_bad = torch.randn(3, 24, generator=g)  # three value vectors of one head (d_k = 24)
for a in (0.2, 0.5, 0.8):
    for w in torch.randn(100, 24, generator=g):  # 100 linear read-outs
        plain_gap = w @ (v_good - v_bad)  # what the read-out gives "good" minus "bad"
        negated_gap = w @ ((a * v_not + (1 - a) * v_good) - (a * v_not + (1 - a) * v_bad))
        assert torch.isclose(negated_gap, (1 - a) * plain_gap, atol=1e-5)  # same sign, scaled by 1 - a
print("every read-out: ('not good' - 'not bad') = (1 - a) * ('good' - 'bad')")

# %% [markdown]
# Did the one-head runs fall into this? For each, which token its head sends `<cls>` in each
# group (the role that gets at least the `role` share of its attention, if any), which pairs of
# groups with opposite labels get the same token (`colliding_pairs` in
# `mha_lib.sentiment.findings`: "not" in both negated groups, a word of one polarity with and
# without "not", `<cls>` or the other words anywhere), and how the weaker group of such a pair
# does:

# %%
one_head = [r for r in study.runs if independent(r, 1) and "heads" in r]
for r in one_head[:6]:
    sent = {name: sent_token(r, name, 0) for name in LABELS}
    print(f"seed {r['seed']}: " + ", ".join(f"{name} -> {t}" for name, t in sent.items())
          + f"  | collide: {colliding_pairs(r)}")
print("...\n")
print(findings_table(study, ["1 head: two groups with opposite labels get the same token",
                             "1 head: the weaker group of a colliding pair near chance or worse"]))

# %% [markdown]
# In most one-head runs (22 of 24) the head sends the same token to two groups that need
# opposite labels, and in every one of those runs the weaker of the two groups is near chance or
# worse: the collision of the first cell, in trained models. Two heads can send two different tokens, and
# in section 5 they did: in most runs the negation head sends "not", while the other head sends
# the word in one negated group and "not" in the other.
#
# - **One head never learned**, and stayed near chance on negated sentences in 15 of 24 runs,
#   although it is the widest.
# - **Narrow heads did not hold the model back.** Bhojanapalli et al. (2020) show that a head
#   whose `d_k` is below the sequence length cannot form every `L × L` attention map, every
#   query's row at once. Here only one row, `<cls>`'s, reaches the classifier, and eight heads
#   of 6 features learned in every run: the bound is about the whole map, which this task never
#   needs.
# - **Roles spread**: two or more heads look at "not" in 11 of 23 four-head runs that learned and
#   in most eight-head runs, yet mean-ablating one head leaves a group near chance or worse in
#   every 2- and 4-head run and most 8-head runs. In large transformers many heads can go (Michel et al., 2019; Voita et al.,
#   2019); here, at least one cannot.
#
# ## 9. What held, and what didn't
#
# Every finding of this chapter in one table. The wording is what the text says; the cell fails
# if a re-run study stops supporting it (`STATED` in `mha_lib.sentiment.findings`). The course's
# tests also train two seeds outside the study, chosen in advance, and check the "all" findings.

# %%
print(findings_table(study))

# %% [markdown]
# The seed decides which head becomes the negation head and in which negated group the other
# head brings the word; in a few seeds, the CPU decides whether a run learns. The heads do
# specialize, less cleanly than detectives: a head's name says where it looks, and only an
# ablation read group by group, with a control for what the replacement itself reports, says what
# the model needs it for (the "negation head": a report of "not" either way). Only counts over
# independent runs, against thresholds fixed in advance, tell the model from the accident.

# %% [markdown]
# ## Recap
#
# - An **encoder layer** is self-attention and a position-wise feed-forward network, each with
#   a residual connection, dropout and layer normalization; `mha_lib.EncoderLayer` is
#   **pre-norm** and equals `nn.TransformerEncoderLayer(norm_first=True)`.
# - Shapes: `(B, L, d_model)` in and out; attention weights `(B, H, L, L)`.
# - A claim about trained models is a count over **independent runs**, against thresholds
#   derived in advance from baselines (chance, uniform attention); the untrained model is a
#   check that random weights don't already pass them. "Most" means more than two runs in three;
#   two thirds or fewer, and the count is given.
# - Two heads: a **negation head** and a head that brings the sentiment word, in most runs.
#   Read group by group, ablation says what each is needed for. Without the other head (zero,
#   mean or resample), a negated group breaks in every run (mean-ablated, inverted in most). The
#   negation head is read as a report of "not" either way: its mean over negated sentences
#   inverts a plain group in 24 of 24 runs; mean-ablated over all sentences, it breaks a plain
#   group in 21 of 24, but over plain sentences only, in 12 of 24: the other 9 broke only under
#   the mean that carries part of a "not". An **inverted** group (below 27.5%) is not one near
#   chance.
# - A model can read a word by its **absence**: in 10 of 24 runs no head looks at one polarity's
#   words, and a sentence without a sentiment word is read as that polarity (10 of 10). Runs that
#   look at both also answer firmly (12 of 14): the evidence is the direction, toward the
#   polarity fewer heads fetch (17 of 18), and it speaks of the model's default only.
# - The task is an **exclusive or**. One head read out linearly cannot compute it when it sends
#   `<cls>` one token, or the same split of two tokens in both negated sentences; the argument
#   leaves out splits that change with the word and the non-linear steps after the head. Trained,
#   one head learned in 0 of 24 runs, and in 22 of 24 it sent the same token to two groups with
#   opposite labels.
# - **Zero-, mean- and resample-ablation** can disagree: report which you used. **Direct logit
#   attribution** splits the logit difference into terms (embedding, each head, `W_o`'s bias,
#   feed-forward), the LayerNorm scale frozen.
# - One wide head never learned this task; eight narrow ones learned in all 24 runs.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/07_heads_at_work.ipynb`; each exercise checks
# itself and tells you what is wrong. See the README for how to start your own copy.
#
# ## What comes next
#
# Here each head worked alone. In **chapter 08** heads of two layers compose: a second-layer
# *induction head* needs what a first-layer head wrote. Chapter 10 makes attention fast; the
# last chapter restricts this chapter's heads to half of the sentence each.
