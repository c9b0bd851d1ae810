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
# Chapters 02 to 05 built multi-head attention and proved it right. Every head there had random
# or hand-set weights. This chapter trains a model and asks the question the sources raise: do
# the heads of a trained model really **specialize**, like detectives who each look for a
# different clue? We answer with measurements, not with pictures alone, and the measured
# answer is less tidy than the metaphor.
#
# **By the end of this chapter you will be able to**
#
# - build a transformer **encoder layer** from `MultiHeadAttention`, a feed-forward network,
#   residual connections, dropout and layer normalization, explain the pre-norm / post-norm
#   choice, and prove the layer equal to `nn.TransformerEncoderLayer`;
# - generate a small sentiment task with negations ("the movie was not bad" is positive), and
#   turn its sentences into padded batches of token ids;
# - train a two-head classifier on it in seconds on a CPU, and report its held-out accuracy on
#   negated and on plain sentences;
# - **measure** what each head attends to, and **silence** heads one at a time (ablation) to
#   measure what each one contributes;
# - judge how robust such a finding is by repeating the experiment with other seeds.
#
# *Sources.* "The movie was not bad", where the relation between "not" and "bad" decides the
# sentiment, is from *Transformers in Action* (Manning), section 1.1.4; its section 2.2.1 puts
# multi-head attention into an encoder layer with a feed-forward network, residual connections,
# dropout and normalization. Heads as spotlights and as detectives who each look for a different
# clue are from Priyesh Dave's post "Day 28: Multi-Head Attention" (DEV Community). Also cited:
# Vaswani et al., "Attention Is All You Need" (2017); Xiong et al., "On Layer Normalization in
# the Transformer Architecture" (2020); Devlin et al., "BERT" (2019); Michel et al., "Are
# Sixteen Heads Really Better than One?" (2019); Voita et al., "Analyzing Multi-Head
# Self-Attention" (2019).

# %% [markdown]
# ## Set-up
#
# As in every chapter: pick the device (set `MHA_DEVICE=cpu` to force the CPU) and seed the
# random generators.

# %%
import matplotlib.pyplot as plt
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
from mha_lib.sentiment.plots import plot_runs
from mha_lib.sentiment.study import FINDINGS, check_findings, learned, negation_head_of

device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. The encoder layer
#
# Multi-head attention is one half of a transformer **encoder layer**. The layer has two
# *sublayers*:
#
# 1. **multi-head self-attention**: every token gathers information from the other tokens;
# 2. a **position-wise feed-forward network**: every token's vector, on its own, goes through
#    the same small two-layer network, `Linear(d_model, d_ff) → ReLU → Linear(d_ff, d_model)`.
#    Attention mixes *across* positions; the feed-forward network transforms *each* position.
#
# The book wraps each sublayer in three things:
#
# - a **residual connection**: the sublayer's output is *added* to its input, `x + sublayer(x)`.
#   The sublayer only has to learn a correction to `x`, and the gradient has a direct path
#   back through the `+`, which keeps deep stacks trainable;
# - **dropout** on the sublayer's output, in training only: random entries are zeroed (and the
#   rest scaled up) so that the model can't rely on any single feature;
# - **layer normalization**: each token's vector is shifted and scaled to mean 0 and variance 1
#   over its `d_model` features (then multiplied and shifted by two learned vectors). It keeps
#   the numbers in a steady range however many layers are stacked.
#
# Layer norm works token by token: here one token's 8 features, whatever their size, come out
# with mean 0 and standard deviation 1.

# %%
norm = nn.LayerNorm(8)
token = 5 * torch.randn(1, 1, 8) + 3  # (B, L, d_model) with large, off-centre features
normalized = norm(token)
print(f"before: mean {token.mean():.2f}, std {token.std(unbiased=False):.2f}")
print(f"after:  mean {normalized.mean().abs():.2f}, std {normalized.std(unbiased=False):.2f}")

# %% [markdown]
# **Where does the normalization go?** The original Transformer (and the book's description)
# normalizes *after* adding the residual, **post-norm**:
#
# $$x \leftarrow \text{LayerNorm}\big(x + \text{Dropout}(\text{Sublayer}(x))\big)$$
#
# Most models today normalize the sublayer's *input* instead, **pre-norm**:
#
# $$x \leftarrow x + \text{Dropout}\big(\text{Sublayer}(\text{LayerNorm}(x))\big)$$
#
# `mha_lib.EncoderLayer` is pre-norm. The residual path then carries `x` through the layer
# untouched, the gradients stay well scaled at the start of training, and the model trains
# stably without the learning-rate *warm-up* that post-norm needs (Xiong et al., 2020). The
# price: a stack of pre-norm layers ends with one more `LayerNorm`, because nothing normalizes
# the last layer's output. PyTorch calls this `nn.TransformerEncoderLayer(..., norm_first=True)`.
#
# Here is the layer, with the tiny sizes of chapter 03 (`d_model` 8, 2 heads) and
# `d_ff = 4 · d_model` as in the paper:

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
# with 7 positive and 7 negative sentiment words, and distractors everywhere else: determiners,
# subjects, verbs, neutral adjectives ("long", "french"), intensifiers ("really") and endings
# ("to me", "in the end"; "at all" only after a "not"). The **label is the sentiment after
# negation**: "not" flips it. Half the sentences are negated, so reading the sentiment word
# alone gets every negated sentence wrong, and "not" alone says nothing about the label: the
# model must relate the two words, exactly the point of the book's "The movie was not bad".
#
# The generator is seeded, and the held-out sentences are different from the training ones.

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
# 1. **token embedding + learned position embedding**: attention itself ignores word order
#    (chapter 02), so each position gets a learned vector added (chapter 06's learned table);
# 2. **one `EncoderLayer`** with `d_model = 48`, **2 heads** of 24 features and `d_ff = 96`;
# 3. a final `LayerNorm` (the layer is pre-norm);
# 4. a linear **classifier** on the vector of `<cls>`: two logits, negative and positive.
#
# `<cls>` is a token without a meaning of its own (BERT uses the same trick). It attends to the
# sentence like every other token, and what its heads bring back is all that changes from one
# sentence to the next in what the classifier sees (`<cls>` itself is always the same). So
# in this one-layer model only **the `<cls>` row of each attention map reaches the prediction**:
# that is the row to watch.
#
# The model also accepts an extra mask (`forward(tokens, mask=...)`, combined with the padding
# mask), e.g. a per-head `(H, L, L)` mask; chapter 11 uses it to restrict the heads.

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
# `train_model` runs AdamW (learning rate 0.005) on the cross-entropy loss: 12 passes (epochs)
# over the 2000 training sentences in batches of 32, and prints a progress line every 3 epochs
# with the loss, the training accuracy and the held-out accuracy on negated and plain sentences.
#
# Two choices keep it fast and comparable. Dropout is 0: with 2000 different sentences the
# model has little to overfit, and without random dropout masks a run depends on its seed
# alone. And the model trains on **one CPU thread**: its operations are too small to share out,
# and on a busy machine threads that wait for each other slow every step down. `mha_lib` never
# changes the number of threads behind your back; this notebook asks for one thread itself, in
# the next cell, as the seed study below did.
#
# **One run is one sample.** Even seeded, a training run is not the same on every machine.
# Another CPU, or a GPU, rounds the last bit of some sums differently; over some 750 optimizer
# steps such differences grow until the run takes another path (even the number of threads
# changes the order of the additions). So this chapter never tells you what *your* run printed.
# It quotes a **seed study**: this model trained from 30 seeds on three of PyTorch's CPU kernel
# paths (AVX-512, AVX2 and plain C++, chosen with the environment variable
# `ATEN_CPU_CAPABILITY`), measured exactly as below. It ships with the course
# (`mha_lib/sentiment/study.json`; `make study` re-runs it), and cells of this chapter read it.
# What held in every run of it is asserted on your model, where the text states it.

# %%
torch.set_num_threads(1)  # this notebook's choice: a model this small trains fastest on one thread
study = load_study()
print(f"seed study: {len(study.runs)} runs = {len(study.seeds)} seeds x {len(study.paths)} kernel paths {study.paths},")
print(f"PyTorch {', '.join(sorted({run['torch'] for run in study.runs}))}, "
      f"{', '.join(str(n) for n in sorted({run['threads'] for run in study.runs}))} thread per run")
assert (len(study.seeds), len(study.paths)) == (30, 3)

# %% [markdown]
# Now train the model of section 3 (seed 0). The cell prints timings and the numbers of your
# run, so the course's tests run it without comparing its output.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings, and the digits of a training run, vary by machine)
history = train_model(model, train, vocab, test=test, epochs=12, batch_size=32, lr=5e-3, seed=0)

# %% [markdown]
# **Did it learn?** In the study, most runs reached at least 95% on both groups, but not all:

# %%
k, n = study.count(learned)
print(f"runs with at least 95% on negated and on plain sentences: {k} of {n}")
for path in study.paths:
    k_path, n_path = study.count(learned, path)
    below = [run["seed"] for run in study.runs if run["path"] == path and not learned(run)]
    print(f"  {path:8} {k_path} of {n_path}; below: seeds {below}")
stuck = [run for run in study.runs if run["seed"] in (7, 12) and not learned(run)]
print("seeds 7 and 12 below 95%:", [(run["seed"], run["path"]) for run in stuck],
      "- <cls>'s share on 'not' (negated sentences), head 0 and head 1:",
      [f"{run['heads']['cls_to_not'][0]:.0%} {run['heads']['cls_to_not'][1]:.0%}" for run in stuck])
assert (k, n) == (76, 90) and all(learned(run) for run in study.runs if run["seed"] == 0)
assert len(stuck) == 4 and all(min(run["heads"]["cls_to_not"]) >= 0.85 and run["heads"]["accuracy"]["negated"] < 0.55
                               for run in stuck)  # both heads on "not", negated sentences at chance

# %% [markdown]
# Seeds 7 and 12 stayed at chance on negated sentences on two kernel paths, and learned on the
# third: **the same seed on another CPU is another run**. In those four runs *both* heads had
# locked onto "not" with most of `<cls>`'s attention (89% or more), so nothing brought the sentiment
# word of a negated sentence, and a saturated softmax has almost no gradient to get out of that
# (chapter 01). Other runs fell a little short, on plain or on negated sentences.
#
# Seed 0, trained above, learned on all three paths. Should it fall short on your machine
# anyway, the next cell trains again from the next seed (at most twice), so that the rest of
# the chapter studies a model that learned the task; the assert says it did.

# %%
# NBVAL_IGNORE_OUTPUT
# (the accuracy of your run; the assert checks what must hold)
seed = 0
while min(evaluate(model, test, vocab)[group] for group in ("negated", "plain")) < 0.95 and seed < 2:
    seed += 1
    print(f"seed {seed - 1} fell short of 95%; training again from seed {seed}")
    seed_everything(seed)
    model = SentimentClassifier(len(vocab), d_model=48, num_heads=2, num_layers=1, d_ff=96).to(device)
    history = train_model(model, train, vocab, test=test, epochs=12, batch_size=32, lr=5e-3, seed=seed, reports=0)
accuracy = evaluate(model, test, vocab)
assert accuracy["negated"] >= 0.95 and accuracy["plain"] >= 0.95, accuracy
print(f"held-out accuracy of your model (seed {seed}): negated {accuracy['negated']:.0%}, plain {accuracy['plain']:.0%}")

# %% [markdown]
# The curves show how it learned: yours in colour, every run of the study in grey (the model
# of each run is the free model of section 3, trained as above from its own seed).

# %%
epochs = range(1, len(history["loss"]) + 1)
fig, axes = plt.subplots(1, 3, figsize=(12, 3.3), layout="constrained")
axes[0].plot(epochs, history["loss"], "o-")
axes[0].set(xlabel="epoch", ylabel="cross-entropy", title="Training loss (your run)")
for ax, group, colour in ((axes[1], "plain", "tab:blue"), (axes[2], "negated", "tab:orange")):
    for run in study.runs:
        ax.plot(epochs, run["heads"]["history"][group], color="grey", alpha=0.15, lw=1)
    ax.plot(epochs, history[f"test_{group}"], "o-", color=colour, label="your run")
    ax.axhline(0.5, color="grey", ls=":", label="chance")
    ax.set(xlabel="epoch", ylabel="held-out accuracy", ylim=(0, 1.05), title=f"{group.capitalize()} sentences")
    ax.legend(loc="lower right")
plt.show()


# %%
def epoch_reaching(accuracies, level=0.9):
    """The first epoch at which the accuracy reaches `level` (None if never)."""
    return next((epoch for epoch, acc in enumerate(accuracies, start=1) if acc >= level), None)


def plain_not_later(run):
    curves = run["heads"]["history"]
    plain, negated = epoch_reaching(curves["plain"]), epoch_reaching(curves["negated"])
    return plain is not None and (negated is None or plain <= negated)


k, n = study.count(plain_not_later)
print(f"plain sentences reached 90% no later than negated ones in {k} of {n} runs")
assert (k, n) == (77, 90)

# %% [markdown]
# In 77 of the 90 runs, plain sentences reached 90% no later than negated ones: the model
# usually reads the sentiment word first and relates it to "not" afterwards, in some runs with
# a dip while it reorganizes what its heads do. The grey curves also show the runs that never
# got there.
#
# A few sentences of our own, and whether the model saw them in training ("not bad" alone fits
# none of the templates). These are your model's answers, so the course's tests don't compare
# them.

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
# Each head has its own attention map. Rows are queries (the token that looks), columns are
# keys (the tokens looked at). Remember: only the `<cls>` row, the top one, reaches the
# classifier; the other rows are computed but, in this one-layer model, never used.

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
# Now only the `<cls>` rows, for several sentences, negated and plain, with positive and
# negative sentiment words:

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
            ax.text(j, h, f"{w:.2f}", ha="center", va="center", fontsize=8, color="white" if w > 0.6 else "black")
    ax.set_xticks(range(len(words)), words)
    ax.set_yticks(range(cls_rows.size(0)), [f"head {h}" for h in range(cls_rows.size(0))])
fig.suptitle("Where <cls> looks, head by head (your model)")
fig.tight_layout()
plt.show()

# %% [markdown]
# Often a head puts almost all of `<cls>`'s attention on a single word, and which word depends
# on the sentence: "not", a sentiment word, or something else. Five sentences can mislead,
# though, so let's **measure**. The held-out sentences fall into four groups: plain or negated,
# with a positive or a negative sentiment word; call them "good", "bad", "not good" and
# "not bad" for short (+ and − below). For each group and each head, `attention_shares`
# averages the share of `<cls>`'s attention that goes to `<cls>` itself, to "not", to the
# sentiment word and to all other words.

# %%
# NBVAL_IGNORE_OUTPUT
# (the attention of your run)
groups = four_groups(test)  # {"plain+": [...], "plain-": [...], "negated+": [...], "negated-": [...]}
shares = {name: attention_shares(model, examples, vocab) for name, examples in groups.items()}
roles = list(shares["plain+"])  # <cls>, not, sentiment word, other words
H = model.num_heads

print("held-out sentences per group:", ", ".join(f"{name} {len(ex)}" for name, ex in groups.items()))
for h in range(H):
    print(f"\n{f'head {h}: <cls> attends to':22}" + "".join(f"{role:>16}" for role in roles))
    for name in groups:
        print(f"  {name:20}" + "".join(f"{shares[name][role][h].item():16.0%}" for role in roles))

# %% [markdown]
# **The negation head.** Call the head that puts more of `<cls>`'s attention on "not" in the
# negated sentences the **negation head**, and the other one the **other head**. The next cell
# finds out which is which in your model; the text never assumes it, because which head takes
# the job is chance: head 0 in 41 of the 76 runs of the study that learned, head 1 in 35. That
# there is one is not: in all 76 runs, the negation head's share exceeded the other head's by at
# least 10 percentage points (by 36 or more in 75 of them), and in 74 it was 60% or more.

# %%
# NBVAL_IGNORE_OUTPUT
# (which head it is, and its shares, depend on your run)
negated = groups["negated+"] + groups["negated-"]
plain = groups["plain+"] + groups["plain-"]
not_share = attention_shares(model, negated, vocab)["not"]  # (H,)
negation_head = int(not_share.argmax())
other_head = 1 - negation_head
print(f"the negation head of your model: head {negation_head}; the other head: head {other_head}")
print("share of <cls>'s attention on 'not' in negated sentences:",
      ", ".join(f"head {h} {not_share[h].item():.0%}" for h in range(H)))
assert not_share[negation_head] - not_share[other_head] >= 0.10  # held in all 76 runs that learned

# %%
def share_on_not(head):
    """A run's <cls> share on "not" (negated sentences) of its negation head or of its other head."""
    return lambda r: r["heads"]["cls_to_not"][negation_head_of(r) if head == "negation" else 1 - negation_head_of(r)]


head_0, learned_runs = study.count(lambda r: negation_head_of(r) == 0, where=learned)
gaps = study.values(lambda r: share_on_not("negation")(r) - share_on_not("other")(r), where=learned)
print(f"head 0 is the negation head in {head_0} of the {learned_runs} runs that learned")
at_60 = study.count(lambda r: share_on_not("negation")(r) >= 0.6, where=learned)[0]
print(f"negation head's share minus the other's: {min(gaps):.0%} to {max(gaps):.0%}, "
      f"at least 36 points in {sum(g >= 0.36 for g in gaps)} runs; negation head at 60% or more in {at_60}")
assert (head_0, learned_runs, f"{min(gaps):.0%}", sum(g >= 0.36 for g in gaps), at_60) == (41, 76, "10%", 75, 74)
fig, ax = plt.subplots(figsize=(7.5, 3.4), layout="constrained")
plot_runs(ax, study, {"negation head": share_on_not("negation"), "other head": share_on_not("other")},
          where=learned, yours={"negation head": not_share[negation_head].item(), "other head": not_share[other_head].item()},
          ylabel="share of <cls>'s attention on 'not'", chance=False,
          title="Negated sentences: <cls>'s attention on 'not', one dot per run that learned")
plt.show()

# %% [markdown]
# Every dot is one trained model; the star is yours. Its exact place varies by machine; the
# assert above checks that your model has a negation head by the study's margin.
#
# **What the other head brings.** In negated sentences the negation head looks at "not", so
# the sentiment word, the other half of the clue, must come from the other head. It does, for
# one polarity: in 75 of the 76 runs that learned, the other head put at least 90% of `<cls>`'s
# attention on the sentiment word in exactly one of the two groups "not good" and "not bad"
# (the positive word in 42 runs, the negative one in 33; in the last run, in both). So "not
# good" and "not bad" reach `<cls>` as different pairs of reports: (not, sentiment word) in one,
# (not, something else) in the other. Neither head computes the answer; each reports where it
# found a clue.

# %%
# NBVAL_IGNORE_OUTPUT
# (your run's shares)
word_share = {name: shares[name]["sentiment word"][other_head].item() for name in ("negated+", "negated-")}
print("the other head's share on the sentiment word:", ", ".join(f"{name} {s:.0%}" for name, s in word_share.items()))
assert max(word_share.values()) >= 0.90  # held in all 76 runs that learned (the lowest: 96%)


# %%
def other_head_on_word(run, group):
    return run["heads"]["cls_shares"][group]["sentiment word"][1 - negation_head_of(run)] >= 0.9


k_pos = study.count(lambda r: other_head_on_word(r, "negated+"), where=learned)[0]
k_neg = study.count(lambda r: other_head_on_word(r, "negated-"), where=learned)[0]
k_one = study.count(lambda r: other_head_on_word(r, "negated+") != other_head_on_word(r, "negated-"), where=learned)[0]
print(f"other head on the sentiment word in exactly one negated group: {k_one} of {learned_runs} runs; "
      f"in 'not good': {k_pos}, in 'not bad': {k_neg}")
assert (k_one, k_pos, k_neg) == (75, 43, 34)

# %% [markdown]
# How cleanly each head keeps to one kind of word, and how much the two heads overlap, are not
# robust either:

# %%
def favourite(run, group, head):
    """The kind of word that gets most of <cls>'s attention from this head in this group."""
    shares = run["heads"]["cls_shares"][group]
    return max(shares, key=lambda role: shares[role][head])


groups_06 = ["plain+", "plain-", "negated+", "negated-"]
clean = study.values(lambda r: [max(s[h] for s in r["heads"]["cls_shares"][g].values()) >= 0.9
                                for g in groups_06 for h in (0, 1)], where=learned)
overlap = study.values(lambda r: sum(favourite(r, g, 0) == favourite(r, g, 1) for g in groups_06), where=learned)
print(f"a head put 90% or more on one kind of word in {sum(map(sum, clean))} of {8 * len(clean)} "
      f"(run, group, head) cases")
print("groups in which both heads mostly look at the same kind of word:",
      {n: overlap.count(n) for n in range(5) if overlap.count(n)}, "runs")
assert (sum(map(sum, clean)), [overlap.count(n) for n in range(5)]) == (461, [4, 25, 40, 7, 0])

# %% [markdown]
# A head put 90% or more of `<cls>`'s attention on one kind of word in three cases out of four
# (461 of 608), and the two heads' favourite kinds of word coincided in anything from 0 to 3
# of the four groups (2 in 40 of the 76 runs). So don't read a division of labour off a single
# table like yours above; read what the runs have in common.
#
# **What does the classifier read?** Not the heads directly. After the layer, `<cls>`'s vector
# is its own embedding, plus what `W_o` makes of the two heads' outputs, plus the feed-forward
# network's correction; the final `LayerNorm` normalizes it and one linear map turns it into
# two logits. A natural guess is that the feed-forward network turns the pair of reports into
# the label. Test the guess: `feed_forward_off(model)` switches the feed-forward sublayer off
# (a forward hook that zeroes its output, so the layer passes on `x` plus attention only).

# %%
# NBVAL_IGNORE_OUTPUT
# (your run's accuracy without its feed-forward network)
with feed_forward_off(model):
    no_ffn = evaluate(model, test, vocab)
print(f"your model without its feed-forward network: negated {no_ffn['negated']:.0%}, plain {no_ffn['plain']:.0%}")


# %%
def ffn_off(group):
    return lambda r: r["heads"]["feed_forward_off"][group]


k, n = study.count(lambda r: min(ffn_off("negated")(r), ffn_off("plain")(r)) >= 0.95, where=learned)
print(f"at least 95% on both groups without the feed-forward network: {k} of {learned_runs} runs that learned")
fig, ax = plt.subplots(figsize=(7.5, 3.4), layout="constrained")
plot_runs(ax, study, {"negated": ffn_off("negated"), "plain": ffn_off("plain")}, where=learned,
          yours={"negated": no_ffn["negated"], "plain": no_ffn["plain"]},
          title="Held-out accuracy with the feed-forward network switched off")
plt.show()
assert k == 54

# %% [markdown]
# The guess is wrong for most runs: in 54 of the 76 runs that learned, the model still got at
# least 95% of both groups right without its feed-forward network. Each head writes its report
# through its own columns of `W_o`, so the two reports arrive at `<cls>` as two separate
# vectors added up, and in those runs one linear map of that sum (after the normalization) is
# enough to put "not good" and "not bad" on opposite sides. In the other runs the feed-forward network's
# correction is part of the solution, and without it some groups fall to chance or below. Where
# your model's star lies varies by machine.
#
# **And the book's relation, "bad" looking at "not"?** In your map of "the movie was not bad"
# above, find the row of "bad" and its weight on "not". One sentence says little; averaged over
# all negated held-out sentences, the study found the sentiment word's row giving "not" 12% to
# 62% of the negation head's attention, and 3% to 45% of the other head's. So the sentiment
# word does look at "not", partly, in every run. But in this one-layer model that row never
# reaches the classifier: the relation between the two words is assembled at `<cls>`, from two
# heads.

# %%
# NBVAL_IGNORE_OUTPUT
# (your run's shares)
word_to_not = attention_shares(model, negated, vocab, query="sentiment word")["not"]
print("share of the sentiment word's attention on 'not':",
      ", ".join(f"head {h} {word_to_not[h].item():.0%}" for h in range(H)))
assert word_to_not.max() >= 0.10  # held in all 76 runs that learned (the lowest: 12%)

# %%
low, high = study.span(lambda r: r["heads"]["word_to_not"][negation_head_of(r)], where=learned)
low_other, high_other = study.span(lambda r: r["heads"]["word_to_not"][1 - negation_head_of(r)], where=learned)
print(f"sentiment word -> 'not': negation head {low:.0%} to {high:.0%}, other head {low_other:.0%} to {high_other:.0%}")
assert f"{low:.0%} {high:.0%} {low_other:.0%} {high_other:.0%}" == "12% 62% 3% 45%"  # as the text says

# %% [markdown]
# ## 6. Silencing heads
#
# Attention maps show where a head *looks*; they don't prove that the model *uses* what it
# finds. The direct test is **ablation**: switch a head off and measure what breaks.
#
# How to switch head $h$ off: the heads' outputs are concatenated, head $h$ in features
# `[h·d_k, (h+1)·d_k)`, before $W_o$ mixes them (chapter 03). Set that slice to zero and $W_o$
# receives nothing from head $h$, while everything else stays as it was.
# `silence_heads(attention, heads)` (in `mha_lib.heads`, next to `split_heads`; also importable
# from `mha_lib.sentiment`) does this with a *forward pre-hook* on `W_o`, a function PyTorch
# calls on `W_o`'s input just before `W_o` runs; the hook is removed when the `with` block
# ends. No weight changes.
#
# First we check it against the computation done by hand with `mha_lib`'s pieces, on any
# input of the right width:

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
# Now the ablation: held-out accuracy with the negation head silenced, the other head, and
# both, on negated and plain sentences, and in the four groups.

# %%
# NBVAL_IGNORE_OUTPUT
# (the accuracies of your run)
ablation = {}
for name, silenced in (("none", []), ("negation head", [negation_head]), ("other head", [other_head]),
                       ("both heads", [0, 1])):
    with silence_heads(attn, silenced):
        row = {"negated": evaluate(model, negated, vocab)["all"], "plain": evaluate(model, plain, vocab)["all"]}
        row |= {group: evaluate(model, examples, vocab)["all"] for group, examples in groups.items()}
    ablation[name] = row

print("accuracy when silencing" + "".join(f"{column:>10}" for column in row))
for name, row in ablation.items():
    print(f"{name:23}" + "".join(f"{acc:10.0%}" for acc in row.values()))
print("(+ / -: the sentiment word is positive / negative)")
assert ablation["other head"]["negated"] <= 0.65  # held in all 76 runs that learned (at most 64%)

# %% [markdown]
# The study says which of these numbers are robust:

# %%
def silenced(who, group):
    """Accuracy on a group with the negation head or the other head silenced."""
    return lambda r: r["heads"]["silenced"][f"head {negation_head_of(r) if who == 'negation' else 1 - negation_head_of(r)}"][group]


fig, ax = plt.subplots(figsize=(10, 3.6), layout="constrained")
plot_runs(ax, study, {"other head silenced:\nnegated": silenced("other", "negated"),
                      "other head silenced:\nplain": silenced("other", "plain"),
                      "negation head silenced:\nnegated": silenced("negation", "negated"),
                      "negation head silenced:\nplain": silenced("negation", "plain")},
          where=learned, title="Held-out accuracy with one head silenced, one dot per run that learned",
          yours={"other head silenced:\nnegated": ablation["other head"]["negated"],
                 "other head silenced:\nplain": ablation["other head"]["plain"],
                 "negation head silenced:\nnegated": ablation["negation head"]["negated"],
                 "negation head silenced:\nplain": ablation["negation head"]["plain"]})
plt.show()

for who in ("other", "negation"):
    for group in ("negated", "plain"):
        low, high = study.span(silenced(who, group), where=learned)
        print(f"{who} head silenced, {group:7}: {low:4.0%} to {high:4.0%}")
k_chance = study.count(lambda r: silenced("other", "negated")(r) <= 0.53, where=learned)[0]
k_more = study.count(lambda r: silenced("other", "negated")(r) < silenced("negation", "negated")(r), where=learned)[0]
k_plain = study.count(lambda r: silenced("negation", "plain")(r) < silenced("negation", "negated")(r), where=learned)[0]


def same_answer(r):
    """Other head silenced: one of "not good" and "not bad" (nearly) all right, the other all wrong."""
    good, bad = silenced("other", "negated+")(r), silenced("other", "negated-")(r)
    return min(good, bad) <= 0.1 and max(good, bad) >= 0.9


k_same = study.count(same_answer, where=learned)[0]
print(f"other head silenced, negated at 53% or less: {k_chance}; costs negated sentences more than "
      f"silencing the negation head: {k_more}; negation head silenced, plain below negated: {k_plain} "
      f"(of {learned_runs})")
print(f"other head silenced: one of 'not good' and 'not bad' at 90% or more, the other at 10% or less: {k_same}")
assert (k_chance, k_more, k_plain, k_same) == (75, 73, 61, 59)

# %% [markdown]
# - **Silencing the other head** drops negated sentences to **chance** in every run that
#   learned: 46% to 64%, and 53% or less in 75 of the 76. Plain sentences mostly survive
#   (median 100%, lowest 54%). Without the other head, "not good" and "not bad" both reach
#   `<cls>` as (not, ·): the negation head looks at "not" in both, and nothing tells them
#   apart any more. In 59 of the 76 runs the model then gave both groups the same answer,
#   right for one and wrong for the other. This is the robust finding, and the ablation cell
#   asserts it on your model.
# - **Silencing the negation head** has a cost that varies from run to run: negated sentences
#   keep 0% to 100%, plain ones 0% to 100%, and plain sentences lose more than negated ones in
#   61 of the 76 runs. A silenced head is not "no report": it is a zero vector, which the model
#   reads as something (often the same as one of the reports it knows).
#
# So the result is the opposite of a natural guess: **the negation head is not the head that
# negated sentences depend on most.** Silencing the *other* head cost negated sentences more
# than silencing the negation head in 73 of the 76 runs, because in a negated sentence the
# negation head looks at "not" and so carries nothing about the sentiment word. Ablation
# measures what a head adds *given everything else* the model does. Michel et al. (2019) and
# Voita et al. (2019) silenced heads of large trained transformers and found both kinds: many
# heads can go at little cost, while a few specialized ones carry the task.
#
# ## 7. What held, and what didn't
#
# The library holds the findings that held in every run of the study as code
# (`mha_lib.sentiment.study.FINDINGS`; its tests train fresh seeds and check them too). Counted
# over the runs, per kernel path:

# %%
for name in FINDINGS:
    counts = [study.count(lambda r, name=name: check_findings(r).get(name, False), path)[0] for path in study.paths]
    applicable = [sum(name in check_findings(r) for r in study.runs if r["path"] == path) for path in study.paths]
    print(f"{name:45}" + "  ".join(f"{path} {k}/{n}" for path, k, n in zip(study.paths, counts, applicable)))
    assert counts == applicable  # each held in every run it applies to

# %% [markdown]
# (The chapter 07 findings apply to the runs that learned; the last one belongs to chapter 11.)
#
# - **Robust**, in every run that learned, on every kernel path: a negation head (which head is
#   chance); the other head brings the sentiment word to `<cls>` in negated sentences; silencing
#   the other head leaves negated sentences at chance; the sentiment word's own row gives "not"
#   some attention (12% to 62% in the negation head).
# - **Usually, not always**: silencing the other head costs negated sentences more than
#   silencing the negation head (73 of 76); plain sentences suffer more than negated ones when
#   the negation head goes (61 of 76); the model still works without its feed-forward network
#   (54 of 76); plain sentences are learned no later than negated ones (77 of 90).
# - **An accident of the run**: which head becomes the negation head, which polarity the other
#   head looks for, how much the two heads overlap, and whether a given seed learns at all on a
#   given CPU (seeds 7 and 12).
#
# So the heads do specialize, if less cleanly than detectives, and only the measurements over
# many runs say which part of the specialization is a property of the model and which is
# chance. One run, or one attention map, would not have told them apart.

# %% [markdown]
# ## Recap
#
# - An **encoder layer** is self-attention followed by a position-wise feed-forward network,
#   each wrapped in a residual connection, dropout and layer normalization. `mha_lib.EncoderLayer`
#   is **pre-norm**, `x + Dropout(Sublayer(LayerNorm(x)))`: it trains stably without warm-up, and
#   it equals `nn.TransformerEncoderLayer(norm_first=True)` with the same weights.
# - Shapes: `(B, L, d_model)` in and out; attention weights `(B, H, L, L)`.
# - A generated task with negations needs a model that relates two words: a two-head, one-layer
#   classifier learned it in seconds in 76 of 90 runs (at least 95% on negated and on plain
#   sentences).
# - A **negation head** appears in every run that learned, and the **other head** brings the
#   sentiment word; each head reports *where* it found a clue, and the classifier reads the sum
#   of the reports at `<cls>` (in most runs without needing the feed-forward network).
# - **Ablation** (zero a head's slice before $W_o$) tests use, not just attention. Negated
#   sentences depend most on the head that does *not* track negation, and a silenced head is
#   itself a signal the model reads.
# - A training run differs by seed and by machine. Claims about a trained model come from many
#   runs (here 30 seeds × 3 CPU kernel paths), with counts and ranges, and are asserted on the
#   model you train; what one run shows is said to be about that run.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/07_heads_at_work.ipynb`; each exercise checks
# itself and tells you what is wrong. See the README for how to start your own copy.
#
# ## What comes next
#
# This model had one layer, so each head worked alone. **Chapter 08** stacks two layers of
# attention and trains them in seconds to continue a repeated sequence: a head of the second layer
# finds the earlier copy of the current token and reads what came next (an *induction head*), and
# it can do so only with what a head of the first layer wrote. Heads that compose across layers
# are why transformers stack attention at all. Later, **chapter 09** makes attention fast, and
# the last chapter returns to this chapter's model and *restricts* its heads: head 0 may only look
# at the first half of the sentence and head 1 at the second, the blog post's "Try it yourself".
