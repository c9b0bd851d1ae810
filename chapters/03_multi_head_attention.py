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
# # Chapter 03 · Multi-head attention
#
# Chapter 02 built one attention head: three learned projections turn every token into a
# query, a key and a value, and each query takes one weighted average of the values.
# A transformer runs **several heads side by side** on the same input and joins their results:
#
# $$\text{MultiHead}(X_q, X_k, X_v) = \text{Concat}(\text{head}_0, \dots, \text{head}_{H-1})\,W_o,
# \qquad \text{head}_h = \text{Attention}(X_q W_q^{(h)}, X_k W_k^{(h)}, X_v W_v^{(h)})$$
#
# $X_q$, $X_k$ and $X_v$ are the layer's inputs, not yet projected; in self-attention all three
# are the same $X$. So $X_q W_q^{(h)}$ is head $h$'s queries, what chapter 02 called $Q$.
#
# **By the end of this chapter you will be able to**
#
# - say what several heads can do that one head cannot, with a small example;
# - split a `(B, L, d_model)` tensor into `H` heads of shape `(B, H, L, d_k)` with `view` and
#   `transpose`, put them back together, and explain why a plain reshape gets it wrong and why
#   the way back needs `.contiguous()` or `.reshape`;
# - compute multi-head attention step by step with plain tensors, shapes printed after each step;
# - use `mha_lib.MultiHeadAttention`, spot the bug in the book's listing, and prove the module
#   equals your step-by-step computation;
# - count its parameters and its cost, and see why 8 heads of 64 have the same parameters and
#   the same multiply-adds as one head of 512, but need 8 times the attention-weight memory;
# - measure what the split costs: each head scores through a matrix of rank at most 64, so
#   over a sequence longer than that it cannot produce every score pattern one head of 512 can;
# - read the attention maps of every head side by side.
#
# *Sources.* The spotlights, the detectives, the picture of heads drawing arcs over a sequence
# `[A … F]` and the tiny example (batch 2, sequence 4, embedding 8, 2 heads) come from Priyesh
# Dave's post "Day 28: Multi-Head Attention" (DEV Community). The module's layout, its bug and
# the configuration with `d_model = 512`, 8 heads and a batch of 32 sequences of 100 come from
# *Transformers in Action* (Manning), section 2.2.3 and listing 2.4. The choice
# $d_k = d_v = d_\text{model} / H$ is from Vaswani et al., "Attention Is All You Need" (2017),
# section 3.2.2. The rank limit of narrow heads, and the fix of a head size equal to the sequence
# length, are from Bhojanapalli et al., "Low-Rank Bottleneck in Multi-head Attention Models"
# (ICML 2020, [arXiv:2002.07028](https://arxiv.org/abs/2002.07028)).

# %% [markdown]
# ## Set-up
#
# As in every chapter: pick the device, seed the random generators, print rounded numbers.
# This chapter only runs forward passes (chapter 07 trains), so we switch gradient tracking
# off for the whole notebook; it saves memory and keeps `grad_fn=` out of the printouts.

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import FancyArrowPatch
from torch import nn

import mha_lib
from mha_lib import MultiHeadAttention, get_device, plot_attention, scaled_dot_product_attention, seed_everything

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
torch.set_grad_enabled(False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. Why several heads?
#
# Priyesh Dave's post compares heads to several spotlights on one stage, or to a team of
# detectives who examine the same evidence and each look for a different clue: fingerprints,
# timelines, motives. The reason behind the picture is simple arithmetic.
#
# **One head gives each query one weighted average.** Its weights are positive and sum to 1.
# If a token needs two pieces of information for two different reasons, one head has to split
# its attention between them, and what comes out is a *blend*: each piece at half strength,
# and no record of which piece answered which question.
#
# Take the book's sentence "The movie was not bad". To understand "bad", a model wants to know
# *what* is bad ("movie") and *whether it is negated* ("not"). Those are two questions.
#
# Let's see the problem on the post's sequence `[A, B, C, D, E, F]`. Each token's value is a
# one-hot vector that says which letter it is. We write two heads by hand (a trained model
# learns its queries and keys; here we set them so that the point is easy to see):
#
# - head 0 looks at the **previous token** (a local pattern),
# - head 1 looks at the **first token** of the sequence (a long-range pattern),
#
# and a single head that is asked to do both: its query points at the previous *and* the first
# position. The keys only say where each token is (a one-hot position), so each query is
# "the position I want", times 20 to make the softmax nearly hard.

# %%
letters = ["A", "B", "C", "D", "E", "F"]
L = len(letters)
position = torch.eye(L)                           # key j = one-hot of position j
previous = position[[max(i - 1, 0) for i in range(L)]]  # query i points at position i - 1 (A: itself)
first = position[[0] * L]                         # query i points at position 0

keys = position.expand(3, L, L)                   # (3, L, L): the same keys for the three maps
queries = 20 * torch.stack([previous, first, previous + first])  # (3, L, L)
_, maps = scaled_dot_product_attention(queries.to(device), keys.to(device), keys.to(device))
maps = maps.cpu()                                 # (3, Lq, Lk): head 0, head 1, one head doing both
print("what E (query 4) attends to:")
for name, row in zip(["head 0 (previous)", "head 1 (first)", "one head, both"], maps[:, 4]):
    print(f"  {name:18s}", row)


# %% [markdown]
# The post draws each head as a row of arcs over the sequence. Here are ours: an arc goes
# from a query (where the arrow starts) to the key it attends to, as thick as the weight.

# %%
def draw_arcs(ax, weights, labels, title, colour):
    """Arcs from each query to the keys it attends to; line width ~ weight."""
    for i, label in enumerate(labels):
        ax.text(i, 0, label, ha="center", va="center", fontsize=13,
                bbox=dict(boxstyle="circle", fc="white", ec="grey"))
    for i in range(len(labels)):
        for j in range(len(labels)):
            w = float(weights[i, j])
            if i != j and w > 0.05:
                bend = (1 if j < i else -1) * 0.5 / abs(i - j) ** 0.5  # above the tokens, long arcs flatter
                ax.add_patch(FancyArrowPatch(
                    (i, 0), (j, 0), connectionstyle=f"arc3,rad={bend}", arrowstyle="-|>",
                    mutation_scale=14, shrinkA=11, shrinkB=11, lw=4 * w, color=colour, alpha=0.4 + 0.6 * w))
    ax.set(xlim=(-0.6, len(labels) - 0.4), ylim=(-0.3, 0.75), title=title)
    ax.axis("off")


fig, axes = plt.subplots(3, 1, figsize=(6.5, 5))
titles = ["head 0: the previous token", "head 1: the first token", "one head asked to do both"]
for ax, w, title, colour in zip(axes, maps, titles, ["tab:blue", "tab:orange", "tab:purple"]):
    draw_arcs(ax, w, letters, title, colour)
fig.suptitle("Each head draws its own arcs; one head must share its weight")
fig.tight_layout()
plt.show()

# %% [markdown]
# The two heads each give their query's full attention to one token; the single head gives
# half to each (the thin purple arcs). Two details of the picture: no arc is drawn from a token
# to itself, so A, whose previous and first token are both A itself, has no arc; and for B
# both targets are A, so its one purple arc carries all its weight and is thick.
#
# Now the consequence. Swap A and D: in `D B C A E F`, E's previous token is A and the first
# token is D. The two-head output, the concatenation `[head 0 | head 1]`, tells the two
# sentences apart. The single head's output is the *same* blend, half A and half D, for both:
# it cannot tell which letter answered which question.

# %%
def describe(vector):
    """Read a one-hot mixture as text, e.g. '0.50·A + 0.50·D'."""
    return " + ".join(f"{w:.2f}·{letters[i]}" for i, w in enumerate(vector.tolist()) if w > 0.005)


for word in (["A", "B", "C", "D", "E", "F"], ["D", "B", "C", "A", "E", "F"]):
    values = torch.eye(L)[[letters.index(t) for t in word]]  # (L, 6): which letter sits where
    outputs = maps @ values                                  # (3, L, 6): output of each map
    print(" ".join(word), "→ output for E:")
    print(f"   two heads: [{describe(outputs[0, 4])} | {describe(outputs[1, 4])}]")
    print(f"   one head:   {describe(outputs[2, 4])}")

# %% [markdown]
# That is the case for multi-head attention: **each head makes its own weighted average,
# and the heads' results sit in separate slots**, so one layer can answer several questions
# per token at once. What each head looks for is learned; chapter 07 trains a small model and
# measures heads that specialize.
#
# To keep the cost down, the heads don't each get the full width: with `d_model` features and
# `H` heads, each head works on `d_k = d_model / H` of them. That is the other side of the
# case: a narrower head can form fewer attention patterns, and section 5 measures by how much.
# The next section shows how the features are dealt out.

# %% [markdown]
# ## 2. Splitting into heads, and back
#
# After the projections, queries, keys and values have shape `(B, L, d_model)`: one row of
# `d_model` features per token. Head `h` owns the features `h·d_k` to `(h+1)·d_k − 1` of every
# token. We want them as a tensor `(B, H, L, d_k)`, where `x[:, h]` is head `h`'s own
# `(L, d_k)` matrix, so that one batched matrix product serves every head.
#
# A tensor whose numbers tell where they come from makes this easy to follow: token `l`,
# feature `f` holds `10·l + f`. One sequence, 3 tokens, `d_model = 8`, 2 heads of 4.

# %%
B, L, d_model, H = 1, 3, 8, 2
d_k = d_model // H
x = (10 * torch.arange(L)[:, None] + torch.arange(d_model)).float()[None].to(device)  # (B, L, d_model)
print("x:", tuple(x.shape))
print(x.cpu())

# %% [markdown]
# **Step 1, `view`:** cut the last axis into `H` chunks of `d_k`. Nothing moves in memory;
# the same numbers are just indexed as `(B, L, H, d_k)`.
#
# **Step 2, `transpose(1, 2)`:** swap the token and head axes, giving `(B, H, L, d_k)`. Now
# `x_heads[0, h]` holds every token, with head `h`'s features only.

# %%
x_view = x.view(B, L, H, d_k)        # (B, L, H, d_k)
x_heads = x_view.transpose(1, 2)     # (B, H, L, d_k)
print("view:     ", tuple(x_view.shape))
print("transpose:", tuple(x_heads.shape))
for h in range(H):
    print(f"head {h}:\n{x_heads[0, h].cpu()}")

# %% [markdown]
# Head 0 got features 0–3 of each of the three tokens, head 1 features 4–7: the tens digit
# (the token) runs down each head's rows, as it should.
#
# **Why not reshape straight to `(B, H, L, d_k)`?** The shape comes out right, so the mistake
# doesn't crash. But `reshape` fills the new shape in memory order, token after token: head 0's
# "rows" become token 0's first half, token 0's *second* half, and token 1's first half.
# Positions leak into heads and heads into positions.

# %%
wrong = x.reshape(B, H, L, d_k)      # same shape, wrong content
print("reshape:", tuple(wrong.shape))
for h in range(H):
    print(f"'head {h}':\n{wrong[0, h].cpu()}")

# %% [markdown]
# The picture makes it plain. Each cell is coloured by the head that should own it (blue:
# head 0, orange: head 1) and shows its number (tens = token, units = feature).

# %%
HEAD_COLOURS = ["#9ecae1", "#fdae6b"]


def draw_cells(ax, values, title, row_labels):
    """A grid of numbers 10·token + feature, each cell coloured by the head owning its feature."""
    values = values.cpu()
    for r in range(values.shape[0]):
        for c in range(values.shape[1]):
            v = int(values[r, c])
            ax.add_patch(plt.Rectangle((c, -r), 1, 1, fc=HEAD_COLOURS[(v % 10) // d_k], ec="white", lw=2))
            ax.text(c + 0.5, -r + 0.5, f"{v:02d}", ha="center", va="center", fontsize=10)
    ax.set_xlim(0, values.shape[1])
    ax.set_ylim(-values.shape[0] + 1, 1)
    ax.set_yticks([-r + 0.5 for r in range(values.shape[0])], row_labels)
    ax.set_xticks([])
    ax.tick_params(length=0)
    ax.set_title(title, fontsize=10)
    ax.set_aspect("equal")
    for side in ax.spines.values():
        side.set_visible(False)


token_labels = [f"token {l}" for l in range(L)]
fig, axes = plt.subplots(1, 5, figsize=(15, 2.3), gridspec_kw=dict(width_ratios=[8, 4, 4, 4, 4]))
draw_cells(axes[0], x[0], "x: (L, d_model), features 0-3 | 4-7", token_labels)
for h in range(H):
    draw_cells(axes[1 + h], x_heads[0, h], f"view + transpose: head {h}", token_labels)
    draw_cells(axes[3 + h], wrong[0, h], f"plain reshape: 'head {h}'", [f"row {r}" for r in range(L)])
fig.suptitle("Splitting d_model = 8 features into 2 heads: right (middle) and wrong (right)")
fig.tight_layout()
plt.show()

# %% [markdown]
# With the plain reshape, "head 0" has orange cells (head 1's features) and its rows are no
# longer tokens; whatever attention it computes is meaningless. The shapes can't warn you.
# Attention on the two layouts gives different results:

# %%
right_out, _ = scaled_dot_product_attention(x_heads, x_heads, x_heads)
wrong_out, _ = scaled_dot_product_attention(wrong, wrong, wrong)
print("same shape:", right_out.shape == wrong_out.shape, " same values:", torch.allclose(right_out, wrong_out))

# %% [markdown]
# **The way back** (`combine_heads`): transpose to `(B, L, H, d_k)`, then merge the last two
# axes into `d_model`. The merge is where `.view` can fail. A tensor's *strides* say how far to
# step in memory for each index; `view` only relabels memory and needs the features of a token
# to lie next to each other. The attention output `weights @ v` is a fresh tensor laid out head
# after head, so after the transpose the 4 features of head 0 and the 4 of head 1 for one token
# are far apart in memory:

# %%
heads = right_out                    # (B, H, L, d_k), a fresh result of weights @ v
back = heads.transpose(1, 2)         # (B, L, H, d_k)
print("heads:", tuple(heads.shape), "strides", heads.stride(), "contiguous:", heads.is_contiguous())
print("back: ", tuple(back.shape), "strides", back.stride(), "contiguous:", back.is_contiguous())
try:
    back.view(B, L, d_model)
except RuntimeError as error:
    print("RuntimeError:", str(error).split(" (")[0])

# %% [markdown]
# In `back`, going from head 0 to head 1 of the same token jumps 12 numbers in memory (its
# stride), not 4: a token's 8 features are not 8 neighbours, so no view can make them one row.
#
# Two fixes, equivalent here: `.contiguous()` copies the numbers into row order and then `.view`
# works (the post and the book do this), or `.reshape`, which copies only when it must. Here are
# our two functions, checked against `mha_lib.split_heads` and `mha_lib.combine_heads`, and
# checked that `combine` undoes `split`.

# %%
def split(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, L, d_model) -> (B, H, L, d_k)"""
    B, L, D = x.shape
    return x.view(B, L, num_heads, D // num_heads).transpose(1, 2)


def combine(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, d_k) -> (B, L, H * d_k)"""
    B, H, L, d_k = x.shape
    return x.transpose(1, 2).contiguous().view(B, L, H * d_k)


y = torch.randn(2, 5, 12).to(device)
for num_heads in (1, 2, 3, 4, 6, 12):
    assert torch.equal(split(y, num_heads), mha_lib.split_heads(y, num_heads))
    assert torch.equal(combine(split(y, num_heads)), y)
assert torch.equal(combine(right_out), mha_lib.combine_heads(right_out))
print("split == mha_lib.split_heads, combine == mha_lib.combine_heads, combine(split(y)) == y")

# %% [markdown]
# ## 3. The post's tiny example, step by step
#
# Now all of multi-head attention with plain tensors, in the configuration of Priyesh Dave's
# example: a batch of 2 sequences of 4 tokens, embeddings of 8 numbers, 2 heads of 4.
# The post uses raw `torch.randn(8, 8)` matrices as weights and computes `x @ W`; we use
# `nn.Linear` layers (which compute `x @ W.T + b`), because the module below is built from them
# and we want to load these very weights into it. We also keep the post's variable names:
# `batch_size`, `seq_len`, `embed_dim`, `num_heads` and `head_dim` are the course's
# `B`, `L`, `d_model`, `H` and `d_k`.

# %%
batch_size, seq_len, embed_dim, num_heads = 2, 4, 8, 2
head_dim = embed_dim // num_heads

x = torch.randn(batch_size, seq_len, embed_dim).to(device)  # 2 sequences of 4 token vectors
W_q, W_k, W_v, W_o = (nn.Linear(embed_dim, embed_dim).to(device) for _ in range(4))
print("x:", tuple(x.shape), " W_q.weight:", tuple(W_q.weight.shape), " W_q.bias:", tuple(W_q.bias.shape))

# %% [markdown]
# **1. Project** every token to its query, key and value, all heads at once.

# %%
Q, K, V = W_q(x), W_k(x), W_v(x)
print("Q, K, V:", tuple(Q.shape))    # (B, L, embed_dim)

# %% [markdown]
# **2. Split** them into heads.

# %%
Q, K, V = split(Q, num_heads), split(K, num_heads), split(V, num_heads)
print("Q, K, V per head:", tuple(Q.shape))    # (B, H, L, head_dim)

# %% [markdown]
# **3. Attend**, every head on its own: chapter 01's formula, with $\sqrt{d_k}$ = √4 = 2. The
# matrix products act on the last two axes, so all 2 × 2 (sequence, head) pairs run in one call.

# %%
scores = Q @ K.transpose(-2, -1) / math.sqrt(head_dim)  # (B, H, L, L)
weights = torch.softmax(scores, dim=-1)                  # over the keys
heads = weights @ V                                      # (B, H, L, head_dim)
print("scores: ", tuple(scores.shape))
print("weights:", tuple(weights.shape), " every row sums to 1:",
      torch.allclose(weights.sum(-1), torch.ones((), device=device)))
print("heads:  ", tuple(heads.shape))

# %% [markdown]
# **4. Combine** the heads: each token gets its two 4-number head outputs side by side.
#
# **5. Project** the result with $W_o$. This is the only step where the heads' results are mixed
# with each other (section 7 makes this precise).

# %%
concat = combine(heads)              # (B, L, embed_dim)
output = W_o(concat)                 # (B, L, embed_dim)
print("concat:", tuple(concat.shape))
print("output:", tuple(output.shape))
print("output, sequence 0, token 0:", output[0, 0].cpu())

# %% [markdown]
# Input and output have the same shape `(2, 4, 8)`, so the layer can be stacked, and added to
# its input (the residual connection of an encoder layer, chapter 07).
#
# ## 4. The module, and the book's bug
#
# *Transformers in Action* packs these five steps into a module (listing 2.4) with four
# `nn.Linear` layers named `W_q`, `W_k`, `W_v`, `W_o` and a size per head `self.d_k = d_model //
# num_heads`. The listing has a bug: to split the values it reshapes them with `self.d_v`, an
# attribute it never defines. Python only looks an attribute up when the line runs, so the class
# builds fine and breaks at its first forward pass. Here is a minimal class of our own with just
# that mistake:

# %%
class ValuesOnly(nn.Module):
    """Projects and splits the values only, with the listing's mistake."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.d_k = d_model // num_heads     # defined
        self.W_v = nn.Linear(d_model, d_model)

    def forward(self, value: torch.Tensor) -> torch.Tensor:
        B = value.size(0)
        return self.W_v(value).view(B, -1, self.num_heads, self.d_v).transpose(1, 2)  # d_v: never defined


buggy = ValuesOnly(embed_dim, num_heads).to(device)  # building it works
try:
    buggy(x)
except AttributeError as error:
    print("AttributeError:", error)

# %% [markdown]
# **The fix.** The paper writes $d_v$ for the size of each head's values and sets
# $d_k = d_v = d_\text{model}/H$. That equality is also what the rest of the listing relies on:
# the heads are concatenated back to `d_model` features and fed to `W_o`, a
# `d_model → d_model` layer, so `H · d_v` must equal `d_model`. So either define
# `self.d_v = d_model // num_heads` or, as `mha_lib.MultiHeadAttention` does, use `self.d_k`
# for queries, keys and values alike.
#
# `mha_lib.MultiHeadAttention` (in `mha_lib/multi_head.py`) is the listing with the fix, plus
# checks on its inputs, optional masks and attention dropout, and `return_weights=True` to get
# the weights `(B, H, Lq, Lk)`. After checking its inputs once, its `forward` runs the five
# steps of section 3:
#
# ```python
# q, k, v = self.project(query, key, value)   # 1) project, 2) split: (B, H, Lq, d_k), (B, H, Lk, d_k)
# heads, weights = self.attend(q, k, v, mask, return_weights)  # 3) scaled_dot_product_attention
# output = self.W_o(combine_heads(heads))     # 4) combine, 5) project: (B, Lq, d_model)
#
# def project(self, query, key, value):
#     q, k, v = self.W_q(query), self.W_k(key), self.W_v(value)  # 1) (B, Lq, d_model), (B, Lk, d_model)
#     return self.split(q, k, v)              # 2) split_heads on each
# ```
#
# Later chapters hook in between steps 2 and 3, each with an `if` that does nothing unless
# asked: rotating queries and keys by their positions (chapter 06, `rotary=True`) and a cache of
# past keys and values for decoding (chapter 11, `cache=`). Chapter 11 also lets groups of query
# heads share key and value heads (`num_kv_heads=`, the `H_kv` in the file's shape comments).
# Chapter 10's fused module replaces
# two methods only: `project`, with one matrix for steps 1 and 2, and `attend`, with a fused
# kernel for step 3.
#
# It takes `query`, `key` and `value` separately; for self-attention pass the same tensor three
# times. Load the weights of section 3 into it and it must give the same output and weights:

# %%
mha = MultiHeadAttention(d_model=embed_dim, num_heads=num_heads).to(device)
for mine, theirs in zip((W_q, W_k, W_v, W_o), (mha.W_q, mha.W_k, mha.W_v, mha.W_o)):
    theirs.load_state_dict(mine.state_dict())
print(mha)

module_output, module_weights = mha(x, x, x, return_weights=True)
assert module_output.shape == output.shape == (2, 4, 8) and module_weights.shape == (2, 2, 4, 4)
assert torch.allclose(module_output, output, atol=1e-6) and torch.allclose(module_weights, weights, atol=1e-6)
print("step by step == mha_lib.MultiHeadAttention (within 1e-6): output and weights")

# %% [markdown]
# The book guards the sizes with an `assert`; the module raises an error that says what is wrong:

# %%
try:
    MultiHeadAttention(d_model=512, num_heads=6)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## 5. The book's configuration: 8 heads of 64
#
# *Transformers in Action* runs the module at the size of the original Transformer:
# `d_model = 512` split into 8 heads of 64, on a batch of 32 sequences of 100 positions, with
# the same tensor as query, key and value (self-attention). The input is random here; only the
# shapes matter. We follow the module's steps with its own layers and print each shape.

# %%
book = MultiHeadAttention(d_model=512, num_heads=8).to(device)
tokens = torch.randn(32, 100, 512).to(device)  # 32 sequences, 100 positions, 512 features

steps = {"input": tokens}
steps["1) project: W_q(x)"] = book.W_q(tokens)
q = steps["2) split: q"] = mha_lib.split_heads(steps["1) project: W_q(x)"], book.num_heads)
k = mha_lib.split_heads(book.W_k(tokens), book.num_heads)
v = mha_lib.split_heads(book.W_v(tokens), book.num_heads)
steps["3) scores: q kᵀ / √64"] = q @ k.transpose(-2, -1) / math.sqrt(book.d_k)
steps["   weights: softmax"] = torch.softmax(steps["3) scores: q kᵀ / √64"], dim=-1)
steps["   heads: weights @ v"] = steps["   weights: softmax"] @ v
steps["4) combine"] = mha_lib.combine_heads(steps["   heads: weights @ v"])
steps["5) project: W_o"] = book.W_o(steps["4) combine"])
for name, tensor in steps.items():
    print(f"{name:24s} {str(tuple(tensor.shape)):>20s}")

assert torch.allclose(book(tokens, tokens, tokens), steps["5) project: W_o"], atol=1e-5)
print("module output == step by step (within 1e-5)")

# %% [markdown]
# **Parameters.** Each of the four layers is a `512 × 512` matrix plus 512 biases, whatever the
# number of heads: the heads don't add weights, they *partition* the ones that are there. One
# head of 512 (`num_heads=1`) has exactly as many:

# %%
def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


one_head = MultiHeadAttention(d_model=512, num_heads=1)
print(f"8 heads of 64: {count(book):,} parameters")
print(f"1 head of 512: {count(one_head):,} parameters")
print(f"4·512² + 4·512 = {4 * 512**2 + 4 * 512:,}")
assert count(book) == count(one_head) == 4 * 512**2 + 4 * 512

# %% [markdown]
# **Compute.** Count the multiply-adds of one forward pass. The four projections cost
# `4 · B · L · d_model²` either way. Scores and blending cost `B · H · L² · d_k` each, and
# `H · d_k = d_model`, so the heads change nothing there either. What does grow is the
# attention-weight tensor: `H` maps of `L × L` per sequence instead of one, so 8 softmaxes and
# 8 times as many weights to store. That memory grows with `L²`; chapter 10 comes back to it.

# %%
def multiply_adds(B: int, L: int, d_model: int, H: int) -> int:
    d_k = d_model // H
    projections = 4 * B * L * d_model * d_model
    scores_and_blend = 2 * B * H * L * L * d_k
    return projections + scores_and_blend


for n_heads in (8, 1):
    print(f"H = {n_heads}: {multiply_adds(32, 100, 512, n_heads) / 1e9:.3f} G multiply-adds, "
          f"{32 * n_heads * 100 * 100 / 1e6:.2f} M attention weights")

# %% [markdown]
# The same parameters and the same multiply-adds; 8 times the attention-weight memory (2.56 M
# weights instead of 0.32 M), for 8 separate views of the sequence instead of one. But each
# view is narrower than the one head of 512, and that has a price of its own.
#
# **Rank: what the split costs.** Leave the biases and the $1/\sqrt{d_k}$ aside. Head $h$ scores
# query token $x_i$ against key token $x_j$ with
# $q_i \cdot k_j = x_i W_q^{(h)} (W_k^{(h)})^\top x_j^\top$, so one `(d_model, d_model)` matrix,
# $W_q^{(h)} (W_k^{(h)})^\top$, decides which pairs of tokens score high. It is a
# `(d_model, d_k)` matrix times a `(d_k, d_model)` one, so its rank is at most `d_k`: 64 for a
# head of `book`, against up to 512 for the single head of `one_head`. The eight add up to
# $W_q W_k^\top$, of rank up to 512, but the module never adds them: each head's scores go
# through a softmax of their own. Here are the ranks in the two untrained modules. Head $h$'s
# $W_q^{(h)}$ is the transpose of rows `h·d_k` to `(h+1)·d_k − 1` of `W_q.weight` (section 7).
# We count in float64: `matrix_rank` counts the singular values above a tolerance set by the
# precision, and in float32 the smallest of the 512 can fall below it.

# %%
def score_matrix(module: MultiHeadAttention, h: int) -> torch.Tensor:
    """Head h's W_q^(h) (W_k^(h))ᵀ, (d_model, d_model), in float64."""
    rows = slice(h * module.d_k, (h + 1) * module.d_k)  # head h's features
    W_q_h = module.W_q.weight[rows].T.double().cpu()      # (d_model, d_k)
    W_k_h = module.W_k.weight[rows].T.double().cpu()      # (d_model, d_k)
    return W_q_h @ W_k_h.T                                # (d_model, d_model)


ranks = [int(torch.linalg.matrix_rank(score_matrix(book, h))) for h in range(book.num_heads)]
full_rank = int(torch.linalg.matrix_rank(score_matrix(one_head, 0)))
print("W_q^(h) W_k^(h)ᵀ:", tuple(score_matrix(book, 0).shape))
print("8 heads of 64, rank of each:", ranks)
print("1 head of 512, rank:        ", full_rank)
assert ranks == [book.d_k] * book.num_heads == [64] * 8 and full_rank == 512

# %% [markdown]
# **What a head of 64 cannot do.** Over a sequence of `n` tokens a head's scores are `q @ k.T`,
# `(n, d_k)` times `(d_k, n)`: an `(n, n)` map of rank at most `d_k`, whatever its weights and
# biases. Take sequence 0 of `tokens`: `n = 100` tokens, more than 64. As the target take the
# scores `one_head` gives it, a pattern that one head of 512 does produce, of full rank 100.
# The 8 heads of `book` give 8 maps of the same shape, each of rank 64:

# %%
def in_float64(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    return layer.weight.double().cpu(), layer.bias.double().cpu()


X = tokens[0].double().cpu()                             # (n, d_model) = (100, 512)
n = X.shape[0]
target = F.linear(X, *in_float64(one_head.W_q)) @ F.linear(X, *in_float64(one_head.W_k)).T / math.sqrt(512)
q_8 = mha_lib.split_heads(F.linear(X[None], *in_float64(book.W_q)), book.num_heads)  # (1, 8, n, 64)
k_8 = mha_lib.split_heads(F.linear(X[None], *in_float64(book.W_k)), book.num_heads)
scores_8 = (q_8 @ k_8.transpose(-2, -1))[0] / math.sqrt(book.d_k)                 # (8, n, n)
target_rank, ranks_8 = int(torch.linalg.matrix_rank(target)), torch.linalg.matrix_rank(scores_8).tolist()
print("target, one head of 512:", tuple(target.shape), " rank", target_rank)
print("book's 8 heads:         ", tuple(scores_8.shape), " ranks", ranks_8)
assert target_rank == n == 100 and ranks_8 == [64] * 8

# %% [markdown]
# So no head of 64 can produce the target exactly. How close can one come? Write the target's
# SVD as `U diag(σ) Vᵀ` and keep its `r` largest singular values, `U_r diag(σ_r) V_rᵀ` (the
# first `r` columns of `U` and `V`): by the Eckart–Young theorem no matrix of rank `r` is
# closer. And a head can produce exactly that
# matrix. The 100 tokens are linearly independent, so `X @ X_pinv` is the identity, and a head
# with $W_q^{(h)}$ = `X_pinv @ U_r diag(σ_r)` and $W_k^{(h)}$ = `X_pinv @ V_r` (no biases, the
# $1/\sqrt{d_k}$ folded into $W_q^{(h)}$, zero columns beyond `r`) scores
# `U_r diag(σ_r) V_rᵀ`. Here is the best any head can do on this sequence, for each way of
# splitting 512 features into heads, as the error relative to the target (Frobenius norms):

# %%
U, sigma, Vh = torch.linalg.svd(target)                  # target = U diag(sigma) Vh
X_pinv = torch.linalg.pinv(X)                            # (d_model, n): X @ X_pinv = I
errors = {}
print("heads  d_k  rank  relative error of the best head")
for n_heads in (1, 4, 8, 16, 64):
    head_size = 512 // n_heads
    r = min(head_size, n)                                # the highest rank it can reach here
    W_q_h = X_pinv @ (U[:, :r] * sigma[:r])              # (d_model, r)
    W_k_h = X_pinv @ Vh[:r].T                            # (d_model, r)
    best = X @ W_q_h @ W_k_h.T @ X.T                     # (n, n): that head's scores
    errors[n_heads] = float(torch.linalg.norm(best - target) / torch.linalg.norm(target))
    eckart_young = float(sigma[r:].norm() / sigma.norm())  # no rank-r matrix is closer
    assert math.isclose(errors[n_heads], eckart_young, abs_tol=1e-9)
    print(f"{n_heads:5d}  {head_size:3d}  {r:4d}  {errors[n_heads]:.3f}")
assert errors[1] < 1e-9 and errors[4] < 1e-9 and 0 < errors[8] < errors[16] < errors[64]
unreachable = float(sigma[64:].square().sum() / sigma.square().sum())  # what a head of 64 cannot reach
print(f"the {n - 64} smallest of the {n} singular values hold {unreachable:.1%} of the target's squared size")
assert math.isclose(errors[8], math.sqrt(unreachable)) and round(unreachable, 3) == 0.022

# %% [markdown]
# One head of 512 or 4 heads of 128 reproduce the target exactly, because 128 ≥ `n` = 100. With
# 8 heads of 64 the best possible head is still off by 0.147 of the target's size, and every
# smaller head does worse. How much a head loses depends on the pattern: this one, made by random
# weights, keeps 2.2 % of its squared size in the 36 singular values a head of 64 cannot reach
# (0.147 ≈ √0.022); a pattern whose singular values fall off fast loses little.
#
# This is the *low-rank bottleneck* of Bhojanapalli et al. (2020). We measured the scores; they
# state it for the attention weights, after the softmax (its `exp` acts entry by entry and
# dividing each row by its sum keeps the rank, so a head's weights usually have full rank: what
# the head size limits is which patterns it can reach). A
# head whose size is at least the sequence length `n` can produce any pattern of positive weights
# over `n` linearly independent tokens, and with a smaller head there are inputs and patterns that no choice of
# its weights produces. With heads of `d_model / H`, every head is below `n` as soon as `H`
# exceeds `d_model / n`. Their fix is to set the head size to the sequence length, independently
# of the number of heads; `H · d_k` then no longer equals `d_model`, and the layer's parameters
# grow with the number of heads.
#
# Models keep heads far shorter than the sequence anyway: heads of 64 (this configuration) or
# 128 (chapter 11's 7B-class model), on sequences of thousands of tokens. What the split limits
# is each head's pattern, not the layer's width: between them the heads use all 512 features of the projections, and `W_o`
# mixes their outputs back into all 512 (section 7). For the same parameters and
# multiply-adds, `H` heads give `H` score patterns of rank at most `d_model / H` instead of one
# of rank at most `d_model`. Vaswani et al. found one head worse than 8, and too many heads worse
# again (their table 3); chapter 07 trains 1, 2, 4 and 8 heads on one task and counts which
# learn it.

# %% [markdown]
# ## 6. Every head's attention map
#
# `return_weights=True` returns the weights of every head, `(B, H, Lq, Lk)`, and
# `plot_attention(weights[0], labels)`, with one text label per token, draws one panel per
# head for the first sequence. We use
# the book's sentence with random token vectors and an untrained module of 4 heads.

# %%
sentence = ["the", "movie", "was", "not", "bad"]
embeddings = torch.randn(1, len(sentence), 32).to(device)  # stand-ins for learned embeddings
untrained = MultiHeadAttention(d_model=32, num_heads=4).to(device)
_, sentence_weights = untrained(embeddings, embeddings, embeddings, return_weights=True)
print("weights:", tuple(sentence_weights.shape))    # (B, H, L, L)
plot_attention(sentence_weights[0], sentence, title="4 untrained heads on the same sentence", vmax=1)
plt.show()

# %% [markdown]
# Be honest about what this shows: the heads differ from each other, because each has its own
# slice of random weights, but their patterns mean nothing yet. They are also rather flat: on
# a colour scale from 0 to 1, no weight is above about 0.4 (an even spread would be 1/5 = 0.2),
# because random projections of random vectors give small scores. No head "knows" that "not"
# flips "bad". That takes training: in chapter 07 a small model learns a task with negations,
# and we measure heads that specialize and what happens when one is removed.
#
# ## 7. H heads side by side
#
# One last view, the one in the formula at the top. Head `h` of the module is an ordinary
# single head, the chapter 02 kind. Its projections $W_q^{(h)}, W_k^{(h)}, W_v^{(h)}$ are
# columns `h·d_k` to `(h+1)·d_k − 1` of the formula's `(d_model, d_model)` matrices
# $W_q, W_k, W_v$. `nn.Linear` stores the transpose (chapter 02, section 5), so in code they are
# *rows* of `W_q.weight`, `W_k.weight` and `W_v.weight` (and those entries of the biases).
# Splitting the projected tensor is the same as projecting with the slices. And $W_o$ applied
# to the concatenation is a sum of one term per head, `head_h @ W_o.weight[:, slice_h].T`, plus
# the bias: the output projection is where the heads' findings are added up. Both views,
# checked against the module of section 4:

# %%
per_head, contributions = [], []
for h in range(num_heads):
    slice_h = slice(h * head_dim, (h + 1) * head_dim)  # head h's features
    q_h = F.linear(x, mha.W_q.weight[slice_h], mha.W_q.bias[slice_h])  # (B, L, head_dim)
    k_h = F.linear(x, mha.W_k.weight[slice_h], mha.W_k.bias[slice_h])
    v_h = F.linear(x, mha.W_v.weight[slice_h], mha.W_v.bias[slice_h])
    head_h, _ = scaled_dot_product_attention(q_h, k_h, v_h)  # one single head
    per_head.append(head_h)
    contributions.append(head_h @ mha.W_o.weight[:, slice_h].T)  # (B, L, embed_dim)

side_by_side = mha.W_o(torch.cat(per_head, dim=-1))              # concatenate, then project
summed = sum(contributions) + mha.W_o.bias                       # or: add up each head's share
assert torch.allclose(side_by_side, module_output, atol=1e-6)
assert torch.allclose(summed, module_output, atol=1e-6)
print(f"{num_heads} single heads on their weight slices, concatenated, then W_o == the module (within 1e-6)")
print("sum over heads of head_h @ W_o.weight[:, slice_h].T, plus bias == the module (within 1e-6)")

# %% [markdown]
# The module does all heads in one batched matrix product instead of this Python loop; chapter
# 09 goes further with fused projections and PyTorch's attention kernels.
#
# ## Recap
#
# - One head gives each query one weighted average: two things needed for two reasons come out
#   blended, each at half strength, with no record of which is which. Several heads keep their
#   averages in separate slots, and `W_o` combines them.
# - Splitting: `view(B, L, H, d_k)` then `transpose(1, 2)` gives `(B, H, L, d_k)`, head `h`
#   owning features `h·d_k … (h+1)·d_k − 1` of every token. A plain reshape to that shape mixes
#   tokens into heads without any error.
# - Combining: `transpose(1, 2)` then `.contiguous().view(B, L, d_model)` or `.reshape(...)`;
#   `.view` alone fails because the transposed tensor isn't in row order in memory.
# - The five steps: project, split, attend per head, combine, project. With `d_model = 512`,
#   8 heads and a batch of 32 × 100: `(32, 100, 512) → (32, 8, 100, 64) → scores (32, 8, 100, 100)
#   → (32, 8, 100, 64) → (32, 100, 512)`.
# - The book's listing uses an undefined `self.d_v`; the fix is `d_v = d_k = d_model // H`.
#   `mha_lib.MultiHeadAttention` is the fixed module, equal to our step-by-step computation.
# - 8 heads of 64 have the same `4·512² + 4·512 = 1,050,624` parameters and the same
#   multiply-adds as one head of 512, but store 8 times as many attention weights: `H` times
#   the attention-weight memory, for `H` views.
# - The split has a price: each head scores through $W_q^{(h)} (W_k^{(h)})^\top$, of rank at
#   most `d_k` (64 in each of the 8 heads, 512 in one head of 512). Over `n > d_k` tokens no
#   head can produce every score pattern: on a full-rank pattern of 100 tokens the best head
#   of 64 is the truncated SVD, not exact. Bhojanapalli et al. (2020) prove the limit for
#   attention patterns and propose a head size equal to the sequence length; models keep
#   `d_k` at 64–128 and take more patterns of lower rank.
# - Each head is a single head on its rows of `W_q.weight`, `W_k.weight`, `W_v.weight`; `W_o`
#   adds up their shares.
# - Untrained heads show arbitrary patterns; trained ones specialize (chapter 07).
#
# ## Exercises
#
# Practise what this chapter built in `exercises/03_multi_head_attention.ipynb`; each exercise
# checks itself and tells you what is wrong. See the README for how to start your own copy.
# Exercises 3.1 to 3.4 count the parameters and rebuild the split, the merge and the module;
# exercise 3.5 writes a probe that measures which input positions each head reads through any
# split, and uses it to show what a split without the transpose does.
#
# ## What comes next
#
# So far every query could look at every key, and queries, keys and values came from the same
# sequence. **Chapter 04** adds masks to the module (padding in a batch of sentences of
# different lengths, causal masks for generation) and cross-attention, where the queries come
# from one sequence and the keys and values from another, so that `Lq ≠ Lk`.
