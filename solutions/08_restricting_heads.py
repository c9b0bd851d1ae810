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
# # Solutions · Chapter 08 · Restricting each head to half of the sequence
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/08_restricting_heads.ipynb`:
# > the same exercises, with the solutions filled in, every comparison computed, and a model
# > answer to the written question, backed by the measurements above it.
# <!-- END SOLUTION -->
#
# The "Try it yourself" of the source post, in three parts:
#
# 1. build the mask and run restricted multi-head attention (two checks);
# 2. compare it with the unrestricted module on the post's tiny configuration and on a longer
#    sentence: per-head maps, output differences, what each head's output is made of;
# 3. retrain chapter 06's sentiment model with restricted heads and measure what it costs when
#    "not" and the sentiment word fall in different halves.
#
# Then write what changed and what it suggests about the role of heads.
#
# <!-- EXERCISE ONLY
# Part 1 has two checks, like the other exercises: replace each `raise NotImplementedError`, run
# the cell, then its check. The cells of parts 2 and 3 that say *your code here* have no check:
# compute what the text asks for, then compare with `solutions/08_restricting_heads.ipynb`.
# Work in your own copy (`make exercise N=08`, or `.venv/bin/python -m mha_lib start 08`).
# -->

# %%
import matplotlib.pyplot as plt
import torch

from mha_lib import MultiHeadAttention, get_device, plot_attention, seed_everything, split_heads
from mha_lib.checks import check_halves_mask, check_restricted_attention

device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## Part 1 · The restriction
#
# ### Exercise 8.1 · The halves mask
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
# ### Exercise 8.2 · Restricted multi-head attention
#
# Write `restricted_attention(mha, x)`: self-attention of `x (B, L, d_model)` through the
# two-head `mha_lib.MultiHeadAttention` `mha`, with head 0 restricted to the first half and
# head 1 to the second. Return `(output, weights)`.
#
# <details><summary>Hint</summary>
#
# Chapter 08 showed how an `(H, L, L)` mask broadcasts through the module, and which shape
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
# 2 heads. The two modules below share their weights; only the mask differs.

# %%
seed_everything(0)
mha = MultiHeadAttention(d_model=8, num_heads=2).to(device).eval()
x = torch.randn(2, 4, 8).to(device)

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
# Repeat 2.1 on a sentence of 9 words, with the words as the maps' axis labels: "the movie was
# not bad but the ending was". Use random embeddings of size 16 and a fresh two-head module,
# both made after `seed_everything(1)`. Which keys does each head keep, which head gets the middle
# word of this odd-length sentence, and what does that mean for "not" and "bad"?

# %%
# BEGIN SOLUTION
sentence = "the movie was not bad but the ending was".split()
seed_everything(1)
mha16 = MultiHeadAttention(d_model=16, num_heads=2).to(device).eval()
emb = torch.randn(1, len(sentence), 16).to(device)
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

# %% [markdown]
# ## Part 3 · What it costs a trained model
#
# Chapter 06's sentiment model (one encoder layer with two heads, classifying from the `<cls>`
# token at position 0) learned that "not" flips the sentiment word. Here each sentence is
# restricted by **its own** length, as the model sees it: with `n` real tokens (`<cls>` included),
# head 0 may attend to positions `[0, n // 2)` and head 1 to `[n // 2, n)`; padding stays masked.
#
# 1. Write `halves_for_batch(tokens)` returning a bool mask `(B, 2, L, L)` for a batch of padded
#    token ids `(B, L)` (the padding id is `vocab.pad_id`). The halves come from each sentence's
#    own length, not from the padded `L`: with `halves_mask(L)`, a short sentence would lie
#    entirely in head 0's half. The padding keys may stay True: the model masks them anyway.
# 2. Train the unrestricted model as in chapter 06, then measure its held-out accuracy in three
#    groups: plain sentences, negated sentences with "not" and the sentiment word in the **same**
#    half, and in **different** halves. Then apply the restriction to the trained model without
#    retraining, and measure again.
# 3. Retrain with the restriction from the start (a few seeds) and measure again.
#
# `mha_lib.sentiment` has what you need: `make_datasets`, `Vocab`, `SentimentClassifier`,
# `train_model(model, train, vocab, mask=..., reports=0)` and `predict(model, examples, vocab,
# mask=...)`, whose `mask` may be a function of the batch's tokens, like `halves_for_batch`. An
# `Example` knows its `tokens`, `negated`, `negation_pos` and `sentiment_pos` (word indices:
# word `i` sits at position `i + 1`, after `<cls>`).

# %%
from mha_lib.sentiment import SentimentClassifier, Vocab, make_datasets, predict, train_model

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
    found = {"plain": [], "not + word, same half": [], "not + word, different halves": []}
    for i, e in enumerate(examples):
        if not e.negated:
            found["plain"].append(i)
            continue
        split = (len(e.tokens) + 1) // 2  # in positions, <cls> included
        same = (e.negation_pos + 1 < split) == (e.sentiment_pos + 1 < split)
        found["not + word, same half" if same else "not + word, different halves"].append(i)
    return found


labels = torch.tensor([e.label for e in test])
test_groups = groups(test)


def accuracy_by_group(model, mask=None):
    correct = predict(model, test, vocab, mask=mask) == labels
    return {name: correct[idx].float().mean().item() for name, idx in test_groups.items()}


print("held-out sentences per group:", {name: len(idx) for name, idx in test_groups.items()})
# END SOLUTION

# %%
# BEGIN SOLUTION
results = {}
seed_everything(0)
free = SentimentClassifier(len(vocab)).to(device)
train_model(free, train, vocab, seed=0, reports=0)
results["trained free, tested free"] = accuracy_by_group(free)
results["trained free, tested restricted"] = accuracy_by_group(free, mask=halves_for_batch)

for seed in range(2):
    seed_everything(seed)
    model = SentimentClassifier(len(vocab)).to(device)
    train_model(model, train, vocab, seed=seed, mask=halves_for_batch, reports=0)
    results[f"trained restricted (seed {seed})"] = accuracy_by_group(model, mask=halves_for_batch)

names = list(test_groups)
print(f"{'':33}" + "".join(f"{n:>31}" for n in names))
for row, accs in results.items():
    print(f"{row:33}" + "".join(f"{accs[n]:>31.0%}" for n in names))
# END SOLUTION

# %% [markdown]
# ## Part 4 · What changed, and what it suggests
#
# Write a few sentences: what changed in the outputs, and what does this suggest about the role
# of attention heads? Back each claim with a number you measured above.
#
# <!-- BEGIN ANSWER -->
# **Model answer.** *(The numbers are the ones this notebook prints on the CPU; on another
# machine they may differ a little.)*
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
# *What it cost the trained model.* Chapter 06's model, trained without restriction, is at 100%
# in every group. Restricted at test time without retraining, it falls to chance on negated
# sentences whose "not" and sentiment word lie in different halves (52%), and on plain sentences
# (56%), while negations within one half survive (97%): the heads had learned to fetch specific
# words from anywhere, and a head that can no longer reach its word delivers something the rest
# of the model was never trained to read. Retrained with the restriction, the model recovers
# most of it in both seeds we tried (two seeds only: chapter 06 showed how much one run can
# mislead): 98-100% when the two words are in different halves, 89-98% on plain sentences. The
# hardest case is now the one that looks easiest, "not" and the word in the **same** half
# (76-89%): there, both words can only reach
# `<cls>` through one head, mixed into a single weighted average, while words in different
# halves arrive through two heads, side by side, for the feed-forward network to combine.
#
# *What this suggests about heads.* Heads are separate channels: each computes its own weighted
# average over what it may see, and only `W_o` and the layers after it combine them. A relation
# between two words is easiest to use when each word can travel through its own head, and a
# head's view decides which relations it can carry at all. Trained heads are specialised to the
# view they were trained with (taking it away breaks them), but a model trained under the
# restriction finds another division of labour: the role of a head is learned, not fixed by the
# architecture.
# <!-- END ANSWER -->
#
# <!-- EXERCISE ONLY
# ## Done?
#
# That was the course's last exercise. Compare your results and your answer with
# `solutions/08_restricting_heads.ipynb`.
# -->
# <!-- BEGIN SOLUTION -->
# ## The end
#
# That was the course's last exercise.
# <!-- END SOLUTION -->
