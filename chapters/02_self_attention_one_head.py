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
# # Chapter 02 · Self-attention with one head
#
# In chapter 01 the queries, keys and values were handed to us. In a transformer they come
# from the sentence itself: every token asks a question (its query), advertises what it has
# (its key) and hands over some content (its value), and all three are computed from the
# token's own embedding. Because the sequence attends to *itself*, this is called
# **self-attention**, and one set of learned matrices that make the queries, keys and values
# (the **projections** of section 3), plus one attention computation, is one **attention
# head**.
#
# **By the end of this chapter you will be able to**
#
# - turn a sentence into a `(B, L, d_model)` tensor of token embeddings with a vocabulary and
#   `nn.Embedding`;
# - explain why comparing raw embeddings with each other is not enough, and show it;
# - compute $Q = XW_q$, $K = XW_k$, $V = XW_v$ and self-attention by hand, naming every shape;
# - use the course's module `mha_lib.AttentionHead`, and prove it equals your hand computation;
# - show what projections can express: a hand-set head in which "bad" looks for "not", and a
#   head whose pattern emerges from a few gradient steps;
# - show that attention ignores word order, and say why positional encoding comes next.
#
# *Sources.* The example sentence "The movie was not bad", and the point that the relation
# between "not" and "bad" matters more than either word alone, are from *Transformers in
# Action* (Manning), section 1.1.4; self-attention with projected queries, keys and values
# follows its section 2.2.3. The database analogy for queries, keys and values, and the
# step after attention (positional encoding), follow Priyesh Dave's post "Day 28: Multi-Head
# Attention" (DEV Community). The projections $W^Q, W^K, W^V$ and the positional encodings
# are from Vaswani et al., "Attention Is All You Need" (2017), sections 3.2.2 and 3.5.

# %% [markdown]
# ## Set-up
#
# As in every chapter: pick the device (`MHA_DEVICE=cpu` forces the CPU), seed every random
# generator, and build random things on the CPU before moving them, so your numbers match the
# printed ones on any device.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from mha_lib import AttentionHead, get_device, plot_attention, scaled_dot_product_attention, seed_everything

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. From a sentence to vectors
#
# A model can't read words, only numbers. The first step is to **tokenise**: cut the text
# into pieces (here simply lower-case words) and give every distinct piece an integer id.
# The list of known pieces is the **vocabulary**. Ours comes from a tiny corpus of two
# sentences; real vocabularies hold tens of thousands of sub-word pieces.

# %%
corpus = ["The movie was not bad", "The film was good"]


def tokenize(text: str) -> list[str]:
    return text.lower().split()


vocab = sorted({word for sentence in corpus for word in tokenize(sentence)})
word_to_id = {word: i for i, word in enumerate(vocab)}
print("vocabulary:", word_to_id)

tokens = tokenize(corpus[0])
ids = torch.tensor([word_to_id[t] for t in tokens])  # (L,)
print("tokens:", tokens)
print("ids:   ", ids.tolist())

# %% [markdown]
# An **embedding** turns each id into a vector of `d_model` numbers. `nn.Embedding` is just a
# table with one trainable row per word of the vocabulary; looking up an id returns its row.
# We use `d_model = 16` and add a batch axis in front, because attention modules take a batch
# of sequences `(B, L, d_model)`. The table is random here: a trained model would have learned
# it, but nothing in this chapter needs a trained one.

# %%
d_model = 16
embed = nn.Embedding(len(vocab), d_model).to(device)  # weights drawn on the CPU, then moved


def embed_sentence(words: list[str]) -> torch.Tensor:
    """Words -> (1, L, d_model) embeddings, a batch of one sentence."""
    word_ids = torch.tensor([word_to_id[w] for w in words], device=device)  # (L,)
    return embed(word_ids).unsqueeze(0).detach()  # (1, L, d_model)


x = embed_sentence(tokens)
print("embedding table:", tuple(embed.weight.shape), "  (vocabulary size, d_model)")
print("x:", tuple(x.shape), "  (B, L, d_model)")

# %% [markdown]
# ## 2. Why not attend with the embeddings themselves?
#
# Self-attention means the sentence is the query, the key *and* the value. The simplest
# thing to try is to use the embeddings as they are: $Q = K = V = X$.

# %%
raw_out, raw_weights = scaled_dot_product_attention(x, x, x)  # (1, L, d_model), (1, L, L)
print("output:", tuple(raw_out.shape), "  weights:", tuple(raw_weights.shape))
plot_attention(raw_weights[0], tokens, title="Raw embeddings: Q = K = V = X")
plt.show()

# %% [markdown]
# Nearly all the weight sits on the diagonal: **every token attends to itself**, and the
# output is little more than the token's own embedding. That is no accident. A vector's dot
# product with itself is its squared length, $x \cdot x = \lVert x\rVert^2$, about `d_model`
# here (`nn.Embedding` draws its entries from N(0, 1)). Its dot product with an unrelated
# vector is a sum of terms with random signs that mostly cancel, typically only about
# $\sqrt{d_\text{model}}$. The wider the embeddings, the stronger the effect; here is the
# average weight a token gives itself in random 5-token sentences:

# %%
print("d_model   average self-weight")
for d in [4, 16, 64, 256]:
    fake = torch.randn(1000, 5, d)  # 1000 random "sentences" of 5 tokens
    _, w = scaled_dot_product_attention(fake, fake, fake)
    print(f"{d:7d}   {w.diagonal(dim1=-2, dim2=-1).mean().item():.2f}")

# %% [markdown]
# Raw embeddings have two more problems:
#
# - **The scores are symmetric.** $x_i \cdot x_j = x_j \cdot x_i$, so "bad" can never score
#   "not" higher than "not" scores "bad". But the relation between two words is often one-way.
# - **Attention has no parameters of its own.** The map follows from the embeddings
#   alone. Training could change it only by moving the embeddings, which the rest of the
#   model uses too; nothing lets this attention learn to look for something in particular.

# %%
raw_scores = x @ x.transpose(-2, -1) / math.sqrt(d_model)  # (1, L, L)
print("scores equal their transpose:", torch.allclose(raw_scores, raw_scores.transpose(-2, -1)))

# %% [markdown]
# ## 3. Queries, keys and values: three projections
#
# The fix is to give each token three *different* vectors, each made from its embedding by a
# trainable matrix (a **projection**):
#
# | | made by | role | in the database analogy |
# |---|---|---|---|
# | query $q_i = x_i W_q$ | $W_q$: `(d_model, d_k)` | what token $i$ is looking for | the search term |
# | key $k_j = x_j W_k$ | $W_k$: `(d_model, d_k)` | what token $j$ offers to searchers | the searchable field |
# | value $v_j = x_j W_v$ | $W_v$: `(d_model, d_v)` | what token $j$ hands over when chosen | the full record |
#
# (The analogy is the blog post's.) Queries and keys are compared with dot products, so they
# must have the same width $d_k$; the values may have another width $d_v$. In multi-head
# attention $d_v = d_k$ (chapter 03); here we take $d_k = 4$ and $d_v = 6$ so that you can
# tell the shapes apart. Stacking the tokens as the rows of $X$, one matrix product projects
# them all: $Q = XW_q$.
#
# We start with random projections, scaled by $1/\sqrt{d_\text{model}}$ so that each projected
# coordinate has about the spread of an embedding coordinate (variance about 1).

# %%
d_k, d_v = 4, 6
W_q = (torch.randn(d_model, d_k) / math.sqrt(d_model)).to(device)  # (d_model, d_k)
W_k = (torch.randn(d_model, d_k) / math.sqrt(d_model)).to(device)  # (d_model, d_k)
W_v = (torch.randn(d_model, d_v) / math.sqrt(d_model)).to(device)  # (d_model, d_v)

Q = x @ W_q  # (1, L, d_model) @ (d_model, d_k) -> (1, L, d_k)
K = x @ W_k  # (1, L, d_k)
V = x @ W_v  # (1, L, d_v)
for name, t in [("X", x), ("Q", Q), ("K", K), ("V", V)]:
    print(f"{name}: {tuple(t.shape)}")

# %% [markdown]
# ## 4. Self-attention by hand
#
# From here on it is chapter 01's formula, applied to the projected vectors:
# $\text{softmax}(QK^\top/\sqrt{d_k})\,V$.

# %%
scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # (1, L, d_k) @ (1, d_k, L) -> (1, L, L)
weights = torch.softmax(scores, dim=-1)            # (1, L, L), each row sums to 1
out = weights @ V                                  # (1, L, L) @ (1, L, d_v) -> (1, L, d_v)
print("scores: ", tuple(scores.shape))
print("weights:", tuple(weights.shape))
print("output: ", tuple(out.shape), " one d_v-vector per token")
print("scores equal their transpose:", torch.allclose(scores, scores.transpose(-2, -1)))

# %% [markdown]
# The scores are no longer symmetric: a token's query and its key are different vectors.
# Here is the attention map of our sentence:

# %%
plot_attention(weights[0], tokens, title="Random W_q, W_k: a meaningless map")
plt.show()

# %% [markdown]
# Read it as: row = the token doing the looking, column = the token looked at. **With random
# projections the map means nothing.** It is neither the self-attention of section 2 nor
# anything linguistic: just what these random matrices happen to give. Meaning comes from
# training the projections (sections 6 and 7 show what they *can* express).
#
# ## 5. The module: `mha_lib.AttentionHead`
#
# The three projections and the attention call make up one head. `mha_lib.AttentionHead`
# packs them into an `nn.Module` with three `nn.Linear` layers named `W_q`, `W_k`, `W_v`;
# its `forward` runs three projections and one attention call, plus input checks (read them
# in `mha_lib/single_head.py`).
#
# One detail: `nn.Linear(d_model, d_k)` stores its weight as `(d_k, d_model)`, the
# transpose of our `W_q`, and computes `x @ weight.T + bias`. To load our hand-made matrices
# we copy their transposes, and we switch the biases off.

# %%
head = AttentionHead(d_model, d_k, d_v, bias=False).to(device)
print(head)
with torch.no_grad():
    head.W_q.weight.copy_(W_q.T)  # (d_k, d_model)
    head.W_k.weight.copy_(W_k.T)
    head.W_v.weight.copy_(W_v.T)  # (d_v, d_model)

# %% [markdown]
# Self-attention passes the same tensor as query, key and value. (The three are separate
# arguments because in **cross-attention** the queries come from one sequence and the keys
# and values from another; chapter 04.) The module must reproduce the hand computation:

# %%
head_out, head_weights = head(x, x, x, return_weights=True)  # (1, L, d_v), (1, L, L)
assert head_out.shape == (1, len(tokens), d_v) and head_weights.shape == (1, len(tokens), len(tokens))
assert torch.allclose(head_out, out, atol=1e-5) and torch.allclose(head_weights, weights, atol=1e-5)
print("hand computation == AttentionHead (within 1e-5):", True)

# %% [markdown]
# The module takes the same arguments as the multi-head module of chapter 03. A head's scores
# are `(B, Lq, Lk)`, so its `mask` must broadcast to that: `padding_mask(lengths)` from chapter
# 01 is `(B, 1, 1, Lk)`, shaped for multi-head scores, so drop the head axis with
# `padding_mask(lengths)[:, 0]`. The module also says what is wrong when a shape does not fit:

# %%
try:
    head(x[..., :8], x, x)  # a query of width 8 instead of d_model = 16
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## 6. What projections can express: a hand-set negation detector
#
# *Transformers in Action* uses our sentence to make a point: in "The movie was not bad" the
# relation between "not" and "bad" matters more than either word alone; together they make
# the review mildly positive. Can one head capture it? We want **"bad" to attend to "not"**.
#
# Instead of training, we **set** the weights by hand (solved for, not learned), with a
# head of $d_k = d_v = 1$:
#
# - the query should answer "am I *bad*?": 1 for "bad", 0 for every other word;
# - the key should answer "am I *not*?": 1 for "not", 0 otherwise;
# - the value hands over the same "am I *not*?" number.
#
# A projection with one output is a single row vector $w$ of `d_model` numbers, and "1 for
# *bad*, 0 for the other words" is a system of linear equations $E\,w = e_\text{bad}$ for
# the embedding table $E$ `(7, 16)`: 7 equations, 16 unknowns. We only need *some* $w$ with
# $E\,w = e_\text{bad}$, and with more unknowns than equations there are infinitely many.
# Least squares looks for the $w$ with the smallest error $\lVert E\,w - e_\text{bad}\rVert^2$;
# here that error is 0, and `torch.linalg.lstsq` returns the shortest exact solution. We call
# it on the CPU, because on a GPU it only accepts systems with at least as many equations as
# unknowns.

# %%
E = embed.weight.detach().cpu()  # (vocabulary size, d_model)


def word_detector(word: str) -> torch.Tensor:
    """A (d_model,) row w with E @ w = 1 for `word` and 0 for every other word."""
    target = torch.zeros(len(vocab), 1)
    target[word_to_id[word]] = 1.0
    return torch.linalg.lstsq(E, target).solution[:, 0]  # (d_model,)


is_bad, is_not = word_detector("bad"), word_detector("not")
print("vocabulary: ", vocab)
print("E @ is_bad: ", (E @ is_bad).round(decimals=3) + 0.0)  # + 0.0 turns -0.0 into 0.0
print("E @ is_not: ", (E @ is_not).round(decimals=3) + 0.0)

# %% [markdown]
# Now we load the detectors into a one-dimensional head. The query is multiplied by a
# `sharpness` of 6: the score of "bad" looking at "not" becomes 6 ($d_k = 1$, so dividing by
# $\sqrt{d_k}$ changes nothing), every other score 0, and
# softmax turns a gap of 6 into a clear preference ($e^6 \approx 400$).

# %%
sharpness = 6.0
negation = AttentionHead(d_model, d_k=1, d_v=1, bias=False)
with torch.no_grad():
    negation.W_q.weight.copy_(sharpness * is_bad[None])  # (1, d_model)
    negation.W_k.weight.copy_(is_not[None])
    negation.W_v.weight.copy_(is_not[None])
negation = negation.to(device)

neg_out, neg_weights = negation(x, x, x, return_weights=True)  # (1, L, 1), (1, L, L)
print("queries:", (negation.W_q(x)[0, :, 0].cpu().round(decimals=2) + 0.0).tolist())
print("keys:   ", (negation.W_k(x)[0, :, 0].cpu().round(decimals=2) + 0.0).tolist())
plot_attention(neg_weights[0], tokens, title='Hand-set head: "bad" looks for "not"')
plt.show()

# %% [markdown]
# The row of "bad" puts 99% of its attention on "not". The other rows are flat: their query
# is 0, so every key scores 0 and the softmax spreads the weight evenly. A query of 0 means
# "I am not looking for anything".
#
# The output at "bad" is what it found. With "not" in the sentence it reads almost 1; in
# "The movie was bad" there is no "not" to find, and it reads 0. The head has turned the
# *relation* between two words into a number at the position of "bad", which later layers
# could use to flip the sentiment.

# %%
for sentence in ["The movie was not bad", "The movie was bad"]:
    words = tokenize(sentence)
    emb = embed_sentence(words)  # (1, L, d_model)
    found = negation(emb, emb, emb)[0, words.index("bad"), 0].item()  # the output at "bad"
    print(f"{sentence!r:26} output at 'bad': {round(found, 2) + 0.0:.2f}")

# %% [markdown]
# Be honest about what this was: we **solved for** the weights, knowing the whole vocabulary
# and the pattern we wanted. A trained model is never told the pattern; it finds projections
# like these because they lower its loss. Chapter 07 trains real heads on a sentiment task
# with negations and measures what they learned.
#
# ## 7. Letting gradients find a pattern
#
# Between hand-setting and full training there is a small step we can take here: write down
# a target map and let gradient descent adjust $W_q$ and $W_k$ until the head produces it.
# Our made-up target: "the", "movie" and "was" look at "movie", the subject; "not" and "bad"
# look at each other. The loss is the cross-entropy between each row of weights and its
# target column, the usual loss for "put the probability here".

# %%
seed_everything(1)
learner = AttentionHead(d_model, d_k, d_v).to(device)  # fresh random weights
targets = torch.tensor([tokens.index(w) for w in ["movie", "movie", "movie", "bad", "not"]], device=device)
trained = [*learner.W_q.parameters(), *learner.W_k.parameters()]  # W_v does not affect the map
lr = 0.1

snapshots = {}
for step in range(31):
    _, w = learner(x, x, x, return_weights=True)  # (1, L, L)
    loss = F.nll_loss(w[0].log(), targets)  # cross-entropy of each row against its target
    if step in (0, 3, 30):
        snapshots[step] = w[0].detach()
    if step % 5 == 0 or step == 3:
        on_target = w[0, torch.arange(len(tokens), device=device), targets]
        print(f"step {step:2d}   loss {loss.item():.3f}   weight on target {on_target.min().item():.2f} or more")
    loss.backward()
    with torch.no_grad():
        for p in trained:
            p -= lr * p.grad  # one step of gradient descent: W <- W - lr * dloss/dW
            p.grad = None

# %%
plot_attention(torch.stack(list(snapshots.values())), tokens,
               head_titles=[f"after {s} steps" for s in snapshots],
               title="A target pattern emerges under gradient descent")
plt.show()

# %% [markdown]
# From a meaningless map to the target in 30 small steps, and the pattern is one-way where
# we asked for it ("the" looks at "movie", "movie" does not look back at "the"). Raw embeddings
# alone can't give every pair of tokens the pattern we ask for: with queries and keys equal to
# the embeddings, $x_i \cdot x_j \le \lVert x_i\rVert \lVert x_j\rVert$, so of any two tokens at
# least one scores itself at least as high as the other. This fitted one pattern on one sentence; it did not learn
# anything about language. In chapter 07 nobody writes down a target: the heads get only a
# task's loss, and their patterns are whatever helps.
#
# ## 8. Attention ignores word order
#
# Shuffle the sentence, reversing it to "bad not was movie the", and run the same head.
# Nothing in the computation knows where a token sits: each token's query is compared with
# every key, and the softmax and the weighted sum do not care in which order the keys come.
# So every token gets **exactly the same output as before**; the rows just move with their
# tokens. In matrix terms, with $P$ the permutation matrix that reorders the rows:
#
# $$\text{softmax}\!\left(\frac{(PQ)(PK)^\top}{\sqrt{d_k}}\right) PV
#   = P\,\text{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) P^\top P V
#   = P \cdot \text{output},$$
#
# because the softmax works row by row and $P^\top P = I$. Self-attention is
# **permutation equivariant**.

# %%
perm = torch.tensor([4, 3, 2, 1, 0])
shuffled = [tokens[i] for i in perm]
print("shuffled:", " ".join(shuffled))

out_orig, w_orig = learner(x, x, x, return_weights=True)  # (1, L, d_v), (1, L, L)
xs = x[:, perm]  # the same embeddings, reordered
out_shuf, w_shuf = learner(xs, xs, xs, return_weights=True)
assert torch.allclose(out_shuf, out_orig[:, perm], atol=1e-5)
assert torch.allclose(w_shuf, w_orig[:, perm][:, :, perm], atol=1e-5)
print("shuffled outputs == original outputs, shuffled (within 1e-5):", True)

print(f"\n{'word':6} {'output in the original (first 3)':34} output in the shuffled (first 3)")
for word in tokens:
    a = out_orig[0, tokens.index(word), :3].detach().cpu().tolist()
    b = out_shuf[0, shuffled.index(word), :3].detach().cpu().tolist()
    print(f"{word:6} {str([round(v, 3) for v in a]):34} {[round(v, 3) for v in b]}")

# %% [markdown]
# (The outputs of "the", "movie" and "was" are close to each other because all three look at
# "movie" and so hand over nearly the same blend of values.) The map of the shuffled sentence
# holds the same numbers, rearranged: "bad" still looks at "not", now on its other side.

# %%
plot_attention(w_shuf[0], shuffled, title="The same head on the reversed sentence")
plt.show()

# %% [markdown]
# For a single head, and for the multi-head module built from heads, a sentence is a **bag
# of words**: "the dog bit the man" and "the man bit the dog" give every word the same
# output. Language needs order, so the sources move on to **positional encoding** next (the
# blog's Day 29; this course builds multi-head attention first, chapters 03 to 05, and returns
# to positions in chapter 06): add to each embedding a vector that depends on its *position*. Once the
# same word at another position has another input vector, the symmetry is broken. Random
# position vectors are enough to see it (Vaswani et al. choose sines and cosines instead):

# %%
positions = torch.randn(len(tokens), d_model).to(device)  # one vector per position 0..L-1
x_pos = x + positions  # "The movie was not bad", positions added
xs_pos = x[:, perm] + positions  # "bad not was movie the": the words moved, the positions did not
out_pos = learner(x_pos, x_pos, x_pos)
outs_pos = learner(xs_pos, xs_pos, xs_pos)
same = torch.allclose(outs_pos, out_pos[:, perm], atol=1e-5)
print("with positions, shuffled outputs == original outputs, shuffled (within 1e-5):", same)
assert not same

# %% [markdown]
# ## Recap
#
# - **Self-attention**: a sequence attends to itself; its tokens supply the queries, the keys
#   and the values.
# - Raw embeddings are not enough: each token mostly attends to itself, the scores are
#   symmetric, and attention has no parameters of its own.
# - **Projections** fix that: $Q = XW_q$ (what I look for), $K = XW_k$ (what I offer),
#   $V = XW_v$ (what I hand over), with shapes `(B, L, d_model) -> (B, L, d_k)` for queries and
#   keys and `(B, L, d_v)` for values; then $\text{softmax}(QK^\top/\sqrt{d_k})\,V$ gives
#   `(B, L, d_v)`.
# - `mha_lib.AttentionHead(d_model, d_k, d_v)` is one head: three `nn.Linear` layers and
#   `scaled_dot_product_attention`; `head(x, x, x)` is self-attention.
# - Projections can express relations between words ("bad" looks for "not"), but random ones
#   give meaningless maps; the patterns come from training.
# - Self-attention is permutation equivariant: shuffle the tokens and the outputs shuffle with
#   them. Word order has to be added, with positional encodings.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/02_self_attention_one_head.ipynb`; each
# exercise checks itself and tells you what is wrong. See the README for how to start your
# own copy.
# Exercises 2.1 and 2.2 rebuild self-attention and the head; exercise 2.3 asks how sharp the
# hand-set head of section 6 must be as the sentence grows, and how long a sentence its gap of 6
# can serve.
#
# ## What comes next
#
# One head draws one attention map, so it can follow one kind of relation at a time. In
# **chapter 03** several heads run side by side, each with its own $W_q, W_k, W_v$, and their
# outputs are combined: multi-head attention, built step by step and packed into
# `mha_lib.MultiHeadAttention`.
