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
# # Chapter 05 · Checking our attention against PyTorch's own
#
# Chapters 01 to 04 built attention from a single dot product up to `mha_lib.MultiHeadAttention`
# with masks and cross-attention. Every shape came out right. But right shapes prove little:
# a missing $1/\sqrt{d_k}$, a softmax over the wrong axis or an inverted mask all give tensors
# of exactly the right shape, no error and plausible-looking numbers. This chapter shows how
# to *test* convincingly that an attention implementation computes what it should, by comparing
# it with an independent one: PyTorch's own.
#
# **By the end of this chapter you will be able to**
#
# - copy the weights of `mha_lib.MultiHeadAttention` into `torch.nn.MultiheadAttention` and
#   show that both modules compute the same outputs and the same per-head attention weights,
#   for self-attention and for cross-attention;
# - translate a boolean mask between the two opposite conventions (*True = may attend* and
#   *True = blocked*), and recognise what goes wrong when you forget;
# - use `F.scaled_dot_product_attention`, PyTorch's fused attention function, as a reference;
# - check hand-written gradients with `torch.autograd.gradcheck`, and read its failure;
# - choose the tolerance for a comparison in float64, float32 and bfloat16, and explain why
#   `==` is the wrong test and why a too-loose tolerance is no test at all.
#
# The first three points are part 1 (sections 1 to 5); the last two, gradients and
# tolerances, are part 2 (sections 6 and 7), which you may take in a second sitting.
#
# **Why bother?** Good small codebases earn trust by checking against a reference: Karpathy's
# minGPT loads the released GPT-2 weights into its own model, and a test checks that its logits
# match those of the Hugging Face implementation within a tolerance (`torch.allclose`; section 7
# explains why not `==`). One comparison with PyTorch (section 5) catches an inverted mask at
# once. Here you learn to write such comparisons and to read their results.
#
# *Sources.* The attribute names `W_q, W_k, W_v, W_o` and the mask convention (`mask == 0`
# means blocked) follow listing 2.4 of *Transformers in Action* (Manning), section 2.2.3. The
# small configuration of sections 1 to 3 (batch 2, sequence 4, embedding 8, 2 heads) is the one of
# Priyesh Dave's post "Day 28: Multi-Head Attention" (DEV Community), used in chapter 03.
# PyTorch's side follows the documentation of `torch.nn.MultiheadAttention`,
# `torch.nn.functional.scaled_dot_product_attention`, `torch.autograd.gradcheck` and
# `torch.testing.assert_close`.

# %% [markdown]
# ## Set-up
#
# As in every chapter: the device comes from `get_device()` (set `MHA_DEVICE=cpu` to force
# the CPU), every generator is seeded, and random numbers and modules are made on the CPU and
# then moved, so that your numbers are the ones printed here. Sections 6 and 7
# compute in float64, which Apple's MPS backend lacks: `device64` is the CPU there and the
# same as `device` everywhere else.

# %%
import math
import warnings

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import mha_lib
from mha_lib import MultiHeadAttention, causal_mask, get_device, padding_mask, plot_attention, seed_everything

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
device64 = torch.device("cpu") if device.type == "mps" else device  # Apple's MPS has no float64
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# Two small helpers used throughout. `agree` asks `torch.testing.assert_close` (section 7
# explains its tolerances) for a yes/no answer instead of an exception; `max_rel_diff`
# measures how far apart two tensors are, relative to the largest entry of the reference.

# %%
def agree(actual: torch.Tensor, expected: torch.Tensor, **tolerances) -> bool:
    """True when torch.testing.assert_close(actual, expected, **tolerances) passes."""
    try:
        torch.testing.assert_close(actual, expected, **tolerances)
    except AssertionError:
        return False
    return True


def max_rel_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, computed in float64."""
    actual, expected = actual.detach().double(), expected.detach().double()
    return ((actual - expected).abs().max() / expected.abs().max()).item()


# %% [markdown]
# ## 1. How `nn.MultiheadAttention` stores its weights
#
# Our module has four separate projections, `W_q, W_k, W_v, W_o`, each an `nn.Linear(d_model,
# d_model)`. PyTorch's `nn.MultiheadAttention` computes the same thing but stores the first
# three **stacked** in one matrix:
#
# | ours | `nn.MultiheadAttention` | shape |
# |---|---|---|
# | `W_q.weight`, `W_k.weight`, `W_v.weight` | `in_proj_weight`, rows `[0, D)`, `[D, 2D)`, `[2D, 3D)` | `(3·D, D)` |
# | `W_q.bias`, `W_k.bias`, `W_v.bias` | `in_proj_bias`, in the same order | `(3·D,)` |
# | `W_o` | `out_proj` (an `nn.Linear`) | `(D, D)` and `(D,)` |
#
# Both follow `nn.Linear`'s convention $y = x W^\top + b$ with `weight` shaped `(out, in)`,
# so nothing needs transposing. Let's look at both parameter lists with the small
# configuration of chapter 03: `d_model = 8`, 2 heads of 4.

# %%
D, H = 8, 2
ours = MultiHeadAttention(D, H)
theirs = nn.MultiheadAttention(D, H, batch_first=True)
for module in (ours, theirs):
    print(type(module).__name__)
    for name, p in module.named_parameters():
        print(f"   {name:16s} {tuple(p.shape)}")

# %% [markdown]
# One more difference matters: **`batch_first`**. By default `nn.MultiheadAttention` expects
# `(L, B, D)`, sequence first, a layout from the days of recurrent networks. We always pass
# `batch_first=True` to get the `(B, L, D)` layout of the rest of the course. Section 3 shows
# what happens when you forget.
#
# ## 2. A helper that copies our weights into PyTorch's module
#
# `torch_twin(ours)` builds an `nn.MultiheadAttention` holding exactly our weights, on the
# same device and with the same dtype. `torch.cat` stacks $W_q, W_k, W_v$ along the rows, which
# is the layout of `in_proj_weight`. The copies run under `torch.no_grad()`: an in-place write
# into a parameter that requires grad is an error otherwise, and a copy is not a computation we
# want gradients for.

# %%
def torch_twin(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention (batch_first=True) holding the weights of `ours`."""
    bias = ours.W_q.bias is not None
    twin = nn.MultiheadAttention(ours.d_model, ours.num_heads, dropout=ours.dropout, bias=bias, batch_first=True)
    twin = twin.to(ours.W_q.weight.device, ours.W_q.weight.dtype)  # built on the CPU, then moved
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))  # (3·D, D)
        twin.out_proj.weight.copy_(ours.W_o.weight)  # (D, D)
        if bias:
            twin.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))  # (3·D,)
            twin.out_proj.bias.copy_(ours.W_o.bias)  # (D,)
    return twin.train(ours.training)


ours = MultiHeadAttention(D, H).to(device).eval()
theirs = torch_twin(ours)
print("in_proj_weight:", tuple(theirs.in_proj_weight.shape))
print("rows 0-7 are W_q:  ", torch.equal(theirs.in_proj_weight[:D], ours.W_q.weight))
print("rows 8-15 are W_k: ", torch.equal(theirs.in_proj_weight[D:2 * D], ours.W_k.weight))
print("rows 16-23 are W_v:", torch.equal(theirs.in_proj_weight[2 * D:], ours.W_v.weight))

# %% [markdown]
# Here `torch.equal` (bit-for-bit equality) is the right test: a copy is exact. For
# *computed* results it is the wrong test, as section 7 explains.
#
# The picture of `in_proj_weight`: the three bands are $W_q, W_k, W_v$, and inside each band
# head 0 owns the first 4 rows and head 1 the next 4 (the split of chapter 03). In `out_proj`
# it is the *columns* that belong to the heads: they read the concatenated head outputs.

# %%
in_proj = theirs.in_proj_weight.detach().cpu()
out_proj = theirs.out_proj.weight.detach().cpu()
top = float(max(in_proj.abs().max(), out_proj.abs().max()))
d_k = D // H
fig, axes = plt.subplots(1, 2, figsize=(9, 5.2))
axes[0].imshow(in_proj, cmap="RdBu", vmin=-top, vmax=top)
for row in range(d_k, 3 * D, d_k):  # solid lines between W_q, W_k, W_v; dashed between heads
    axes[0].axhline(row - 0.5, color="black", lw=2 if row % D == 0 else 0.8, ls="-" if row % D == 0 else "--")
band_labels = [f"{name}, head {h}: rows {i * D + h * d_k}-{i * D + (h + 1) * d_k - 1}"
               for i, name in enumerate(["W_q", "W_k", "W_v"]) for h in range(H)]
axes[0].set_yticks([b * d_k + (d_k - 1) / 2 for b in range(3 * H)], band_labels)
axes[0].set_xticks(range(D))
axes[0].set(title="in_proj_weight (3·D, D)", xlabel="input feature")
image = axes[1].imshow(out_proj, cmap="RdBu", vmin=-top, vmax=top)
axes[1].axvline(d_k - 0.5, color="black", lw=0.8, ls="--")
axes[1].set_xticks([(d_k - 1) / 2 + h * d_k for h in range(H)], [f"from head {h}" for h in range(H)])
axes[1].set_yticks(range(D))
axes[1].set(title="out_proj.weight = W_o (D, D)", xlabel="input feature (the concatenated heads)",
            ylabel="output feature")
fig.colorbar(image, ax=axes.tolist(), shrink=0.7, label="weight")
plt.show()

# %% [markdown]
# ## 3. Same weights, same outputs
#
# ### Self-attention
#
# A batch of 2 sequences of 4 tokens of width 8. By default `nn.MultiheadAttention` returns
# its weights **averaged over the heads**; `need_weights=True, average_attn_weights=False`
# asks for one map per head, shaped `(B, H, Lq, Lk)` like ours. We compare with
# `torch.testing.assert_close`, which raises an error naming the largest difference if the
# tensors are not close.

# %%
B, L = 2, 4
x = torch.randn(B, L, D).to(device)

out, weights = ours(x, x, x, return_weights=True)
ref_out, ref_weights = theirs(x, x, x, need_weights=True, average_attn_weights=False)
print("outputs:", tuple(out.shape), tuple(ref_out.shape))
print("weights:", tuple(weights.shape), tuple(ref_weights.shape))
torch.testing.assert_close(out, ref_out)
torch.testing.assert_close(weights, ref_weights)
print("outputs and per-head weights agree")

# %% [markdown]
# With the default `average_attn_weights=True` PyTorch returns `(B, Lq, Lk)`: the mean of
# the heads' maps. The average is handy for a quick look but hides what each head does
# (chapter 07 studies heads one by one). With our small random inputs every map is nearly
# uniform, so we scale the inputs by 4: larger scores, sharper maps. Now the two heads attend
# to different keys, and their average looks like neither. (The inputs are random vectors;
# the token labels are only there to make the maps readable.)

# %%
sharp = 4 * x  # (B, L, D): the same directions, 4 times longer
_, sharp_weights = ours(sharp, sharp, sharp, return_weights=True)                 # (B, H, L, L)
_, averaged = theirs(sharp, sharp, sharp)  # need_weights=True and average_attn_weights=True are the defaults
print("averaged:", tuple(averaged.shape))
torch.testing.assert_close(averaged, sharp_weights.mean(dim=1))
print("PyTorch's default weights == the mean of our heads' weights")

tokens = ["the", "movie", "was", "good"]
panels = torch.cat([sharp_weights[0], averaged[:1]])  # (3, L, L): head 0, head 1, their mean
plot_attention(panels, tokens, head_titles=["head 0", "head 1", "default: mean of heads"],
               title="Sequence 0: PyTorch's per-head maps (= ours) and its default average")
plt.show()

# %% [markdown]
# ### Cross-attention
#
# In cross-attention the queries come from one sequence and the keys and values from another
# (chapter 04's translation example), so `Lq ≠ Lk`. Same module, same check:

# %%
Lq, Lk = 3, 6
query = torch.randn(B, Lq, D).to(device)
memory = torch.randn(B, Lk, D).to(device)

out, weights = ours(query, memory, memory, return_weights=True)
ref_out, ref_weights = theirs(query, memory, memory, average_attn_weights=False)
print("outputs:", tuple(out.shape), " weights:", tuple(weights.shape))
torch.testing.assert_close(out, ref_out)
torch.testing.assert_close(weights, ref_weights)
print("cross-attention: outputs and per-head weights agree")

# %% [markdown]
# ### A mistake the comparison catches: forgetting `batch_first=True`
#
# A twin built without `batch_first=True` reads our `(B, L, D) = (2, 4, 8)` tensor as
# `(L, B, D)`: a batch of 4 "sequences" of length 2, each made of *one token from each of our
# sentences*. It runs without any error and returns a tensor of the right shape. Only the
# comparison notices:

# %%
sequence_first = nn.MultiheadAttention(D, H).to(device).eval()  # batch_first=False, the default
sequence_first.load_state_dict(theirs.state_dict())             # the same weights as `theirs`
wrong_out, _ = sequence_first(x, x, x)
out = ours(x, x, x)
print("shapes match:", wrong_out.shape == out.shape)
print("outputs agree:", agree(wrong_out, out))
right_out, _ = sequence_first(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))
print("outputs agree after transposing to (L, B, D) and back:", agree(right_out.transpose(0, 1), out))

# %% [markdown]
# ## 4. Two opposite conventions for boolean masks
#
# Both libraries accept a **boolean** mask, but they read it in opposite ways:
#
# | | `mha_lib`, `F.scaled_dot_product_attention` | `nn.MultiheadAttention` |
# |---|---|---|
# | `True` means | the query **may attend** to this key | this key is **blocked** |
# | shapes | anything that broadcasts to `(B, H, Lq, Lk)` | `attn_mask`: `(Lq, Lk)` or `(B·H, Lq, Lk)`; `key_padding_mask`: `(B, Lk)` |
# | causal mask | `causal_mask(L)` (lower triangle) | `~causal_mask(L)` (strict upper triangle) |
# | padding mask | `padding_mask(lengths)`, `(B, 1, 1, Lk)` | `~padding_mask(lengths)[:, 0, 0]`, `(B, Lk)` |
# | a float mask | added to the scores (`0` or `-inf`) | added to the scores (the same!) |
# | a query with every key blocked | `mha_lib`: zero weights (chapter 04); `F.sdpa`: zero output (torch 2.13, CPU) | NaN with the default `need_weights=True`; other code paths may return 0 |
#
# The book listing's `masked_fill(mask == 0, ...)` reads masks our way: 0 (False) is blocked.
# A float mask means the same in both libraries (PyTorch's
# `nn.Transformer.generate_square_subsequent_mask(L)` builds a causal one, with `-inf` above
# the diagonal), but booleans must be **inverted with `~`** when they cross over. Here is the
# same causal mask in both conventions: the same cells are blocked, the words are opposite.

# %%
sentence = ["The", "movie", "was", "not", "bad"]
allowed = causal_mask(len(sentence))  # True = may attend
fig, axes = plt.subplots(1, 2, figsize=(9, 4.2))
for ax, mask, title in ((axes[0], allowed, "mha_lib, F.sdpa: causal_mask(5)\nTrue = may attend"),
                        (axes[1], ~allowed, "nn.MultiheadAttention: ~causal_mask(5)\nTrue = blocked")):
    ax.imshow(allowed.int(), cmap="Blues", vmin=-0.6, vmax=1.4)  # shaded = may attend, in both panels
    for i in range(len(sentence)):
        for j in range(len(sentence)):
            ax.text(j, i, str(bool(mask[i, j])), ha="center", va="center", fontsize=9,
                    fontweight="bold" if mask[i, j] else "normal")
    ax.set_xticks(range(len(sentence)), sentence, rotation=90)
    ax.set_yticks(range(len(sentence)), sentence)
    ax.set(title=title, xlabel="key", ylabel="query")
fig.suptitle("The same causal mask (shaded: may attend) in both conventions")
fig.tight_layout()
plt.show()

# %% [markdown]
# ### The conversions
#
# **Causal (or any `(Lq, Lk)`) mask:** `attn_mask = ~mask`.
#
# **Padding mask:** ours is `(B, 1, 1, Lk)` so that it broadcasts over heads and queries;
# PyTorch's `key_padding_mask` is `(B, Lk)` with True on the padding:
# `key_padding_mask = ~keep[:, 0, 0]`. Both masks can be given at once. Below, two sentences
# of lengths 5 and 3, padded to 5, with a causal mask on top.

# %%
L = len(sentence)
x = torch.randn(B, L, D).to(device)
causal = causal_mask(L, device=device)                                    # (L, L), True = may attend
keep = padding_mask(torch.tensor([5, 3]), max_len=L).to(device)          # (B, 1, 1, L), True = real token
print("ours:    mask", tuple(causal.shape), "& padding", tuple(keep.shape), "->", tuple((keep & causal).shape))
attn_mask, key_padding_mask = ~causal, ~keep[:, 0, 0]                    # True = blocked
print("PyTorch: attn_mask", tuple(attn_mask.shape), " key_padding_mask", tuple(key_padding_mask.shape))
print(key_padding_mask.cpu())

out, weights = ours(x, x, x, mask=keep & causal, return_weights=True)
ref_out, ref_weights = theirs(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                              average_attn_weights=False)
torch.testing.assert_close(out, ref_out)
torch.testing.assert_close(weights, ref_weights)
print("causal + padding: outputs and per-head weights agree")

# %% [markdown]
# **A different mask per head** (chapter 12 restricts head 0 to the first half of the
# sequence and head 1 to the second): ours is `(H, Lq, Lk)` and broadcasts over the batch.
# PyTorch wants a 3-D `attn_mask` of shape `(B·H, Lq, Lk)`, **batch-major**: entry
# `b·H + h` is the mask of sequence `b`, head `h`. `expand` then `reshape` builds exactly that;
# `repeat_interleave(B, dim=0)` looks similar but orders the entries head-major, and the
# comparison catches it.

# %%
per_head = torch.zeros(H, L, L, dtype=torch.bool)
per_head[0, :, : L // 2] = True   # head 0: the first half
per_head[1, :, L // 2 :] = True   # head 1: the second half
per_head = per_head.to(device)
out = ours(x, x, x, mask=per_head)

batch_major = ~per_head.expand(B, H, L, L).reshape(B * H, L, L)  # entry b*H + h
head_major = ~per_head.repeat_interleave(B, dim=0)               # entry h*B + b: wrong order
print("attn_mask:", tuple(batch_major.shape))
print("expand + reshape agrees:   ", agree(theirs(x, x, x, attn_mask=batch_major)[0], out))
print("repeat_interleave agrees:  ", agree(theirs(x, x, x, attn_mask=head_major)[0], out))

# %% [markdown]
# ### The mistake: passing a mask without converting it
#
# Hand our causal mask to `nn.MultiheadAttention` as it is, and PyTorch reads every `True` as
# *blocked*: each query may attend only to the tokens **after** it, and the last query has
# no key left at all, so its row of the softmax is $0/0$ = NaN (with the default
# `need_weights=True`). Again no error, and the output has the right shape.

# %%
wrong_out, wrong_weights = theirs(x, x, x, attn_mask=causal, average_attn_weights=False)  # forgot ~
out, weights = ours(x, x, x, mask=causal, return_weights=True)
print("shape is right:     ", wrong_out.shape == out.shape)
print("outputs agree:      ", agree(wrong_out, out))
nan_rows = wrong_out[0].isnan().any(dim=-1).nonzero().flatten().tolist()
print("NaN in PyTorch's output:", wrong_out.isnan().any().item(), f"(sentence 0: query rows {nan_rows})")
# each row of weights sums to 1: "of N" is the total weight of the N rows counted
print(f"weight on future tokens, ours:    {weights[..., ~causal].sum().item():.3f} of {B * H * L} (every row)")
print(f"weight on future tokens, PyTorch: {wrong_weights[:, :, :-1][..., ~causal[:-1]].sum().item():.3f} "
      f"of {B * H * (L - 1)} (every row but the NaN ones)")

# %%
plot_attention(torch.stack([weights[0, 0], wrong_weights[0, 0]]), sentence, panel_size=3.8,
               head_titles=["ours: mask=causal_mask(5)", "PyTorch: attn_mask=causal_mask(5)\n(not inverted)"],
               title="Sentence 0, head 0: future visible, last row NaN when the mask is not inverted")
plt.show()

# %% [markdown]
# A model trained with the unconverted mask would see the future: it learns to copy the next
# token instead of predicting it. The most direct test of causality is chapter 04's
# behavioural one: change the **last** token and check that no earlier output moves.

# %%
x_changed = x.clone()
x_changed[:, -1] += 1.0  # change the last token only

for name, attend in (("ours, causal_mask", lambda inp: ours(inp, inp, inp, mask=causal)),
                     ("PyTorch, not inverted", lambda inp: theirs(inp, inp, inp, attn_mask=causal)[0])):
    earlier_moved = (attend(x_changed)[:, :-1] - attend(x)[:, :-1]).abs().max().item() > 1e-6
    print(f"{name:22s}: the future leaks into earlier positions: {earlier_moved}")

# %% [markdown]
# The padding mask fails the same way. Unconverted, `key_padding_mask` blocks the *real*
# tokens: the full-length sentence 0 has no key left (NaN everywhere), and sentence 1 attends
# only to its padding.

# %%
wrong_out, wrong_weights = theirs(x, x, x, key_padding_mask=keep[:, 0, 0], average_attn_weights=False)  # forgot ~
print("sentence 0 (no padding) is all NaN:", wrong_out[0].isnan().all().item())
print("sentence 1, weight on its 3 real tokens:", f"{wrong_weights[1, :, :, :3].sum().item():.3f}")
print("sentence 1, weight on its padding:      ", f"{wrong_weights[1, :, :, 3:].sum().item():.3f}",
      "(H * L =", H * L, "rows of weights)")

# %% [markdown]
# ## 5. `F.scaled_dot_product_attention`: the fused version of our function
#
# PyTorch's `torch.nn.functional.scaled_dot_product_attention(query, key, value,
# attn_mask=None, dropout_p=0.0, is_causal=False, scale=None)` computes
# $\text{softmax}(QK^\top/\sqrt{d_k} + \text{mask})\,V$ like `mha_lib.scaled_dot_product_attention`,
# with three differences:
#
# - it returns **only the output**, never the weights: that is what lets a fused kernel
#   avoid storing the `(Lq, Lk)` weight matrix at all;
# - its boolean `attn_mask` reads like ours (**True = may attend**); a float mask is added;
# - `is_causal=True` applies the causal mask without you building it (don't pass both).
#
# It picks a **fused kernel** when the hardware and dtype have one (FlashAttention or
# memory-efficient attention on recent NVIDIA GPUs, a flash-attention-style kernel on the
# CPU) and falls back to the plain two-matmul "math" version otherwise. Chapter 10 goes
# deeper. Since it
# gives no weights, we compare outputs, over the cases the course uses: `(B, H, L, d_k)`
# tensors, no mask, causal masks both ways, a padding mask in cross-attention, and per-head
# masks.

# %%
q = torch.randn(2, 4, 6, 8).to(device)    # (B, H, Lq, d_k)
k = torch.randn(2, 4, 6, 8).to(device)    # (B, H, Lk, d_k)
v = torch.randn(2, 4, 6, 5).to(device)    # (B, H, Lk, d_v)
k_long = torch.randn(2, 4, 9, 8).to(device)  # a longer memory, for cross-attention
v_long = torch.randn(2, 4, 9, 5).to(device)
causal = causal_mask(6, device=device)                            # (6, 6)
keep = padding_mask(torch.tensor([9, 4]), max_len=9).to(device)   # (2, 1, 1, 9)
head_mask = torch.rand(4, 6, 6).to(device) > 0.3                  # (H, Lq, Lk), random
head_mask[..., 0] = True                                          # every query keeps one key

cases = [  # (name, ours, PyTorch's)
    ("no mask", (q, k, v, None), dict(query=q, key=k, value=v)),
    ("causal, attn_mask", (q, k, v, causal), dict(query=q, key=k, value=v, attn_mask=causal)),
    ("causal, is_causal=True", (q, k, v, causal), dict(query=q, key=k, value=v, is_causal=True)),
    ("cross-attention + padding", (q, k_long, v_long, keep), dict(query=q, key=k_long, value=v_long, attn_mask=keep)),
    ("a mask per head", (q, k, v, head_mask), dict(query=q, key=k, value=v, attn_mask=head_mask)),
]
for name, args, kwargs in cases:
    ours_out, _ = mha_lib.scaled_dot_product_attention(*args)
    fused_out = F.scaled_dot_product_attention(**kwargs)
    torch.testing.assert_close(ours_out, fused_out)
    print(f"{name:26s} output {tuple(fused_out.shape)}: mha_lib == F.sdpa")

# %% [markdown]
# `is_causal=True` lines up query $i$ with key $i$ from the top-left corner. For `Lq ≠ Lk`
# (for example, a few new tokens attending to a long cache) that is rarely the mask you want.
# Build it yourself, aligned bottom-right, and pass it as `attn_mask`:
# `torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)` (for `Lq = 3, Lk = 4` that is
# `causal_mask(4)[1:]`).
#
# The same comparison catches the mask mistake of section 4 in reverse: give
# `F.scaled_dot_product_attention` a mask written in `nn.MultiheadAttention`'s convention and
# the outputs differ.

# %%
print("F.sdpa with ~causal (PyTorch-module style) agrees:",
      agree(F.scaled_dot_product_attention(q, k, v, attn_mask=~causal),
            mha_lib.scaled_dot_product_attention(q, k, v, causal)[0]))

# %% [markdown]
# # Part 2 · Gradients and tolerances
#
# Sections 1 to 5 checked outputs; sections 6 and 7 check gradients and choose tolerances. A
# good place for a break: when you come back, run all cells above this one first (Jupyter:
# *Run → Run All Above Selected Cell*), because part 2 reuses names defined there, such as
# `ours`, `theirs` and `agree`.
#
# ## 6. Checking gradients with `torch.autograd.gradcheck`
#
# Equal outputs do not yet prove equal *gradients*. A first check is the same as for the
# outputs: backpropagate one loss through our module and through its twin, and compare the
# gradients of the input and of every weight. PyTorch's gradient of `in_proj_weight` is
# `(3·D, D)`; `chunk(3)` cuts it back into the parts of $W_q, W_k, W_v$.

# %%
x = torch.randn(2, 5, D).to(device)
g = torch.randn(2, 5, D).to(device)  # a fixed random "loss" direction
causal = causal_mask(5, device=device)
x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
(ours(x_ours, x_ours, x_ours, mask=causal) * g).sum().backward()
(theirs(x_theirs, x_theirs, x_theirs, attn_mask=~causal)[0] * g).sum().backward()

torch.testing.assert_close(x_ours.grad, x_theirs.grad)
for part, grad_weight, grad_bias in zip(("W_q", "W_k", "W_v"), theirs.in_proj_weight.grad.chunk(3),
                                        theirs.in_proj_bias.grad.chunk(3)):
    torch.testing.assert_close(getattr(ours, part).weight.grad, grad_weight)
    torch.testing.assert_close(getattr(ours, part).bias.grad, grad_bias)
torch.testing.assert_close(ours.W_o.weight.grad, theirs.out_proj.weight.grad)
torch.testing.assert_close(ours.W_o.bias.grad, theirs.out_proj.bias.grad)
print("gradients agree: input", tuple(x_ours.grad.shape), "and W_q, W_k, W_v, W_o (weights and biases)")

# %% [markdown]
# Both modules are made of PyTorch operations whose gradients autograd derives, so this
# mostly confirms the forward check. The real danger is a backward pass written **by hand**
# (a custom `torch.autograd.Function`, a fused kernel): it can be wrong while the forward
# pass is right, and then there may be no second implementation to compare with.
#
# The test that always works is old and simple: **finite differences**. Nudge one input entry by a small
# $\varepsilon$ in both directions; the change of the output over $2\varepsilon$ approximates
# the derivative,
#
# $$\frac{\partial f}{\partial x_i} \approx \frac{f(x + \varepsilon e_i) - f(x - \varepsilon e_i)}{2\varepsilon},$$
#
# with an error of order $\varepsilon^2$. Let's do it by hand for every entry of the queries
# of `mha_lib.scaled_dot_product_attention`, reduced to a number with a fixed random vector
# `g` (the way a loss would), and compare with autograd. In **float64**.

# %%
q = torch.randn(1, 3, 4, dtype=torch.float64).to(device64)  # (B, Lq, d_k)
k = torch.randn(1, 5, 4, dtype=torch.float64).to(device64)  # (B, Lk, d_k)
v = torch.randn(1, 5, 2, dtype=torch.float64).to(device64)  # (B, Lk, d_v)
g = torch.randn(1, 3, 2, dtype=torch.float64).to(device64)  # weights of the "loss"


def loss(q: torch.Tensor) -> torch.Tensor:
    return (mha_lib.scaled_dot_product_attention(q, k, v)[0] * g).sum()


q_leaf = q.clone().requires_grad_(True)
loss(q_leaf).backward()  # autograd's gradient, in q_leaf.grad

eps = 1e-6
numerical = torch.zeros_like(q)
for i in range(q.numel()):
    nudge = torch.zeros_like(q).view(-1)
    nudge[i] = eps
    nudge = nudge.view_as(q)
    numerical.view(-1)[i] = (loss(q + nudge) - loss(q - nudge)) / (2 * eps)
print("gradient w.r.t. q:", tuple(numerical.shape))
print("autograd and finite differences agree within 1e-8:",
      torch.allclose(q_leaf.grad, numerical, rtol=0, atol=1e-8))

# %% [markdown]
# `torch.autograd.gradcheck(f, inputs)` does this systematically: for every input that
# requires a gradient and every output it builds the **whole Jacobian** twice, once by finite
# differences ($\varepsilon = 10^{-6}$) and once with autograd, and compares them
# (`atol=1e-5, rtol=1e-3`). It returns `True` or raises an error that says which output and
# which input disagree. It needs float64 inputs (why: at the end of this section). Run it on
# the attention function with a padding mask, and on a small `MultiHeadAttention` in
# cross-attention with a causal-style mask: inputs are kept tiny, because the cost grows with
# (number of input entries) x (number of output entries).

# %%
q = torch.randn(1, 2, 3, 4, dtype=torch.float64).to(device64).requires_grad_()  # (B, H, Lq, d_k)
k = torch.randn(1, 2, 5, 4, dtype=torch.float64).to(device64).requires_grad_()  # (B, H, Lk, d_k)
v = torch.randn(1, 2, 5, 3, dtype=torch.float64).to(device64).requires_grad_()  # (B, H, Lk, d_v)
keep = padding_mask([3], max_len=5).to(device64)                                # (1, 1, 1, 5)
ok = torch.autograd.gradcheck(lambda q, k, v: mha_lib.scaled_dot_product_attention(q, k, v, keep), (q, k, v))
print("gradcheck, mha_lib.scaled_dot_product_attention:", ok)

small = MultiHeadAttention(4, 2).to(device64, torch.float64)
query = torch.randn(1, 3, 4, dtype=torch.float64).to(device64).requires_grad_()   # (B, Lq, D)
memory = torch.randn(1, 4, 4, dtype=torch.float64).to(device64).requires_grad_()  # (B, Lk, D)
visible = causal_mask(4, device=device64)[1:]  # (3, 4): query i sees keys 0 .. i + 1
ok = torch.autograd.gradcheck(lambda a, b: small(a, b, b, mask=visible), (query, memory))
print("gradcheck, MultiHeadAttention (cross-attention, masked):", ok)

# %% [markdown]
# ### What a failure looks like
#
# To write a backward pass by hand, PyTorch offers **custom autograd functions**: a subclass
# of `torch.autograd.Function` with two static methods.
#
# - `forward(ctx, *inputs)` computes and returns the output from plain tensors. `ctx` is a
#   context object for this one call; `ctx.save_for_backward(...)` keeps what the backward
#   pass will need, and `ctx.saved_tensors` gives it back there.
# - `backward(ctx, grad_output)` receives $\partial L/\partial\,\text{output}$ and returns one
#   gradient $\partial L/\partial\,\text{input}$ per input of `forward`, in the same order.
# - You call it as `MyFunction.apply(*inputs)`, never `forward` directly: `apply` runs
#   `forward` and records the call in the autograd graph, so that `.backward()` later runs
#   your `backward`.
#
# Here is the first step of attention, the scaled scores $S = QK^\top/\sqrt{d_k}$, written as
# such a function. By the chain rule
# $\partial L/\partial Q = (\partial L/\partial S)\,K/\sqrt{d_k}$ and
# $\partial L/\partial K = (\partial L/\partial S)^\top Q/\sqrt{d_k}$. The backward below
# **forgets the $1/\sqrt{d_k}$** in the gradient of $Q$: an easy slip, and invisible in
# the forward pass.

# %%
class ScaledScores(torch.autograd.Function):
    """S = Q Kᵀ / √d_k, with a hand-written backward that forgets the scale for Q."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(q, k)
        return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (Lq, Lk)

    @staticmethod
    def backward(ctx, grad_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = ctx.saved_tensors
        scale = 1 / math.sqrt(q.size(-1))
        grad_q = grad_s @ k                             # BUG: should be grad_s @ k * scale
        grad_k = grad_s.transpose(-2, -1) @ q * scale   # (Lk, d_k), correct
        return grad_q, grad_k


class FixedScaledScores(ScaledScores):
    @staticmethod
    def backward(ctx, grad_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = ctx.saved_tensors
        scale = 1 / math.sqrt(q.size(-1))
        return grad_s @ k * scale, grad_s.transpose(-2, -1) @ q * scale


q = torch.randn(3, 4, dtype=torch.float64).to(device64).requires_grad_()  # (Lq, d_k), d_k = 4
k = torch.randn(5, 4, dtype=torch.float64).to(device64).requires_grad_()  # (Lk, d_k)
print("the forward pass is right:",
      torch.allclose(ScaledScores.apply(q, k), q @ k.T / 2))
print("gradcheck, buggy backward:", torch.autograd.gradcheck(ScaledScores.apply, (q, k), raise_exception=False))
print("gradcheck, fixed backward:", torch.autograd.gradcheck(FixedScaledScores.apply, (q, k)))

# %% [markdown]
# With the default `raise_exception=True`, the error names the culprit: output 0 (the only
# one) with respect to input 0, which is `q`. gradcheck stops at the first mismatch, so it says
# nothing about `k` (whose backward is in fact correct). The full message goes on
# with both Jacobians; we print its first line, and then compare the two Jacobians' entries
# ourselves. `torch.autograd.functional.jacobian(f, x)` builds the Jacobian of `f` at `x`
# with autograd, so it runs our hand-written backward: its entries are exactly
# $\sqrt{d_k} = 2$ times too large.

# %%
from torch.autograd.gradcheck import GradcheckError  # a subclass of RuntimeError

try:
    torch.autograd.gradcheck(ScaledScores.apply, (q, k))
except GradcheckError as error:
    print("GradcheckError:", str(error).splitlines()[0])

analytical = torch.autograd.functional.jacobian(lambda q: ScaledScores.apply(q, k), q)  # uses our backward
exact = torch.autograd.functional.jacobian(lambda q: q @ k.T / 2, q)                    # plain autograd
nonzero = exact != 0
ratio = analytical[nonzero] / exact[nonzero]
print(f"autograd / true derivative: from {ratio.min().item():.3f} to {ratio.max().item():.3f}")

# %% [markdown]
# **Why float64?** Finite differences subtract two nearly equal numbers. In float32, which
# keeps 6 to 7 significant digits, $f(x \pm 10^{-6})$ differ only in their last digit or
# two, so the difference quotient is mostly rounding noise: gradcheck then fails even on a
# *correct* function. PyTorch warns about it ("Input #0 requires gradient and is not a double
# precision floating point"); we silence the warning to show the result.

# %%
q32, k32 = q.detach().float().requires_grad_(), k.detach().float().requires_grad_()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    print("gradcheck in float32, fixed (correct) backward:",
          torch.autograd.gradcheck(FixedScaledScores.apply, (q32, k32), raise_exception=False))

# %% [markdown]
# ## 7. Which tolerance, and why
#
# ### Machine epsilon
#
# A floating-point number keeps a fixed number of significant bits. **Machine epsilon**,
# `torch.finfo(dtype).eps`, is the gap between 1 and the next representable number: the
# relative precision of one rounding. Each operation can be off by about half of it.

# %%
print("dtype      stored mantissa bits   eps        decimal digits")
for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
    info = torch.finfo(dtype)
    bits, digits = round(-math.log2(info.eps)), round(-math.log10(info.resolution))
    print(f"{str(dtype)[6:]:10s} {bits:12d}           {info.eps:.1e}    {digits:4d}")

# %% [markdown]
# ### Why `==` is the wrong test
#
# Floating-point addition is **not associative**: the order of a sum changes its rounding.

# %%
print("(0.1 + 0.2) + 0.3 =", (0.1 + 0.2) + 0.3)
print("0.1 + (0.2 + 0.3) =", 0.1 + (0.2 + 0.3))
print("equal:", (0.1 + 0.2) + 0.3 == 0.1 + (0.2 + 0.3))

# %% [markdown]
# A matrix product is made of long sums, and every implementation picks its own order:
# BLAS libraries cut the sum into blocks that fit the processor's caches and registers;
# a fused attention kernel walks the keys block by block and rescales a running softmax as
# it goes; our function does two separate matmuls with a softmax in between. Sum 1000 float32
# numbers forwards and backwards and compare both with the exact sum (`math.fsum`):

# %%
numbers = torch.randn(1000)  # float32, on the CPU: this is about arithmetic, not devices
forwards = torch.zeros(())
for value in numbers:
    forwards = forwards + value
backwards = torch.zeros(())
for value in numbers.flip(0):
    backwards = backwards + value
exact = math.fsum(numbers.double().tolist())  # float32 inputs summed without rounding
print("forwards == backwards:", bool(forwards == backwards))
print("both within 1e-4 of the exact sum:", max(abs(forwards.item() - exact), abs(backwards.item() - exact)) < 1e-4)

# %% [markdown]
# So two correct implementations agree only **up to rounding**, and a comparison needs a
# tolerance. How large? Let's measure. We compute attention once in float64 as the
# reference, then in each dtype with our function and with PyTorch's fused one, and record
# the largest difference relative to the largest output (`max_rel_diff` from the set-up).
# The exact differences depend on your hardware, so we print the bound they fall under:
# its power of ten is what matters.

# %%
q64 = torch.randn(2, 4, 64, 32, dtype=torch.float64).to(device64)  # (B, H, L, d_k)
k64 = torch.randn(2, 4, 64, 32, dtype=torch.float64).to(device64)
v64 = torch.randn(2, 4, 64, 32, dtype=torch.float64).to(device64)
causal = causal_mask(64, device=device64)
reference, _ = mha_lib.scaled_dot_product_attention(q64, k64, v64, causal)  # float64

bounds = {torch.float64: (None, 1e-13), torch.float32: (1e-9, 1e-5), torch.bfloat16: (1e-4, 1e-1)}
fused_differences = {}  # dtype -> per-entry |fused - reference| / max |reference|, for the plot
for dtype, (low, high) in bounds.items():
    q_, k_, v_ = (t.to(dtype) for t in (q64, k64, v64))
    ours_out, _ = mha_lib.scaled_dot_product_attention(q_, k_, v_, causal)
    fused_out = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
    fused_differences[dtype] = ((fused_out.double() - reference).abs() / reference.abs().max()).flatten().cpu()
    in_range = lambda d: (low is None or low <= d) and d < high
    rng = f"< {high:.0e}" if low is None else f"between {low:.0e} and {high:.0e}"
    d_ours, d_fused = max_rel_diff(ours_out, reference), max_rel_diff(fused_out, reference)
    d_between = max_rel_diff(ours_out, fused_out)
    print(f"{str(dtype)[6:]:8s} (eps {torch.finfo(dtype).eps:.0e}): difference to the float64 reference {rng}: "
          f"ours {in_range(d_ours)}, fused {in_range(d_fused)};  ours vs fused < {high:.0e}: {d_between < high}")
    assert in_range(d_ours) and in_range(d_fused) and d_between < high

# %% [markdown]
# Each dtype lands where its epsilon says. On the course's machine the **measured
# differences**, relative to the largest output, were a few times $10^{-16}$ in float64, about
# $10^{-7}$ in float32 (a sum of
# $d_k = 32$ or $L = 64$ terms is a few epsilons off, not $L$ epsilons, because rounding
# errors partly cancel) and a few times $10^{-3}$ in bfloat16, which keeps 8 significant bits
# (7 stored): rounding one number to bfloat16 alone can move it by $4 \cdot 10^{-3}$ of its
# size. (Our float64 result *is* the reference, so its difference is 0.)
# The distribution of the fused kernel's differences over all 16 384 output entries: most
# entries are smaller than the largest one, so their differences sit below epsilon.

# %%
fig, ax = plt.subplots(figsize=(9, 3.4))
colours = {torch.float64: "tab:green", torch.float32: "tab:blue", torch.bfloat16: "tab:red"}
bins = np.logspace(-20, 0, 81)
for dtype, diff in fused_differences.items():
    diff = diff[diff > 0].numpy()  # entries that match exactly have no logarithm
    ax.hist(diff, bins=bins, color=colours[dtype], alpha=0.6, label=f"{str(dtype)[6:]}: F.sdpa vs float64")
ax.set_ylim(top=ax.get_ylim()[1] * 1.3)  # room for the legend
for dtype in fused_differences:
    eps = torch.finfo(dtype).eps
    ax.axvline(eps, color=colours[dtype], ls="--")
    ax.text(eps * 1.4, ax.get_ylim()[1] * 0.5, f"eps {str(dtype)[6:]}", color=colours[dtype],
            rotation=90, va="center")
ax.set_xscale("log")
ax.set_xlim(1e-20, 10)
ax.set(xlabel="|difference| / max |output|  (log scale)", ylabel="number of entries",
       title="Rounding differences sit at or below each dtype's machine epsilon")
ax.legend(loc="upper center", ncol=3, fontsize=9)
plt.show()

# %% [markdown]
# ### `torch.testing.assert_close` and its defaults
#
# `torch.testing.assert_close(actual, expected)` passes when, for every entry,
# $|\text{actual} - \text{expected}| \le \texttt{atol} + \texttt{rtol}\cdot|\text{expected}|$,
# and checks shapes, dtypes and devices on the way. Without `rtol`/`atol` it picks defaults
# from the dtype:
#
# | dtype | `rtol` | `atol` |
# |---|---|---|
# | float64 | `1e-7` | `1e-7` |
# | float32 | `1.3e-6` | `1e-5` |
# | float16 | `1e-3` | `1e-5` |
# | bfloat16 | `1.6e-2` | `1e-5` |
#
# `rtol` is a few epsilons of the dtype for the 16- and 32-bit types (about 10 for float32)
# and generous for float64 (`1e-7`, where rounding alone would allow `1e-15`); `atol` covers
# entries near zero, where a relative tolerance is meaningless. Notice that `atol` stays at `1e-5`
# for the 16-bit types: two bfloat16 results differ by a few thousandths *of the largest
# output*, which for the small entries is far above `1e-5`. So the defaults fail for two
# correct bfloat16 implementations, and you pass an `atol` that fits your outputs' size:

# %%
q_, k_, v_ = (t.to(torch.bfloat16) for t in (q64, k64, v64))
ours_bf16, _ = mha_lib.scaled_dot_product_attention(q_, k_, v_, causal)
fused_bf16 = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
try:
    torch.testing.assert_close(ours_bf16, fused_bf16)
except AssertionError as error:
    print("bfloat16, default tolerances:", str(error).splitlines()[0])
print("bfloat16, atol=3e-2, rtol=3e-2:", agree(ours_bf16, fused_bf16, atol=3e-2, rtol=3e-2))
q_, k_, v_ = (t.float() for t in (q64, k64, v64))
print("float32, default tolerances:  ",
      agree(mha_lib.scaled_dot_product_attention(q_, k_, v_, causal)[0],
            F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)))

# %% [markdown]
# ### Too-loose tolerances hide bugs
#
# A tolerance is a claim: "anything closer than this is correct". Make it too loose and
# wrong code passes. How far above the rounding noise are real bugs? Below, five variants of
# attention in float32, each compared with `F.scaled_dot_product_attention`: the correct one,
# and four mutations. Three are the classics (no $1/\sqrt{d_k}$, the mask transposed so the
# future is visible, the softmax over the queries instead of the keys); the fourth is subtle:
# a mask that blocks with a finite $-10$ instead of $-\infty$, so a sliver of each future
# token leaks in: $e^{-10}$ *relative to* the allowed keys' $e^{\text{score}}$. Query 0 has one
# allowed key, perhaps with a low score, against 15 blocked ones, so it leaks most.

# %%
def attention(q, k, v, mask, *, scale=True, softmax_dim=-1, blocked=float("-inf")):
    """Attention with optional bugs: (..., Lq, d_k), (..., Lk, d_k), (..., Lk, d_v) -> (..., Lq, d_v)."""
    scores = q @ k.transpose(-2, -1)                            # (..., Lq, Lk)
    if scale:
        scores = scores / math.sqrt(q.size(-1))
    weights = torch.softmax(scores.masked_fill(~mask, blocked), dim=softmax_dim)
    return weights @ v


q = torch.randn(2, 4, 16, 8).to(device)   # (B, H, L, d_k), float32
k = torch.randn(2, 4, 16, 8).to(device)
v = torch.randn(2, 4, 16, 8).to(device)
causal = causal_mask(16, device=device)
expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)

variants = {
    "correct": attention(q, k, v, causal),
    "missing 1/√d_k": attention(q, k, v, causal, scale=False),
    "transposed mask": attention(q, k, v, causal.T),
    "softmax over queries": attention(q, k, v, causal, softmax_dim=-2),
    "leaky mask (-10)": attention(q, k, v, causal, blocked=-10.0),
}
loose = dict(atol=3e-2, rtol=3e-2)  # the tolerance of the bfloat16 test above
errors = {}
print("variant                max |error|   caught by float32 defaults   caught by atol=rtol=3e-2")
for name, result in variants.items():
    errors[name] = (result - expected).abs().max().item()
    shown = "< 1e-5" if errors[name] < 1e-5 else f"{errors[name]:.3f}"
    caught, caught_loose = not agree(result, expected), not agree(result, expected, **loose)
    print(f"{name:22s} {shown:>10s}    {caught!s:>14s}     {caught_loose!s:>20s}")
assert agree(variants["correct"], expected) and agree(variants["leaky mask (-10)"], expected, **loose)

# %% [markdown]
# On a log scale, against the two tolerances. The classic bugs are about five orders of
# magnitude above the float32 tolerance, and more than six above the rounding noise: any
# sensible tolerance catches them. The leaky mask sits between the two tolerances: the
# float32 default catches it; the tolerance of our bfloat16 test, copied into a float32
# test, lets it through. Compare in the most precise dtype you can afford (float64 or
# float32), with the tightest tolerance that dtype allows.

# %%
fig, ax = plt.subplots(figsize=(8, 3.6))
names = list(errors)
ax.barh(names, [max(errors[n], 1e-12) for n in names],
               color=["tab:green"] + ["tab:red"] * (len(names) - 1))
ax.axvline(1e-5, color="black", ls="--")
ax.text(1.3e-5, -0.6, "float32 atol (1e-5)", fontsize=9)
ax.axvline(3e-2, color="grey", ls=":")
ax.text(3.9e-2, -0.6, "bfloat16 test (3e-2)", fontsize=9, color="dimgrey")
ax.set_xscale("log")
ax.set_xlim(1e-9, 30)
ax.set_ylim(len(names) - 0.5, -0.9)  # top to bottom, with room for the labels
ax.set(xlabel="max |error| against F.scaled_dot_product_attention (float32)",
       title="Real bugs sit far above rounding noise; a loose tolerance can still hide one")
fig.tight_layout()
plt.show()

# %% [markdown]
# A leak is also what the behavioural test of section 4 is for: it does not depend on any
# tolerance, because an earlier output must not move *at all* when a future token changes.
#
# ## Recap
#
# - Right shapes prove nothing. Compare with an **independent reference**: PyTorch's
#   `nn.MultiheadAttention` (with copied weights) and `F.scaled_dot_product_attention`.
# - `nn.MultiheadAttention` stacks $W_q, W_k, W_v$ into `in_proj_weight` `(3·D, D)` (and
#   `in_proj_bias`); `out_proj` is $W_o$. Pass `batch_first=True` for `(B, L, D)`, and
#   `need_weights=True, average_attn_weights=False` for per-head weights `(B, H, Lq, Lk)`;
#   the default returns their mean over heads.
# - Boolean masks: `mha_lib` and `F.scaled_dot_product_attention` say **True = may attend**,
#   `nn.MultiheadAttention` says **True = blocked**. Convert with `~`; the padding mask goes
#   from `(B, 1, 1, Lk)` to `key_padding_mask` `(B, Lk)` with `~keep[:, 0, 0]`; a 3-D
#   `attn_mask` is `(B·H, Lq, Lk)`, batch-major. An unconverted mask runs without error,
#   leaks the future and, with the default `need_weights=True`, puts NaN where a query has
#   no key left.
# - `F.scaled_dot_product_attention` returns only the output, takes `attn_mask` or
#   `is_causal=True`, and picks a fused kernel when it can.
# - `torch.autograd.gradcheck` compares autograd with finite differences, in float64; it
#   names the output and input whose Jacobians disagree.
# - Floating-point sums depend on their order, so compare with a tolerance, never `==`. The
#   **measured** rounding differences, relative to the largest output: a few $10^{-16}$ in
#   float64, about $10^{-7}$ in float32, a few $10^{-3}$ in bfloat16. The **tolerances** sit
#   above them: `torch.testing.assert_close`'s defaults (`rtol` `1e-7`, `1.3e-6`, `1.6e-2`),
#   or `atol=rtol=3e-2` for bfloat16 results. Real bugs are orders of magnitude larger, but a
#   too-loose tolerance can still hide a subtle one.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/05_checking_against_pytorch.ipynb`; each
# exercise checks itself and tells you what is wrong. See the README for how to start your
# own copy.
# Exercises 5.1 to 5.3 convert the masks and copy the weights; exercise 5.4 asks for the tests
# themselves: a tolerance per dtype, chosen by a measurement, and a gradcheck that covers query,
# key and value, judged by the bugs they catch and the correct code they pass.
#
# ## What comes next
#
# Our module now agrees with PyTorch's, forwards and backwards, on every case we tried. Before we train it,
# **chapter 06** closes what chapter 02 left open: attention alone cannot see word order. It
# adds positions to the embeddings (the learned table the trained models of chapters 07 and 08
# use), then builds the rotary positions (RoPE) that today's language models apply inside every
# head. **Chapter 07** then puts the module to work in a model trained in seconds.
