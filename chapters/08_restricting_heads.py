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
# # Chapter 08 · Restricting each head to half of the sequence
#
# The course ends where its first source ends. Priyesh Dave's post "Day 28: Multi-Head
# Attention" closes with a challenge: change the multi-head code so that **the first head may
# attend only to the first half of the sequence and the second head only to the second half**,
# run it, see how the outputs differ from the unrestricted module, and write a few sentences on
# what changed and what it says about the role of heads.
#
# This chapter sets the challenge up; you solve it in `exercises/08_restricting_heads.ipynb`.
#
# **By the end of this chapter and its exercise you will be able to**
#
# - say precisely what "head 0 attends only to the first half" means, for even and odd lengths;
# - build a per-head mask of shape `(H, L, L)` and know how it broadcasts through
#   `mha_lib.MultiHeadAttention` (and which shape would silently do something else);
# - compare a restricted module with an unrestricted one: per-head maps, the output difference
#   per position and per head, and what each head's output is made of;
# - measure what the restriction costs a trained model when "not" and the word it negates fall
#   in different halves, and explain the result.

# %%
import matplotlib.pyplot as plt
import torch

from mha_lib import MultiHeadAttention, get_device, plot_attention, seed_everything

device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. What "attend only to the first half" means
#
# A head attends *from* queries *to* keys. "Head 0 attends only to the first half" restricts
# the **keys** head 0 may look at; it says nothing about which queries it serves. So, for a
# sequence of length `L`:
#
# - for **every** query `i`, head 0 may attend to the keys at positions `[0, L // 2)`;
# - for **every** query `i`, head 1 may attend to the keys at positions `[L // 2, L)`.
#
# Every position still gets an output from both heads: one blended from the first half, one
# from the second. (Restricting the *queries* instead would leave half of the positions of
# each head with no output at all, which is a different, and stranger, model.)
#
# **Odd lengths.** With `L = 5` the halves can't be equal. The course splits at `L // 2`
# (floor division): head 0 gets keys 0-1, head 1 gets keys 2-4; the middle token belongs to the
# second half. Any fixed rule would do, as long as it is stated; this one is what the exercise
# checks. And with `L = 1` head 0 has no key at all: its row is fully masked, which
# `mha_lib` turns into zero weights and a zero output (chapter 04), not NaN.
#
# Here is the picture for `L = 6` and `L = 5` (shaded = may attend), drawn with a small helper
# of this chapter; building the mask as a tensor is the exercise.

# %%
def draw_halves(ax_pair, L: int) -> None:
    """Shade, for each head, the keys it may attend to (rows = queries, columns = keys)."""
    split = L // 2
    for head, ax in enumerate(ax_pair):
        allowed = [[(j < split) == (head == 0) for j in range(L)] for _ in range(L)]
        ax.imshow(allowed, cmap="Blues", vmin=0, vmax=1.6)
        ax.set_title(f"L = {L}, head {head}")
        ax.set_xticks(range(L))
        ax.set_yticks(range(L))
        ax.set_xlabel("key")
        ax.set_ylabel("query")


fig, axes = plt.subplots(1, 4, figsize=(12, 3.2), layout="constrained")
draw_halves(axes[:2], 6)
draw_halves(axes[2:], 5)
plt.show()

# %% [markdown]
# ## 2. A mask per head, and how it broadcasts
#
# So far every mask applied to all heads alike: `(Lq, Lk)`, or `(B, 1, 1, Lk)` for padding.
# The scores inside `MultiHeadAttention` have shape `(B, H, Lq, Lk)`, and PyTorch lines shapes
# up **from the right**. So a mask of shape `(H, Lq, Lk)` is read as `(1, H, Lq, Lk)`: one
# `(Lq, Lk)` mask per head, the same for every sequence of the batch. That is exactly what a
# per-head restriction needs.

# %%
B, H, L = 2, 2, 4
scores_shape = (B, H, L, L)
for mask_shape in [(L, L), (H, L, L), (1, H, L, L), (B, 1, 1, L), (H, 1, L, L)]:
    print(f"mask {str(mask_shape):14} -> broadcast to {tuple(torch.broadcast_shapes(mask_shape, scores_shape))}")

# %% [markdown]
# All five broadcast, and that is the trap in the last one: `(H, 1, L, L)` lines its first
# axis up with the **batch**, so "head 0's mask" would apply to *sequence* 0 (every head of it).
# When `B == H`, as in the tiny configuration below, nothing fails; the model is just wrong.
# `(H, L, L)` or `(1, H, L, L)` is the shape to use.
#
# Let's see a per-head mask at work with a different restriction, so as not to give the
# exercise away: head 0 may look only at the token itself, head 1 at every token.

# %%
seed_everything(0)
mha = MultiHeadAttention(d_model=8, num_heads=2).to(device)
x = torch.randn(2, 4, 8).to(device)  # the source post's tiny configuration: batch 2, sequence 4, embedding 8

only_itself = torch.eye(L, dtype=torch.bool)  # (L, L)
everything = torch.ones(L, L, dtype=torch.bool)  # (L, L)
per_head = torch.stack([only_itself, everything]).to(device)  # (H, L, L)
print("per-head mask:", tuple(per_head.shape))

out, weights = mha(x, x, x, mask=per_head, return_weights=True)
print("output:", tuple(out.shape), " weights:", tuple(weights.shape))
assert torch.equal(weights[:, 0].cpu(), torch.eye(L).expand(2, L, L))  # head 0: all weight on itself
plot_attention(weights[0], [f"x{i}" for i in range(L)], title="A per-head mask: head 0 sees itself, head 1 everything")
plt.show()

# %% [markdown]
# ## 3. What to look for
#
# With the restricted module in hand (same weights as the unrestricted one, only the mask
# differs), the exercise asks you to compare the two:
#
# 1. **The per-head maps, side by side.** Where did each head's attention go before, and where
#    is it now? How much of head 0's attention used to fall on the second half?
# 2. **The output difference per position and per head.** Which positions change most? Look at
#    each head's output *before* `W_o` (its slice of the concatenated heads), then at the final
#    output, where `W_o` mixes the heads.
# 3. **What each head's output is made of.** Head `h`'s output at query `i` is
#    $\sum_j w^{(h)}_{ij}\, v^{(h)}_j$. After the restriction, head 0's output must be a blend of
#    first-half values only: show it, for instance by changing the second half's values and
#    watching head 0's blend stay the same for a fixed set of weights.
# 4. **A trained model.** Chapter 06's sentiment model learned to relate "not" to the word it
#    negates. Retrain it with restricted heads and measure its accuracy on sentences where "not"
#    and the sentiment word fall in the same half versus different halves. In a padded batch the
#    halves must come from each sentence's **own** length: `halves_mask(L)` of the padded length
#    would put a short sentence entirely in head 0's half and leave head 1 nothing but padding.
#    (The model's `<cls>` token sits at position 0, so it always belongs to head 0's half.)
#
# Then the written part: a few sentences on what changed and what this suggests about the role
# of attention heads. The solution notebook has a model answer, backed by its measurements;
# write yours before you read it.
#
# ## Your turn
#
# - Start your copy: `make exercise N=08` (or `.venv/bin/python -m mha_lib start 08`), then open
#   `workspace/08_restricting_heads.ipynb`. The exercise notebook is
#   `exercises/08_restricting_heads.ipynb`; its checks (`check_halves_mask`,
#   `check_restricted_attention`) tell you what is wrong, if anything.
# - Compare with `solutions/08_restricting_heads.ipynb` when you are done.
#
# ## Recap of the course
#
# - **Chapter 01:** attention is a soft lookup: score, softmax, blend; divide by $\sqrt{d_k}$;
#   masks block keys.
# - **Chapter 02:** trainable projections turn embeddings into queries, keys and values; attention
#   alone ignores order.
# - **Chapter 03:** several heads are the same computation on slices of the features, in one
#   batched call: the parameter count of one wide head, split into several views.
# - **Chapter 04:** padding and causal masks, cross-attention, and rows with nothing to attend to.
# - **Chapter 05:** a module is proven against PyTorch's own, to the tolerance its dtype allows.
# - **Chapter 06:** trained heads specialize, and ablation measures what each one is for.
# - **Chapter 07:** the same maths, fused, without ever storing the `L × L` weights.
# - **Chapter 08:** a mask per head decides what each head may see, and the trained model shows
#   what that costs.
#
# ## Where to go next
#
# - Vaswani et al., "Attention Is All You Need" (2017): the paper, now easy to read.
# - The Annotated Transformer (Harvard NLP): the whole model, line by line.
# - Sebastian Raschka, *Build a Large Language Model (From Scratch)*, chapter 3, and the
#   attention chapters of *Dive into Deep Learning* (d2l.ai): other paths through the same ideas.
# - *Transformers in Action* (Manning), the book this course drew its encoder examples from.
