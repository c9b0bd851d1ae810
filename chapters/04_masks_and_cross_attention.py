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
# # Chapter 04 · Masks and cross-attention
#
# Chapter 03 built `MultiHeadAttention` and ran it on sequences that were all the same
# length and could see each other completely. Real inputs are messier: sentences in a batch
# have different lengths, a text generator must not read the words it has not written yet,
# and a translator reads one sentence while it writes another. All three are handled by two
# small things: **masks**, which say which keys a query may look at, and **cross-attention**,
# in which the queries come from one sequence and the keys and values from another. Chapter 01
# built padding and causal masks for one attention function; here they go into
# `MultiHeadAttention` for a real batch, and we meet the queries a mask leaves with nothing.
#
# **By the end of this chapter you will be able to**
#
# - pad a batch of sentences of different lengths and build its `(B, 1, 1, Lk)` padding mask,
#   and explain how it broadcasts against the scores `(B, H, Lq, Lk)`;
# - check that padding cannot change a real token's output, and that a causal mask keeps a
#   future token from changing earlier outputs;
# - combine a causal mask with a padding mask using `&`;
# - run cross-attention, where `Lq` differs from `Lk`, and mask the padding of the source;
# - recognise a **fully masked row**, explain why it turns a whole network's outputs and
#   gradients into NaN, and how `mha_lib` prevents it;
# - choose between `-inf` and `-1e9` for masking, and say what each does in float16;
# - give each head a learned **sink** logit (gpt-oss) and a **QK-norm** (Gemma 3, Qwen 3), and
#   say what each does to the weights and the scores.
#
# *Sources.* *Transformers in Action* (Manning), section 2.2, places multi-head attention in
# an encoder layer that can be given an attention mask, and its listing 2.4 masks with
# `masked_fill(mask == 0, -1e9)`; this chapter's section 5 looks at that choice closely. The
# quotation in section 3 comes from Priyesh Dave's post "Day 28: Multi-Head Attention" (DEV
# Community): "when generating a word in French, the model can focus on the related English
# word in the input". Cross-attention between an encoder and a decoder is from Vaswani et
# al., "Attention Is All You Need" (2017), section 3.2.3. Section 6's sinks: Xiao et al.,
# "Efficient Streaming Language Models with Attention Sinks" (2024), OpenAI's gpt-oss model card
# (2025) and Evan Miller's "Attention Is Off By One" (2023); section 7's QK-norm: Dehghani et
# al., "Scaling Vision Transformers to 22 Billion Parameters" (2023), and Wortsman et al.,
# "Small-scale proxies for large-scale Transformer training instabilities" (2023), on logits
# that grow in training.

# %% [markdown]
# ## Set-up
#
# As in every chapter: pick the device (`MHA_DEVICE=cpu` forces the CPU), seed every random
# generator, draw random numbers on the CPU and move them, and print rounded numbers.

# %%
import copy
import math

import matplotlib.pyplot as plt
import torch
from torch import nn

import mha_lib
from mha_lib import (
    MultiHeadAttention,
    causal_mask,
    combine_heads,
    get_device,
    padding_mask,
    plot_attention,
    seed_everything,
    split_heads,
)

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. Padding masks for a batch of different lengths
#
# A batch is one tensor, so every sentence in it must have the same number of tokens. Here
# are three real sentences of 5, 3 and 6 words. We split them into words (a real tokenizer
# cuts words into smaller pieces, but the masking is the same), give every word an id, and
# **pad** the short sentences at the end with a special `<pad>` token, id 0.

# %%
sentences = ["The movie was not bad", "I loved it", "What a waste of two hours"]
tokens = [s.lower().split() for s in sentences]
extra_words = ["very"]  # used in section 2
vocab = ["<pad>"] + sorted({w for sentence in tokens for w in sentence} | set(extra_words))
word_id = {w: i for i, w in enumerate(vocab)}

lengths = [len(t) for t in tokens]
L = max(lengths)
padded = [t + ["<pad>"] * (L - len(t)) for t in tokens]
ids = torch.tensor([[word_id[w] for w in t] for t in padded])  # (B, L)

print("lengths:", lengths, " padded length:", L, " vocabulary size:", len(vocab))
for t, row in zip(padded, ids.tolist()):
    print(f"{' '.join(t):38s} {row}")

# %% [markdown]
# Each id becomes a vector through an embedding table, and the vectors go through one
# multi-head attention layer with 2 heads. Both are untrained (random), which is all we
# need here: masking is about *where* attention may go, not about what it finds there.

# %%
d_model, num_heads = 16, 2
embedding = nn.Embedding(len(vocab), d_model).to(device)  # random vectors, drawn on the CPU
mha = MultiHeadAttention(d_model, num_heads).to(device).eval()

x = embedding(ids.to(device)).detach()  # (B, L, d_model)
print("ids:", tuple(ids.shape), "-> embeddings x:", tuple(x.shape))

# %% [markdown]
# `padding_mask(lengths)` is True where a key is a real token, False where it is padding.
# Its shape is `(B, 1, 1, Lk)`: one row of keys per sentence.

# %%
keep = padding_mask(lengths).to(device)  # (B, 1, 1, Lk)
print("mask:", tuple(keep.shape), keep.dtype)
print(keep[:, 0, 0].int().cpu())

# %% [markdown]
# The scores have shape `(B, H, Lq, Lk)`. PyTorch lines the two shapes up **from the right**
# (a shape with fewer axes gets size-1 axes added on its left) and stretches every size-1 axis
# to match, without copying: the two 1s of the mask stand for "the same for every head" and
# "the same for every query". So each query of each head of
# sentence `b` sees the key row of sentence `b`.

# %%
out, weights = mha(x, x, x, mask=keep, return_weights=True)
print("mask   ", tuple(keep.shape))
print("scores ", tuple(weights.shape), "(the weights have the shape of the scores)")
print("broadcast:", tuple(torch.broadcast_shapes(keep.shape, weights.shape)))
print("\nthe mask as seen by sentence 1, head 0 (rows = queries, columns = keys):")
print(keep.expand_as(weights)[1, 0].int().cpu())
print("output:", tuple(out.shape))
assert (weights[1, :, :, 3:] == 0).all()  # sentence 1's three <pad> keys get exactly 0

# %% [markdown]
# Here is what the two heads do with "I loved it" and its three `<pad>` tokens. No query
# puts any weight on a `<pad>` key: those columns are exactly 0. The `<pad>` *queries* (the
# last three rows) are computed like any other. The three rows are identical because every
# `<pad>` has id 0 and so the same embedding vector. Their outputs are meaningless, and
# whatever comes later (a loss, a pooling) must ignore them.

# %%
plot_attention(weights[1], padded[1], title="Padding mask: no query attends to <pad>")
plt.show()

# %% [markdown]
# **Test: padding can't matter.** If the mask works, the padding vectors could be any finite
# numbers, and the real tokens' outputs would not change (NaN or inf would not do: a weight of
# 0 times NaN is NaN, as section 4 shows). Let's replace every padding
# vector by large random garbage and compare. As a control, we do the same without the mask,
# where the outputs must change (otherwise the test would prove nothing).

# %%
is_real = keep[:, 0, 0]  # (B, L): True for real tokens
garbage = 100 * torch.randn(x.shape).to(device)
x_garbage = torch.where(is_real[..., None], x, garbage)  # same real tokens, new padding

masked_garbage = mha(x_garbage, x_garbage, x_garbage, mask=keep)
unchanged = torch.allclose(masked_garbage[is_real], out[is_real], atol=1e-5)
unmasked_garbage = mha(x_garbage, x_garbage, x_garbage)
changed_without_mask = not torch.allclose(unmasked_garbage[is_real], mha(x, x, x)[is_real], atol=1e-5)
assert unchanged and changed_without_mask
print("with the padding mask, real tokens' outputs unchanged:", unchanged)
print("without it, real tokens' outputs changed:             ", changed_without_mask)

# %% [markdown]
# ## 2. Causal masks
#
# A model that writes text one token at a time (a decoder, like GPT) is trained on whole
# sentences at once, so it must be kept from peeking: query $i$ may look at keys
# $0 \dots i$ only. `causal_mask(L)` is the lower triangle of an `(L, L)` matrix.

# %%
causal = causal_mask(L, device=device)  # (L, L)
print("causal:", tuple(causal.shape))
print(causal.int().cpu())

# %% [markdown]
# A padded batch needs both masks at once: a key is allowed if it is in the past **and** it
# is a real token. Boolean masks combine with `&`, and broadcasting does the rest:
# `(L, L) & (B, 1, 1, L) -> (B, 1, L, L)`, one `(L, L)` mask per sentence, shared by the heads.

# %%
both = causal & keep  # (L, L) & (B, 1, 1, L) -> (B, 1, L, L)
print("causal", tuple(causal.shape), "& padding", tuple(keep.shape), "->", tuple(both.shape))
print("sentence 0 ('the movie was not bad <pad>'):")
print(both[0, 0].int().cpu())

# %%
out_causal, weights_causal = mha(x, x, x, mask=both, return_weights=True)
plot_attention(weights_causal[0], padded[0], title="Causal & padding: no peeking ahead, no <pad>")
plt.show()

# %% [markdown]
# Every row still sums to 1, and the first token attends only to itself. With padding at the
# end, a `<pad>` query still has the real tokens before it to look at (the last row).
#
# **Test: the future can't leak.** Change one word, "not" to "very" (position 3 of
# the first sentence). With the causal mask the outputs at positions 0 to 2 must stay exactly
# as they were; positions 3 and 4 can see the change and should move. Without the causal mask
# (padding mask only), every real position sees every other, so everything moves.

# %%
ids_changed = ids.clone()
ids_changed[0, 3] = word_id["very"]
x_changed = embedding(ids_changed.to(device)).detach()

def moved(a: torch.Tensor, b: torch.Tensor) -> list[bool]:
    """Per position: did the output vector change?"""
    return (a - b).abs().amax(dim=-1).gt(1e-5).tolist()

with_mask = moved(mha(x_changed, x_changed, x_changed, mask=both)[0], out_causal[0])
without_mask = moved(mha(x_changed, x_changed, x_changed, mask=keep)[0], out[0])
real = lengths[0]
assert with_mask[:3] == [False] * 3 and all(with_mask[3:real])
assert all(without_mask[:real])
print("position:       ", " ".join(f"{w:>6s}" for w in padded[0][:real]))
print("causal & pad:   ", " ".join(f"{'moved' if m else '-':>6s}" for m in with_mask[:real]))
print("padding only:   ", " ".join(f"{'moved' if m else '-':>6s}" for m in without_mask[:real]))

# %% [markdown]
# ## 3. Cross-attention: queries from one sequence, keys and values from another
#
# So far the queries, keys and values all came from the same sequence: **self-attention**,
# `mha(x, x, x)`. In a translator (the original Transformer), the decoder also has a
# **cross-attention** layer: its queries come from the sentence being written, its keys and
# values from the encoded source sentence. In Priyesh Dave's words, "when generating a word
# in French, the model can focus on the related English word in the input".
#
# Nothing in `MultiHeadAttention` changes: call it as `mha(target, source, source)`. The two
# sentences may have different lengths, so the scores are no longer square:
# `(B, H, Lq, Lk)` with `Lq` = French length and `Lk` = English length.

# %%
french = torch.randn(1, 4, d_model).to(device)   # stand-in for "le chat noir dort"
english = torch.randn(1, 5, d_model).to(device)  # stand-in for "the black cat is sleeping"
out_cross, weights_cross = mha(french, english, english, return_weights=True)
print("query (French)   ", tuple(french.shape))
print("key/value (Engl.)", tuple(english.shape))
print("weights          ", tuple(weights_cross.shape), "= (B, H, Lq, Lk)")
print("output           ", tuple(out_cross.shape), "= one vector per French position")

# %% [markdown]
# With random vectors and random weights the map would be arbitrary, and a picture of it
# would teach nothing. A trained translator learns its embeddings and projections; to see
# what it *could* learn, we set them **by hand** instead. Every word of either language gets
# an 8-number vector:
#
# - numbers 0-3 say what the word **means** (one-hot over *the*, *cat*, *black*, *sleep*):
#   "chat" and "cat" get the same meaning vector. "is sleeping" translates as the single word
#   "dort", so we give both "is" and "sleeping" the meaning *sleep*;
# - numbers 4-5 say **where** the word is in its sentence, as an angle from 0 (first word)
#   to $\pi$ (last word): $(\cos\theta, \sin\theta)$;
# - numbers 6-7 are unused, and a `<pad>` token is all zeros.
#
# These vectors and the weights below are **hand-set for illustration, not learned**.

# %%
concepts = ["the", "cat", "black", "sleep"]
meaning = {"the": "the", "cat": "cat", "black": "black", "is": "sleep", "sleeping": "sleep", "sleeps": "sleep",
           "le": "the", "chat": "cat", "noir": "black", "dort": "sleep"}


def hand_embed(words: list[str], length: int) -> torch.Tensor:
    """(length, 8): meaning one-hot in 0-3, position angle in 4-5, zeros for padding."""
    vectors = torch.zeros(length, 8)
    for i, word in enumerate(words):
        vectors[i, concepts.index(meaning[word])] = 1.0
        angle = math.pi * i / max(len(words) - 1, 1)
        vectors[i, 4], vectors[i, 5] = math.cos(angle), math.sin(angle)
    return vectors


english_words = [["the", "black", "cat", "is", "sleeping"], ["the", "cat", "sleeps"]]
french_words = [["le", "chat", "noir", "dort"], ["le", "chat", "dort"]]
src_lengths = [len(s) for s in english_words]
source = torch.stack([hand_embed(s, 5) for s in english_words]).to(device)  # (B, Lk, 8)
target = torch.stack([hand_embed(s, 4) for s in french_words]).to(device)   # (B, Lq, 8)
print("source (English):", tuple(source.shape), " target (French):", tuple(target.shape))
print("'chat' :", target[0, 1].cpu())
print("'cat'  :", source[0, 2].cpu())

# %% [markdown]
# Now the weights, also by hand. With `d_model = 8` and 2 heads, head 0 works on numbers 0-3
# and head 1 on numbers 4-7 (chapter 03's split). We make every projection the identity, so
# that head 0 compares **meanings** and head 1 compares **positions**, and multiply the
# queries by 10 so that the softmax picks clearly (the scores are divided by
# $\sqrt{d_k} = 2$, so a perfect match scores 5 and an unrelated word 0).

# %%
cross = MultiHeadAttention(d_model=8, num_heads=2).to(device).eval()
with torch.no_grad():
    for layer in (cross.W_q, cross.W_k, cross.W_v, cross.W_o):
        layer.weight.copy_(torch.eye(8))
        layer.bias.zero_()
    cross.W_q.weight.mul_(10.0)  # sharper queries
cross.requires_grad_(False)  # nothing to train here

translated, weights_tr = cross(target, source, source, return_weights=True)
print("weights:", tuple(weights_tr.shape), "= (B, H, Lq, Lk)")
plot_attention(weights_tr[0], french_words[0], english_words[0],
               head_titles=["head 0: same meaning", "head 1: same position"],
               title="Cross-attention: French queries, English keys (hand-set weights)")
plt.show()

# %% [markdown]
# Read the rows: each French word distributes its attention over the English words.
# Head 0 finds the translation: "chat" looks at "cat" and "noir" at "black", although French
# puts the adjective after the noun, and "dort" splits its attention between "is" and
# "sleeping". Head 1 only knows positions, so it follows the word order, not the meaning:
# "chat" (second word) looks mostly at "black" (second word), and "noir" (third of four) at
# "is" (fourth of five), both with 0.58; each gives only 0.35 to "cat". That is the
# point of having several heads: each one can look for a different relationship, and a
# trained model learns which ones help. Since $W_v$ and $W_o$ are the identity here, head 0's
# output for "noir" is almost (0.97) the meaning vector of "black": the French word has fetched
# the English one.

# %%
print(f"{'':19s} {'meaning fetched (the, cat, black, sleep)'}")
for i, word in enumerate(french_words[0]):
    looked_at = [f"{e} {w:.2f}" for e, w in zip(english_words[0], weights_tr[0, 0, i].tolist()) if w > 0.3]
    print(f"{word:4s} -> {', '.join(looked_at):22s} {translated[0, i, :4].cpu()}")
assert [english_words[0][j] for j in weights_tr[0, 0, :3].argmax(-1).tolist()] == ["the", "cat", "black"]

# %% [markdown]
# **Padding the source.** In the batch, the second English sentence, "the cat sleeps", has
# only 3 words and was padded to 5. The French queries must not attend to its padding, so
# cross-attention takes a padding mask **of the source**: `padding_mask(src_lengths)`, shape
# `(B, 1, 1, Lk)`, which broadcasts over the heads and over all `Lq` French queries. (The
# French `<pad>` query in the last row needs no mask: like any padding query, its output is
# ignored later.) Without the mask, head 0 gives some attention to the padding, which here
# scores 0 like any unrelated word; with it, none. Our hand-set head is so sure of itself that
# each real French word gives each padding key only 0.01 (the `<pad>` query's zero vector
# spreads evenly, 0.2 per key); a trained model is less sharp, and its padding vectors are not
# zeros, so unmasked padding can take much more.

# %%
src_keep = padding_mask(src_lengths, max_len=5).to(device)  # (B, 1, 1, Lk)
_, w_unmasked = cross(target, source, source, return_weights=True)
_, w_masked = cross(target, source, source, mask=src_keep, return_weights=True)
print("source mask:", tuple(src_keep.shape), " weights:", tuple(w_masked.shape))
assert (w_masked[1, :, :, 3:] == 0).all() and (w_unmasked[1, :, :, 3:] > 0).all()

src_labels = english_words[1] + ["<pad>"] * 2
tgt_labels = french_words[1] + ["<pad>"]
plot_attention(torch.stack([w_unmasked[1, 0], w_masked[1, 0]]), tgt_labels, src_labels,
               head_titles=["head 0, no mask", "head 0, source mask"],
               title="Cross-attention over a padded source (hand-set weights)")
plt.show()

# %% [markdown]
# ## 4. A fully masked row: when a query has nothing to look at
#
# A mask can block **every** key of some query. What should its output be? The textbook
# recipe (set blocked scores to $-\infty$, then softmax) has no answer: every
# $e^{-\infty}$ is 0, and the softmax divides by their sum, $0/0$. In floating point that
# is NaN, "not a number". (`torch.softmax` subtracts the row's maximum first, and
# $-\infty - (-\infty)$ is NaN as well.)

# %%
print(torch.softmax(torch.tensor([float("-inf")] * 4), dim=-1))

# %% [markdown]
# **When does it happen in practice?** More often than one would think. The helper below
# lists the queries whose whole mask row is False.

# %%
def fully_masked(mask: torch.Tensor) -> list[tuple[int, ...]]:
    """Index (..., query) of every query row in which no key is allowed."""
    return [tuple(i) for i in (~mask).all(dim=-1).nonzero().tolist()]

# %% [markdown]
# *A padding query under a causal and padding mask.* With padding at the end (section 2), a
# `<pad>` query can always see the real tokens before it. But to generate text for a whole
# batch at once, sentences are usually padded at the **start**, so that they all end at the
# same position and the next words are written side by side. Then a short sentence starts
# with `<pad>` queries, and causally each of them may only look at itself and the `<pad>`s
# before it, all blocked by the padding mask: every leading `<pad>` query has nothing to look
# at. Sentence 1 ("i loved it") has three of them, sentence 0 one.

# %%
left_keep = padding_mask(lengths).flip(-1)  # padding at the start: (B, 1, 1, L)
left_both = causal_mask(L) & left_keep      # (B, 1, L, L)
print("sentence 1, left-padded:", ["<pad>"] * (L - lengths[1]) + tokens[1])
print(left_both[1, 0].int())
print("fully masked (sentence, head, query):", fully_masked(left_both))

# %% [markdown]
# Some code also masks the padding *queries* (a 2-D mask `real_q & real_k`), which blocks
# every row of a padding query. *An empty sequence*, say an empty source document in
# cross-attention, blocks every row of its sequence. *A per-head restriction*, the exercise of
# chapter 12, gives each head its own mask: if head 1 may only look at the second half of the
# sequence and the model is also causal, the first queries of head 1 have nothing left.

# %%
real_k = padding_mask(lengths)      # (B, 1, 1, Lk), right padding again
real_q = real_k.transpose(-1, -2)   # (B, 1, Lq, 1)
print("2-D padding mask:  ", fully_masked(real_q & real_k), "(sentence, head, query)")
empty_source = padding_mask([3, 0]).expand(2, 1, 2, 3)  # 2 queries over sources of 3 and 0 tokens
print("empty sequence:    ", fully_masked(empty_source), "(sequence, head, query)")
first_half = torch.arange(L) < L // 2               # (Lk,) keys 0, 1, 2
per_head = torch.stack([first_half, ~first_half])   # (H, Lk): head 0 first half, head 1 second half
restricted = per_head[:, None, :] & causal_mask(L)  # (H, 1, Lk) & (L, L) -> (H, L, L)
print("per-head & causal: ", fully_masked(restricted), "(head, query)")

# %% [markdown]
# **How the NaN spreads.** Let's run the per-head restriction through a multi-head
# attention written the textbook way: our module's own projections, but attention that only
# does `masked_fill(-inf)` and softmax. First, a check that it is the same computation as
# `mha_lib` when no row is fully masked.

# %%
def naive_attention(q, k, v, mask):
    """Textbook attention: blocked scores become -inf, nothing else."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Lq, Lk)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights @ v, weights                                # (..., Lq, d_v)


def naive_mha(module: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """mha_lib's MultiHeadAttention, step by step, with naive_attention inside."""
    q = split_heads(module.W_q(x), module.num_heads)  # (B, H, L, d_k)
    k = split_heads(module.W_k(x), module.num_heads)
    v = split_heads(module.W_v(x), module.num_heads)
    heads, _ = naive_attention(q, k, v, mask)         # (B, H, L, d_k)
    return module.W_o(combine_heads(heads))          # (B, L, d_model)


x2 = x[2:3].clone()  # "what a waste of two hours", (1, 6, d_model)
assert torch.allclose(naive_mha(mha, x2, causal), mha(x2, x2, x2, mask=causal), atol=1e-5)
print("naive_mha == mha_lib's MultiHeadAttention with a causal mask")

# %% [markdown]
# Now the restricted mask, where head 1's queries 0, 1 and 2 have nothing to look at. Follow
# the NaN:
#
# 1. in head 1, those three rows of weights are NaN, so are those rows of head 1's output;
# 2. `combine_heads` puts head 1's NaNs next to head 0's good numbers, and the output
#    projection $W_o$ mixes all features of a token: tokens 0, 1 and 2 become NaN *entirely*;
# 3. a second attention layer mixes tokens. Even if its mask blocks tokens 0-2 as keys,
#    their weight is 0, and $0 \times \text{NaN} = \text{NaN}$: now *every* token is NaN.

# %%
restricted_dev = restricted.to(device)
layer1 = naive_mha(mha, x2, restricted_dev)
print("layer 1, NaN per token:", layer1.isnan().all(dim=-1)[0].tolist())

only_tokens_3_to_5 = (torch.arange(L) >= 3).to(device)  # (Lk,): block keys 0, 1, 2
layer2 = naive_mha(mha, layer1, only_tokens_3_to_5)
print("layer 2, NaN per token:", layer2.isnan().all(dim=-1)[0].tolist())

# %% [markdown]
# The gradients are no better. Train on the three tokens that came out fine (3, 4, 5), and
# leave the NaN tokens out of the loss. Backpropagation still multiplies the NaN weights and
# outputs of tokens 0-2 by their gradient, which is 0, and $0 \times \text{NaN} = \text{NaN}$:
# the gradients of $W_v$ and $W_o$ (head 1's half of each) fill with NaN. ($W_q$ and $W_k$
# escape only because `masked_fill` passes no gradient to the blocked scores.) One optimizer
# step later those weights are NaN, and so is every output of the model, masked or not.
# We try it on a copy of our module.

# %%
victim = copy.deepcopy(mha)
naive_mha(victim, x2, restricted_dev)[0, 3:].sum().backward()
for name in ("W_q", "W_k", "W_v", "W_o"):
    grad = getattr(victim, name).weight.grad
    print(f"{name}.weight.grad: {grad.isnan().float().mean().item():4.0%} NaN")
assert victim.W_v.weight.grad.isnan().any()

torch.optim.SGD(victim.parameters(), lr=0.01).step()
print("after one SGD step, every output is NaN:", victim(x2, x2, x2, mask=causal).isnan().all().item())

# %% [markdown]
# **How `mha_lib` avoids it.** `mha_lib.scaled_dot_product_attention` adds three lines
# after masking (read them in `mha_lib/attention.py`):
#
# ```python
# blocked_row = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., Lq, 1)
# scores = scores.masked_fill(blocked_row, 0.0)
# weights = torch.softmax(scores, dim=-1).masked_fill(blocked_row, 0.0)
# ```
#
# It finds the rows whose scores are all $-\infty$, gives them harmless finite scores (0) so
# that the softmax has no $0/0$ to compute, and then sets those rows' weights to 0. A query
# with nothing to look at gets **zero weights and a zero output**, and, since the weights are
# a constant 0 there, zero gradient. The other rows are untouched. Through
# `MultiHeadAttention`, that head contributes zeros for the token, and $W_o$ adds its bias.

# %%
lib_out, lib_weights = mha(x2, x2, x2, mask=restricted_dev, return_weights=True)
print("head 1 weights, queries 0-3:\n", lib_weights[0, 1, :4].detach().cpu())
print("any NaN in the output:", lib_out.isnan().any().item())
lib_out[0, 3:].sum().backward()
print("any NaN in the gradients:", any(p.grad.isnan().any().item() for p in mha.parameters()))
mha.zero_grad()

q, k, v = (torch.randn(1, 6, 4).to(device) for _ in range(3))
heads_out, heads_w = mha_lib.scaled_dot_product_attention(q, k, v, restricted_dev[1:])  # head 1's mask
assert (heads_w[0, :3] == 0).all() and (heads_out[0, :3] == 0).all()
assert torch.allclose(heads_w[0, 3:].sum(-1), torch.ones(3, device=device))
print("blocked queries 0-2: zero weights, zero output; queries 3-5: weights sum to 1")

# %% [markdown]
# ## 5. `-inf` or `-1e9`?
#
# The listing of *Transformers in Action* (and the Annotated Transformer, and many others)
# masks with a large negative number instead of $-\infty$:
# `scores.masked_fill(mask == 0, -1e9)`. Here is that choice as a function, beside our
# `-inf` version.

# %%
def big_negative_attention(q, k, v, mask, fill=-1e9):
    """Like the book's listing: blocked scores become a large negative number."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    weights = torch.softmax(scores.masked_fill(mask == 0, fill), dim=-1)
    return weights @ v, weights

# %% [markdown]
# **Ordinary rows: the same, exactly.** In float32, $e^{-10^9}$ underflows to exactly 0,
# so a query with at least one allowed key gets bit-for-bit the same weights as with $-\infty$.
# We check with the causal & padding mask of section 2 on random queries, keys and values.

# %%
q, k, v = (torch.randn(3, 2, L, 8).to(device) for _ in range(3))
assert not fully_masked(both)
out_inf, w_inf = naive_attention(q, k, v, both)
out_big, w_big = big_negative_attention(q, k, v, both)
print("-inf and -1e9 give identical weights and outputs:", torch.equal(w_inf, w_big) and torch.equal(out_inf, out_big))

# %% [markdown]
# **A fully masked row: the difference.** Give the query a row of keys that are all blocked.
# With $-\infty$ it is NaN; with $-10^9$ every score is the *same* $-10^9$, so the softmax
# spreads the weight *evenly* over all the blocked keys. The output is the plain average of
# the values it was told not to look at: no error, no NaN, it silently attends to padding.
# `mha_lib` returns zeros.

# %%
q, k = torch.randn(1, 1, 8).to(device), torch.randn(1, 4, 8).to(device)
v = torch.arange(4.0).repeat_interleave(2).reshape(1, 4, 2).to(device)  # value of key j = (j, j)
nothing = torch.zeros(1, 1, 4, dtype=torch.bool, device=device)      # the query may see no key
for name, fn in [("-inf", naive_attention), ("-1e9", big_negative_attention),
                 ("mha_lib", mha_lib.scaled_dot_product_attention)]:
    o, w = fn(q, k, v, nothing)
    print(f"{name:8s} weights {w[0, 0].cpu()}  output {o[0, 0].cpu()}")
assert torch.allclose(big_negative_attention(q, k, v, nothing)[0], v.mean(dim=-2, keepdim=True))

# %% [markdown]
# **float16 and bfloat16.** Models often run in half precision to save memory and time.
# float16 can hold numbers only up to 65504, so $-10^9$ does not fit. `masked_fill` refuses
# it; converting it some other way (for example casting a float32 additive mask) silently
# gives $-\infty$, and with it the NaN that `-1e9` was meant to avoid. bfloat16 keeps
# float32's range with fewer digits: $-10^9$ fits there, rounded.

# %%
scores16 = torch.randn(2, 4).to(device, torch.float16)
mask16 = torch.tensor([[True, True, False, False], [False, False, False, False]], device=device)
try:
    scores16.masked_fill(mask16 == 0, -1e9)
except RuntimeError as error:
    print("float16 masked_fill(-1e9) -> RuntimeError:", error)
print("torch.tensor(-1e9).half():", torch.tensor(-1e9).half().item())
print("-1e9 in bfloat16:         ", torch.tensor(-1e9).bfloat16().item())
print()
for dtype in (torch.float16, torch.bfloat16, torch.float32):
    print(f"torch.finfo({str(dtype):14s}).min = {torch.finfo(dtype).min:.6g}")

# %% [markdown]
# The usual portable substitute is `torch.finfo(dtype).min`, the most negative number the
# dtype can hold. It fits, but a fully masked row still averages its blocked keys uniformly
# (second row below), as with `-1e9`. And because it sits at the edge of the range, *adding* it
# to a negative score (an additive mask) overflows to $-\infty$, which brings back the NaN of a
# fully masked row.

# %%
smallest = torch.finfo(torch.float16).min
print(torch.softmax(scores16.masked_fill(mask16 == 0, smallest).float(), dim=-1).cpu())
print("-20 + finfo(float16).min =", (torch.tensor(-20.0, dtype=torch.float16) + smallest).item())

# %% [markdown]
# **The course's choice.** `mha_lib` takes **boolean masks** (True = may attend), blocks
# with **$-\infty$**, and treats fully masked rows explicitly (section 4). $-\infty$ exists in
# float16, bfloat16, float32 and float64, gives blocked keys a weight of exactly 0, and never
# overflows.
# And a query that may see nothing gets a zero output and zero gradients: neither NaN,
# which would poison the whole model, nor a quiet average of the padding, which would hide
# the bug. `F.scaled_dot_product_attention` takes the same boolean masks; chapter 05
# compares the two.

# %% [markdown]
# ## 6. A sink: somewhere for the weight to go
#
# Softmax hands out a weight of exactly 1 on every row, even when no key is worth reading. A
# fully masked row is the extreme case; a head with nothing useful to read is the common one.
# Trained models find their own outlet: they park weight on the first tokens, the
# **attention sinks** that StreamingLLM (Xiao et al., 2023) keeps in its sliding window
# (chapter 11). gpt-oss (OpenAI, 2025) builds the outlet in: each head learns one more
# logit, the **sink**, that joins every row's softmax but belongs to no key, so the weights
# may sum to less than 1. That is exactly one extra key whose score is the sink and whose
# value is zero (Miller's "softmax plus one" is a sink fixed at 0).
# `scaled_dot_product_attention(..., sinks=...)` takes one logit per row (here `(H, 1, 1)`,
# one per head), and `MultiHeadAttention(d_model, H, sinks=True)` learns them (`mha.sinks`, `(H,)`).
# Below, head 0 has a sink of 0 and head 1 one of 2; query 0 may see no key, query 1 all four.

# %%
q = torch.randn(1, 2, 2, 8).to(device)  # (B, H, Lq, d_k) with Lq = 2
k, v = (torch.randn(1, 2, 4, 8).to(device) for _ in range(2))  # (B, H, Lk, d_k) with Lk = 4
keys_seen = torch.tensor([[False] * 4, [True] * 4], device=device)  # (Lq, Lk): query 0 sees nothing
sinks = torch.tensor([0.0, 2.0], device=device)[:, None, None]  # (H, 1, 1): one logit per head
plain_out, plain_w = mha_lib.scaled_dot_product_attention(q, k, v, keys_seen)
sink_out, sink_w = mha_lib.scaled_dot_product_attention(q, k, v, keys_seen, sinks=sinks)
print("weights' sum per (head, query), no sink:  ", plain_w.sum(-1)[0].cpu())
print("weights' sum per (head, query), with sink:", sink_w.sum(-1)[0].cpu())
print("query 0 (sees nothing), with a sink: output all zero:", bool((sink_out[0, :, 0] == 0).all()))

# the same as one more key: score = the sink (a zero key, the sink in the float mask), value = zero
zero = torch.zeros(1, 2, 1, 8, device=device)
extra = torch.zeros(2, 4, device=device).masked_fill(~keys_seen, float("-inf"))  # (Lq, Lk) as a float mask
extra = torch.cat([extra.expand(2, 2, 4), sinks.expand(2, 2, 1)], dim=-1)  # (H, Lq, Lk + 1)
appended_out, _ = mha_lib.scaled_dot_product_attention(q, torch.cat([k, zero], -2), torch.cat([v, zero], -2), extra)
assert torch.allclose(sink_out, appended_out, atol=1e-6)
assert torch.allclose(plain_w.sum(-1)[0, :, 1], torch.ones(2, device=device))
assert (sink_w.sum(-1)[0, :, 1] < 1).all() and (sink_out[0, :, 0] == 0).all()
print("sink == one more key with score = sink and a zero value (within 1e-6):", True)

# %% [markdown]
# Without a sink, query 1's weights sum to 1 in both heads and query 0 gets the course's
# guard (zero weights, zero output). With a sink, the sink takes `e^s / (e^s + Σ e^score)` of
# every row, more in head 1 (`s = 2`) than in head 0, and a row with no key at all gives it
# everything: a zero output that needs no guard. As a parameter the sink is learned with the
# rest; the (H,) logits get gradients like any weight.

# %%
sink_mha = MultiHeadAttention(d_model, num_heads, sinks=True).to(device).eval()
print(sink_mha)
print("sinks:", tuple(sink_mha.sinks.shape), "starting at", sink_mha.sinks.detach().cpu())

# %% [markdown]
# ## 7. Keeping the scores in range: QK-norm
#
# Section 5 met scores too large for float16. Scores grow with the queries and keys: scale a
# token's vector by `c` and its scores grow by `c²`, the softmax turns one-hot, and in training
# such logit growth is a known cause of loss spikes (Dehghani et al.; Wortsman et al.). **QK-norm**
# normalises each head's query and key to a fixed length before the dot product (per head in
# Gemma 3 and Qwen 3; OLMo-2 normalises the whole projection before splitting it), here with an
# RMSNorm whose learned gain `g` is shared by the heads: `|q| = |k| = √d_k` for `g = 1`, so no score
# can exceed `|q| |k| / √d_k = √d_k`, however large the inputs. `MultiHeadAttention(...,
# qk_norm=True)` adds `q_norm` and `k_norm` (RMSNorm over `d_k`) after splitting the heads (and
# before RoPE, chapter 06). The largest score, and how much weight each row's largest weight
# takes, as the inputs grow:

# %%
plain_mha = MultiHeadAttention(d_model, num_heads).to(device).eval()
normed_mha = MultiHeadAttention(d_model, num_heads, qk_norm=True).to(device).eval()
normed_mha.load_state_dict(plain_mha.state_dict(), strict=False)  # the same W_q, W_k, W_v, W_o; gains of 1
d_k = d_model // num_heads
x_scale = torch.randn(2, 6, d_model).to(device)  # (B, L, d_model)


def largest_score(module, x):
    """The largest |q·k| / √d_k over every head, query and key: (B, H, L, d_k) heads, after QK-norm if any."""
    with torch.no_grad():
        q, k, _ = module.project(x, x, x)
        if module.qk_norm:
            q, k = module.q_norm(q), module.k_norm(k)
        return (q @ k.transpose(-2, -1) / math.sqrt(d_k)).abs().max().item()


print(f"bound with QK-norm: √d_k = {math.sqrt(d_k):.2f}")
for scale in (1, 10, 100):
    x_big = scale * x_scale
    row = []
    for module in (plain_mha, normed_mha):
        with torch.no_grad():
            _, w = module(x_big, x_big, x_big, return_weights=True)
        row.append((largest_score(module, x_big), w.max(-1).values.mean().item()))
    (plain_s, plain_top), (norm_s, norm_top) = row
    print(f"inputs x {scale:3d}: largest score {plain_s:9.1f} plain, {norm_s:4.2f} QK-norm;"
          f"  mean top weight {plain_top:.2f} plain, {norm_top:.2f} QK-norm")
    assert norm_s <= math.sqrt(d_k) + 1e-4
assert largest_score(plain_mha, 100 * x_scale) > 1000 * largest_score(plain_mha, x_scale)

# %% [markdown]
# Without the norm, inputs 100 times larger make scores about 10⁴ times larger and every row
# close to one-hot; with it, the scores stay below √d_k and the weights barely move: the model
# sets the sharpness through the learned gains instead, and not by accident.

# %% [markdown]
# ## Recap
#
# - A **padding mask** `padding_mask(lengths)` has shape `(B, 1, 1, Lk)` and broadcasts over
#   heads and queries against scores `(B, H, Lq, Lk)`. With it, the padding vectors can be
#   any finite numbers: the real tokens' outputs don't change.
# - A **causal mask** `causal_mask(L)` is a lower triangle; `causal & padding` gives
#   `(B, 1, L, L)`. With it, changing a token changes no earlier output.
# - **Cross-attention** is `mha(target, source, source)`: queries from one sequence, keys and
#   values from another, weights `(B, H, Lq, Lk)` with `Lq ≠ Lk`. The source's padding
#   is masked with the source's lengths.
# - A **fully masked row** (left padding with a causal mask, an empty sequence, a per-head
#   restriction) makes softmax compute $0/0$: NaN, which $W_o$ spreads over the token, the
#   next layer over the sequence ($0 \times \text{NaN} = \text{NaN}$), and backpropagation
#   over the weights. `mha_lib` gives such a row zero weights and a zero output.
# - **`-1e9` instead of `-inf`** gives the same result on ordinary rows in float32, but
#   silently averages the blocked keys on a fully masked row, and does not fit in float16.
# - A learned **sink** (`sinks=...`, `MultiHeadAttention(sinks=True)`, as in gpt-oss) is one
#   more logit per head in every row's softmax, for no key: the same as one more key with a zero
#   value. The weights may then sum to less than 1, and a row with no key gives the sink all.
# - **QK-norm** (`qk_norm=True`) normalises each head's queries and keys, so that no score
#   exceeds `g² √d_k` however large the inputs grow.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/04_masks_and_cross_attention.ipynb`; each
# exercise checks itself and tells you what is wrong. See the README for how to start your own
# copy.
# Exercises 4.1 to 4.3 combine masks, guard fully masked rows and use cross-attention;
# exercise 4.4 builds the mask of a left-padded batch (section 4) and decides what a padding
# query should see, so that no row is left empty.
#
# ## What comes next
#
# Our module now handles masks, cross-attention and the awkward corner of a query with
# nothing to look at. But is it *right*? In **chapter 05** we check `MultiHeadAttention`
# against PyTorch's own `nn.MultiheadAttention` with the weights copied in, meet its opposite
# mask convention (True = blocked), and compare against `F.scaled_dot_product_attention`.
