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
# # Chapter 06 · Heads at work
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
    make_datasets,
    predict,
    silence_heads,
    train_model,
)

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
#    (chapter 02), so each position gets a learned vector added;
# 2. **one `EncoderLayer`** with `d_model = 48`, **2 heads** of 24 features and `d_ff = 96`;
# 3. a final `LayerNorm` (the layer is pre-norm);
# 4. a linear **classifier** on the vector of `<cls>`: two logits, negative and positive.
#
# `<cls>` is a token without a meaning of its own (BERT uses the same trick). It attends to the
# sentence like every other token, and what its heads bring back is all the classifier sees. So
# in this one-layer model only **the `<cls>` row of each attention map reaches the prediction**:
# that is the row to watch.
#
# The model also accepts an extra mask (`forward(tokens, mask=...)`, combined with the padding
# mask), e.g. a per-head `(H, L, L)` mask; chapter 08 uses it to restrict the heads.

# %%
seed_everything(0)  # the seed study in section 7 starts each model from its own seed, like this
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
# over the 2000 training sentences in batches of 32, and prints a progress line every 3 epochs with the loss, the
# training accuracy and the held-out accuracy on negated and plain sentences.
#
# Two details keep it fast and reproducible. A model this small trains fastest on **one CPU
# thread** (its operations are too small to share out), so `train_model` uses one thread while
# it runs. And dropout is 0: with 2000 different sentences the model has little to overfit,
# and without random dropout masks the run takes the same path on the CPU and on a GPU, up to
# rounding. The timings in the next cell's printout vary by machine, so that output is not
# compared when the course is tested; the cell after it asserts what must hold.

# %%
# NBVAL_IGNORE_OUTPUT
history = train_model(model, train, vocab, test=test, epochs=12, batch_size=32, lr=5e-3, seed=0)
for retry in (1, 2):  # 2 seeds in 20 never learn the negations (section 7): then train from the next seed
    if min(evaluate(model, test, vocab)[group] for group in ("negated", "plain")) >= 0.95:
        break
    print(f"seed {retry - 1} did not learn the negations; training again with seed {retry}")
    seed_everything(retry)
    model = SentimentClassifier(len(vocab), d_model=48, num_heads=2, num_layers=1, d_ff=96).to(device)
    history = train_model(model, train, vocab, test=test, epochs=12, batch_size=32, lr=5e-3, seed=retry)

# %%
accuracy = evaluate(model, test, vocab)
assert accuracy["negated"] >= 0.95 and accuracy["plain"] >= 0.95, accuracy
print(f"held-out accuracy: negated {accuracy['negated']:.0%}, plain {accuracy['plain']:.0%}")

# %% [markdown]
# The curves show how it learned. Plain sentences come first: after two epochs the model reads
# the sentiment word. Negated sentences catch up within a few epochs, with a wobble while the
# model reorganizes what its heads do, and from epoch 6 on both groups are right.

# %%
epochs = range(1, len(history["loss"]) + 1)
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.4))
ax_loss.plot(epochs, history["loss"], "o-")
ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="Training loss")
ax_acc.plot(epochs, history["test_plain"], "o-", label="plain sentences")
ax_acc.plot(epochs, history["test_negated"], "s-", label="negated sentences")
ax_acc.axhline(0.5, color="grey", ls=":", label="chance")
ax_acc.set(xlabel="epoch", ylabel="accuracy", ylim=(0, 1.05), title="Held-out accuracy")
ax_acc.legend(loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# A few sentences of our own, and whether the model saw them in training ("not bad" alone fits
# none of the templates):

# %%
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
fig.suptitle("Where <cls> looks, head by head")
fig.tight_layout()
plt.show()

# %% [markdown]
# Each head looks at **one** word, and which word depends on the sentence: "not", a sentiment
# word, or something else. Mostly both heads pick the same word; in the last sentence, which
# holds both "not" and a positive word, they split. Five sentences can mislead, though, so
# let's **measure**. The held-out sentences fall into four groups: plain or negated, with a
# positive or a negative sentiment word. For each group and each head, `attention_shares`
# averages the share of `<cls>`'s attention that goes to `<cls>` itself, to "not", to the
# sentiment word and to all other words.

# %%
groups = {
    "plain, positive word": [e for e in test if not e.negated and e.word_is_positive],
    "plain, negative word": [e for e in test if not e.negated and not e.word_is_positive],
    "negated, positive word": [e for e in test if e.negated and e.word_is_positive],
    "negated, negative word": [e for e in test if e.negated and not e.word_is_positive],
}
shares = {name: attention_shares(model, examples, vocab) for name, examples in groups.items()}
roles = list(shares["plain, positive word"])  # <cls>, not, sentiment word, other words
H = model.num_heads

print("held-out sentences per group:", ", ".join(f"{name} {len(ex)}" for name, ex in groups.items()))
for h in range(H):
    print(f"\n{f'head {h}: <cls> attends to':28}" + "".join(f"{role:>16}" for role in roles))
    for name in groups:
        print(f"  {name:26}" + "".join(f"{shares[name][role][h].item():16.0%}" for role in roles))

# %% [markdown]
# The shares are all close to 0% or 100%: in each group, each head looks at one kind of word.
# Summarized, with the label each group must get:

# %%
def target(name, h):
    """Where head h of <cls> mostly looks in a group of sentences."""
    return max(roles, key=lambda role: shares[name][role][h].item())


print(f"{'group':24}" + "".join(f"{'head ' + str(h) + ' looks at':>20}" for h in range(H)) + f"{'label':>10}")
for name, examples in groups.items():
    label = "positive" if examples[0].label else "negative"
    print(f"{name:24}" + "".join(f"{target(name, h):>20}" for h in range(H)) + f"{label:>10}")

# %%
negated = groups["negated, positive word"] + groups["negated, negative word"]
plain = groups["plain, positive word"] + groups["plain, negative word"]
not_share = attention_shares(model, negated, vocab)["not"]  # (H,)
not_head = int(not_share.argmax())
other_head = 1 - not_head
print("share of <cls>'s attention on 'not' in negated sentences:",
      ", ".join(f"head {h} {not_share[h].item():.0%}" for h in range(H)))

# %% [markdown]
# Call the four groups "good", "bad", "not good" and "not bad" for short. This is not the
# tidy division of labour of the detectives: in **three of the four groups both heads land on
# the same kind of word**, the sentiment word in "good", some other word in "bad" (the
# negative word gets only about a tenth), "not" in "not bad". The heads share their clues,
# "not" and a positive word, and differ only in **which one they prefer when a sentence has
# both**:
#
# - **head 0** looks at "not" whenever there is one (100% of its attention in every negated
#   sentence), and falls back on a positive word, then on any other word;
# - **head 1** looks at a positive word whenever there is one, and falls back on "not", then
#   on any other word.
#
# Both clues appear together in one group only, "not" with a positive word, and that one
# disagreement is what tells "not good" from "not bad": head 0 reports "not" in both, head 1
# reports the positive word in "not good" and "not" in "not bad". Neither head computes the
# answer. Each reports *where it found a clue*, the four groups produce four different pairs
# of reports, and the feed-forward network after the attention turns each pair into the
# label: (not, positive word) means negative, (not, not) positive. Below we call head 0, the
# head that always looks at "not" in a negated sentence, the **negation head**.
#
# And the book's relation, "bad" looking at "not"? The sentiment word's own row does look at
# "not" (next cell), but in this one-layer model that row never reaches the classifier: the
# relation between the two words is assembled at `<cls>`, from two heads.

# %%
word_to_not = attention_shares(model, negated, vocab, query="sentiment word")["not"]
print("share of the sentiment word's attention on 'not':",
      ", ".join(f"head {h} {word_to_not[h].item():.0%}" for h in range(H)))

# %% [markdown]
# ## 6. Silencing heads
#
# Attention maps show where a head *looks*; they don't prove that the model *uses* what it
# finds. The direct test is **ablation**: switch a head off and measure what breaks.
#
# How to switch head $h$ off: the heads' outputs are concatenated, head $h$ in features
# `[h·d_k, (h+1)·d_k)`, before $W_o$ mixes them (chapter 03). Set that slice to zero and $W_o$
# receives nothing from head $h$, while everything else stays as it was.
# `mha_lib.sentiment.silence_heads(attention, heads)` does this with a *forward pre-hook* on
# `W_o`, a function PyTorch calls on `W_o`'s input just before `W_o` runs; the hook is removed
# when the `with` block ends. No weight changes.
#
# First we check it against the computation done by hand with `mha_lib`'s pieces, on any
# input of the right width:

# %%
attn = model.layers[0].self_attn
with torch.no_grad():
    h = torch.randn(1, 6, attn.d_model).to(device)  # (B, L, d_model)
    q, k, v = (split_heads(W(h), attn.num_heads) for W in (attn.W_q, attn.W_k, attn.W_v))  # (1, H, L, d_k)
    heads, _ = scaled_dot_product_attention(q, k, v)  # (1, H, L, d_k)
    heads[:, not_head] = 0                            # silence the negation head
    by_hand = attn.W_o(combine_heads(heads))          # (1, L, d_model)
    with silence_heads(attn, [not_head]):
        hooked = attn(h, h, h)
    assert torch.allclose(by_hand, hooked, atol=1e-6)
    assert not torch.allclose(by_hand, attn(h, h, h), atol=1e-3)  # outside the block the head is back
print("silence_heads == zeroing the head's slice before W_o by hand")

# %% [markdown]
# Now the ablation: held-out accuracy with each head silenced, and with both, on negated and
# plain sentences, and in the four groups.

# %%
short = {"plain, positive word": "plain+", "plain, negative word": "plain-",
         "negated, positive word": "negated+", "negated, negative word": "negated-"}
ablation = {}
for silenced in ([], [0], [1], [0, 1]):
    with silence_heads(attn, silenced):
        row = {"negated": evaluate(model, negated, vocab)["all"], "plain": evaluate(model, plain, vocab)["all"]}
        row |= {short[name]: evaluate(model, examples, vocab)["all"] for name, examples in groups.items()}
    ablation[" and ".join(f"head {h}" for h in silenced) or "none"] = row

print("accuracy when silencing" + "".join(f"{column:>10}" for column in row))
for name, row in ablation.items():
    print(f"{name:23}" + "".join(f"{acc:10.0%}" for acc in row.values()))
print("(+ / -: the sentiment word is positive / negative)")

# %% [markdown]
# Read it with the table of reports from section 5: silencing a head erases its column, and
# two groups whose remaining reports are the same can no longer be told apart.
#
# - **Silencing head 1** (the head that prefers a positive word) leaves plain sentences
#   intact but drops negated ones to **chance**. Without head 1, "not good" and "not bad" both
#   read (not, ·): the negation head looks at "not" in both, so nothing tells them apart, and
#   the model gets one of the two groups right and the other wrong. Plain sentences still
#   differ in head 0's report (positive word versus other word).
# - **Silencing head 0** (the negation head) costs much less on negated sentences, and
#   more on plain ones. Now (·, positive word) stands for both "good" and "not good", which need
#   opposite labels: those two groups share the errors, while the other two still differ in
#   head 1's report ("not" versus other word).
#
# So the result is the opposite of a natural guess: **the negation head is not the head that
# negated sentences depend on most**. Here it is the *other* head, because in a negated
# sentence the negation head always looks at "not" and so carries nothing about the sentiment
# word. Ablation measures what a head adds *given everything else* the model does, and a
# silenced head is not "no report": it is a zero vector, which the model reads as something
# (here, the same as one of the reports it knows). Michel et al. (2019) and Voita et al. (2019)
# silenced heads of large trained transformers and found both kinds: many heads can go at
# little cost, while a few specialized ones carry the task.
#
# The exact percentages above belong to this run. On a GPU or another PyTorch version the
# training takes a slightly different path, and which head becomes the negation head, and by
# how much, can change (section 7 measures how much). This cell checks what held in *every*
# run that learned the task, so it holds wherever the notebook runs:

# %%
quiet_other, quiet_not = ablation[f"head {other_head}"], ablation[f"head {not_head}"]
assert not_share[not_head] > 0.6 > not_share[other_head] or not_share[not_head] > 0.95  # a negation head
assert quiet_other["negated"] < 0.6  # silencing the other head: negated sentences at chance
print(f"findings hold (negation head: head {not_head})")

# %% [markdown]
# ## 7. How robust is this?
#
# One trained model is one sample. With a script outside this notebook we trained the same
# model from 20 seeds (0 to 19; the seed sets the initial weights and the order of the batches,
# the data stay the same) and measured the same things. Each run took 2.5 to 7.5 s on a
# shared 2-core machine. What we found:
#
# - **Learning** worked in 18 of 20 runs (held-out accuracy of at least 99% on both groups).
#   In the other two (seeds 7 and 12) negated sentences stayed at chance: *both* heads had
#   locked onto "not" with all of `<cls>`'s attention, so nothing brought the sentiment word of
#   a negated sentence, and a saturated softmax has almost no gradient to get out (chapter 01).
# - **A negation head** appeared in all 18: one head puts more of `<cls>`'s attention on "not"
#   in negated sentences (62–100%, at least 95% in 12 runs) than the other (0–51%). Which head
#   takes the job is chance: head 0 in 8 runs, head 1 in 10.
# - **Silencing the other head** dropped negated sentences to chance (46–53%) in all 18, while
#   plain sentences kept 80–100% (at least 90% in 17). This is the robust finding.
# - **Silencing the negation head** had a cost that varied from run to run: negated sentences
#   kept 49–100%, plain ones 0–91%; plain sentences lost more than negated ones in 15 of 18.
# - **The reports** differed between runs: the other head looked for the *positive* word in
#   some runs and for the *negative* one in others, and how cleanly each head kept to one word
#   varied as well.
#
# So the heads do specialize, if less cleanly than detectives, and the measurements say which
# specialization is robust (a head for "not", and a second head the negated sentences cannot
# do without) and which details are an accident of the seed (which head, which word, how
# clean). One run, or one attention map, would not have told them apart.

# %% [markdown]
# ## Recap
#
# - An **encoder layer** is self-attention followed by a position-wise feed-forward network,
#   each wrapped in a residual connection, dropout and layer normalization. `mha_lib.EncoderLayer`
#   is **pre-norm**, `x + Dropout(Sublayer(LayerNorm(x)))`: it trains stably without warm-up, and
#   it equals `nn.TransformerEncoderLayer(norm_first=True)` with the same weights.
# - Shapes: `(B, L, d_model)` in and out; attention weights `(B, H, L, L)`.
# - A generated task with negations needs a model that relates two words: a two-head, one-layer
#   classifier learned it in seconds, with held-out accuracy of at least 95% (100% in this
#   run) on negated and on plain sentences.
# - **Measured**, the heads overlap more than the detectives' picture suggests: in three of
#   the four groups both look at the same word. They differ in which clue they prefer when a
#   sentence has both "not" and a positive word, and that one disagreement tells "not good"
#   from "not bad". Each head reports *where* it found a clue; `<cls>` combines the reports.
# - **Ablation** (zero a head's slice before $W_o$) tests use, not just attention. Negated
#   sentences depend most on the head that does *not* track negation, and a silenced head is
#   itself a signal the model reads.
# - Across 20 seeds, learning failed twice, and the specialization's main features held in all
#   the other runs while its details changed: always check such findings on more than one run.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/06_heads_at_work.ipynb`; each exercise checks
# itself and tells you what is wrong. See the README for how to start your own copy.
#
# ## What comes next
#
# Every attention map in this chapter was an `L × L` matrix. For long sequences that matrix is
# the bottleneck: **chapter 07** builds `mha_lib.EfficientMultiHeadAttention` with fused
# projections and PyTorch's fast attention kernels, and explains flash attention. **Chapter 08**
# returns to this chapter's model and *restricts* its heads: head 0 may only look at the first
# half of the sentence and head 1 at the second, the blog post's "Try it yourself".
