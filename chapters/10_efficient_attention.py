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
# # Chapter 10 · Efficient attention: the same maths, less time and memory
#
# `mha_lib.MultiHeadAttention` was written to be read: three projections, a split, attention
# per head, a merge, a projection. On the way it stores every attention weight: a
# `(B, H, L, L)` tensor that grows with the **square** of the sequence length. Production code
# (PyTorch's `nn.MultiheadAttention`, Andrej Karpathy's nanoGPT) computes exactly the same
# function, but faster and in far less memory. This chapter walks from one to the other and
# measures every step.
#
# **By the end of this chapter you will be able to**
#
# - fuse $W_q, W_k, W_v$ into one `(3·d_model, d_model)` matrix, and prove that one matrix
#   multiplication then computes the same queries, keys and values as three;
# - call PyTorch's fused attention, `F.scaled_dot_product_attention`, see which kernel it runs
#   on your device, and check it against the course's explicit version;
# - use `mha_lib.EfficientMultiHeadAttention`, a drop-in twin of the teaching module;
# - compute how much memory the `L × L` weights take, and measure how time and memory grow with
#   the sequence length;
# - explain how flash attention avoids the `L × L` matrix (tiles and an *online softmax*),
#   and write the online softmax yourself;
# - count the tiles that a causal or a per-head mask lets a kernel skip, and measure the time
#   skipping saves;
# - benchmark the implementations with `python -m mha_lib.bench`.
#
# *Sources.* The fused projection follows nanoGPT's `CausalSelfAttention` (A. Karpathy) and
# `nn.MultiheadAttention`'s `in_proj_weight`. Flash attention: T. Dao et al., "FlashAttention:
# Fast and Memory-Efficient Exact Attention with IO-Awareness" (2022), and T. Dao,
# "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning" (2023); the online softmax:
# M. Milakov and N. Gimelshein, "Online normalizer calculation for softmax" (2018); attention
# without the `L × L` matrix: M. Rabe and C. Staats, "Self-attention Does Not Need O(n²) Memory"
# (2021). The configuration `d_model = 512`, 8 heads, a batch of 32 × 100 is from
# *Transformers in Action* (Manning), section 2.2.3.

# %% [markdown]
# ## Set-up
#
# As in every chapter: the device (CUDA when there is one, `MHA_DEVICE=cpu` forces the CPU), the
# seed, random numbers drawn on the CPU and then moved. On a GPU this notebook measures the GPU.

# %%
import math
import os

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import FancyArrowPatch, Rectangle
from torch import nn

import mha_lib
from mha_lib import EfficientMultiHeadAttention, MultiHeadAttention, causal_mask, get_device, padding_mask, seed_everything
from mha_lib import bench

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
bench.start_memory_worker(device)  # section 5 measures CPU memory in a second process: it starts now, in the background
print("Running on:", device.type)

# %% [markdown]
# ## 1. Two costs the teaching module pays
#
# Recall the five steps of `MultiHeadAttention.forward` (chapter 03), here with the book's
# configuration: a batch of 32 sequences of 100 tokens, `d_model = 512`, 8 heads of 64.
#
# 1. project: `W_q(query)`, `W_k(key)`, `W_v(value)`: **three** matrix multiplications;
# 2. split into heads: `(32, 100, 512) → (32, 8, 100, 64)`;
# 3. attend: scores `Q Kᵀ / √d_k`, softmax, weights @ V; the scores and weights are
#    `(32, 8, 100, 100)` tensors, **stored in memory**;
# 4. combine the heads; 5. project with `W_o`.
#
# Step 1 runs three small matrix products where one larger one would do (each call has a fixed
# overhead and reads its input once more). Step 3 writes `B·H·L²` numbers to memory, reads them
# back, and, when training, keeps them for the backward pass. The next two sections remove both
# costs without changing a single output.

# %%
B, L, d_model, H = 32, 100, 512, 8
mha = MultiHeadAttention(d_model, H).to(device).eval()
x = torch.randn(B, L, d_model).to(device)
out, weights = mha(x, x, x, return_weights=True)
print("input:  ", tuple(x.shape))
print("weights:", tuple(weights.shape), f"= {weights.numel():,} numbers")
print("output: ", tuple(out.shape))

# %% [markdown]
# ## 2. Fused projections: one matrix multiplication instead of three
#
# A linear layer computes $x W^\top + b$, one output feature per **row** of $W$. Stack the rows
# of $W_q$, $W_k$ and $W_v$ into one matrix, and one product computes all three results side by
# side:
#
# $$x\,\begin{bmatrix} W_q \\ W_k \\ W_v \end{bmatrix}^{\!\top} + \begin{bmatrix} b_q \\ b_k \\ b_v \end{bmatrix}
#   = \big[\; x W_q^\top + b_q \;\big|\; x W_k^\top + b_k \;\big|\; x W_v^\top + b_v \;\big]$$
#
# because each output column only ever sees its own row of the weight. Splitting the
# `3·d_model` output features into three chunks of `d_model` gives back Q, K and V. This is the
# same maths, not an approximation; rounding may differ in the last bit, because the products
# are summed in a different order.

# %%
W_qkv = torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight])  # (3·512, 512)
b_qkv = torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias])        # (3·512,)
with torch.no_grad():
    qkv = x @ W_qkv.T + b_qkv                                         # (32, 100, 1536)
    q, k, v = qkv.split(d_model, dim=-1)                              # 3 x (32, 100, 512)
    for name, fused, layer in [("Q", q, mha.W_q), ("K", k, mha.W_k), ("V", v, mha.W_v)]:
        assert torch.allclose(fused, layer(x), atol=1e-5)
print("W_qkv:", tuple(W_qkv.shape), " qkv:", tuple(qkv.shape), " q, k, v:", tuple(q.shape))
print("fused Q, K, V == three separate projections (within 1e-5)")

# %% [markdown]
# PyTorch's own module stores its weights this way: `nn.MultiheadAttention.in_proj_weight` is
# exactly this `(3·d_model, d_model)` matrix (rows: queries, then keys, then values), and
# nanoGPT's `c_attn` is the same layer. The split is free: `split` returns views of `qkv`, and
# so do the `view` and `transpose` that cut them into heads. A view reads the same block of
# memory, its `untyped_storage()`, only starting elsewhere (`storage_offset()`) and stepping
# differently:

# %%
print("nn.MultiheadAttention.in_proj_weight:", tuple(nn.MultiheadAttention(d_model, H).in_proj_weight.shape))
q_heads = q.view(B, L, H, d_model // H).transpose(1, 2)  # (B, H, L, d_k)
k_heads = k.view(B, L, H, d_model // H).transpose(1, 2)  # (B, H, L, d_k)
same_memory = lambda t: t.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
print("q per head:", tuple(q_heads.shape), " stored inside qkv:", same_memory(q_heads))
print("k per head:", tuple(k_heads.shape), " stored inside qkv:", same_memory(k_heads),
      f"(from entry {k_heads.storage_offset()} on)")

# %% [markdown]
# Separating Q, K and V first and then cutting each into heads takes seven operations: one
# `split`, then a `view` and a `transpose` for each of the three. The heads can be cut before
# Q, K and V are told apart: read `qkv`'s 1536 features as `3·H = 24` heads of 64, put the head
# axis in front, and split it into 8 query, 8 key and 8 value heads. That is three operations
# for the same views, and each costs a few microseconds of Python and dispatch, which a
# decoding step of one token notices; the library's module cuts its heads this way.

# %%
all_heads = qkv.view(B, L, 3 * H, d_model // H).transpose(1, 2)  # (B, 3·H, L, d_k)
q_all, k_all, v_all = all_heads.split(H, dim=1)                   # 3 x (B, H, L, d_k)
assert torch.equal(q_all, q_heads) and torch.equal(k_all, k_heads) and same_memory(v_all)
print("all heads:", tuple(all_heads.shape), "-> q, k, v:", tuple(q_all.shape), "== the heads cut one by one")

# %% [markdown]
# Fusing only works when queries, keys and values are projected from **the same tensor**
# (self-attention). In cross-attention the queries come from one sequence and the keys and
# values from another (chapter 04), so the module cuts `W_qkv` back into its `W_q`, `W_k` and
# `W_v` rows and applies them to the query, the key and the value: three products, as in the
# teaching module, with the same weights.
#
# ## 3. Fused attention: `F.scaled_dot_product_attention`
#
# PyTorch has one function for step 3: `F.scaled_dot_product_attention(q, k, v, attn_mask)`
# computes $\text{softmax}(QK^\top/\sqrt{d_k} + \text{mask})\,V$ and returns only the output.
# Behind it are several *kernels*, and PyTorch picks one for your device, dtype and inputs:
# flash attention, memory-efficient attention and cuDNN's attention on NVIDIA GPUs, a
# flash-attention-style kernel on the CPU, and the explicit "math" version as a fallback. Its
# boolean masks use the course's convention (True = may attend), so a mask goes in unchanged.
#
# It must agree with the explicit `mha_lib.scaled_dot_product_attention`, with and without masks:

# %%
q_heads, k_heads, v_heads = (t.view(B, L, H, d_model // H).transpose(1, 2) for t in (q, k, v))
masks = {
    "no mask": None,
    "causal": causal_mask(L, device=device),                                       # (L, L)
    "padding": padding_mask(torch.randint(50, L + 1, (B,)), max_len=L).to(device),  # (B, 1, 1, L)
}
for name, mask in masks.items():
    explicit, _ = mha_lib.scaled_dot_product_attention(q_heads, k_heads, v_heads, mask)
    fused = F.scaled_dot_product_attention(q_heads, k_heads, v_heads, attn_mask=mask)
    assert fused.shape == explicit.shape == (B, H, L, d_model // H)
    assert torch.allclose(fused, explicit, atol=1e-5)
    print(f"{name:8s}: F.scaled_dot_product_attention == mha_lib's (within 1e-5), {tuple(fused.shape)}")


# %% [markdown]
# Which kernel ran? Autograd can tell us. When an input needs a gradient, the output
# remembers the operation that produced it, `output.grad_fn`, so that `backward()` can run
# that operation's backward pass later. Its name is the kernel's name with `Backward0`
# appended. On the CPU it names PyTorch's flash-attention-style kernel; on an NVIDIA GPU,
# in float32, usually the memory-efficient one.

# %%
# NBVAL_IGNORE_OUTPUT
q_leaf = q_heads.detach().requires_grad_()  # (B, H, L, d_k), now autograd records what uses it
kernel = F.scaled_dot_product_attention(q_leaf, k_heads, v_heads).grad_fn.name()
print(kernel)
if device.type in ("cpu", "cuda"):
    assert any(name in kernel.lower() for name in ("flash", "efficient", "cudnn")), kernel

# %% [markdown]
# ## 4. `mha_lib.EfficientMultiHeadAttention`
#
# The two ideas together make the efficient module. It *is* the teaching module (a subclass:
# the same arguments, checks, forward, masks, RoPE and cache) with three of its methods
# replaced, in `mha_lib/efficient.py`: `make_projections` (one `W_qkv` instead of `W_q, W_k,
# W_v`), `project` and `attend`:
#
# ```python
# def project(self, query, key, value):       # steps 1 and 2: one layer W_qkv, (1536, 512)
#     heads = self.W_qkv(query).view(B, L, 3 * H, d_k).transpose(1, 2)  # self-attention: (B, 3·H, L, d_k)
#     return heads.split(H, dim=1)                # views: 3 x (B, H, L, d_k)
#
# def attend(self, q, k, v, mask, return_weights):  # step 3: the fused kernel
#     dropout_p = self.dropout if self.training else 0.0
#     return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None
# ```
#
# plus a path for cross-attention (slices of `W_qkv`), fewer key and value heads than query
# heads (chapter 11), the explicit path when you ask for the weights (a fused kernel never has
# them), dropout only in training, and a guard for queries whose keys are all masked (section 8
# shows why a fused kernel needs one).
# `EfficientMultiHeadAttention.from_module(mha)` copies a teaching module's weights, so the two
# can be compared:

# %%
efficient = EfficientMultiHeadAttention.from_module(mha)
print(efficient)
count = lambda module: sum(p.numel() for p in module.parameters())
print(f"parameters: teaching {count(mha):,}, efficient {count(efficient):,}")

with torch.no_grad():
    assert torch.allclose(efficient(x, x, x), mha(x, x, x), atol=1e-5)
print("book configuration, self-attention: efficient == teaching (within 1e-5)")

# %% [markdown]
# The same holds for cross-attention (`Lq ≠ Lk`) with a padding mask, and for the attention
# weights, which `return_weights=True` computes on the explicit path:

# %%
query = torch.randn(4, 7, d_model).to(device)
memory = torch.randn(4, 12, d_model).to(device)
keep = padding_mask([12, 9, 5, 1], max_len=12).to(device)  # (4, 1, 1, 12)
with torch.no_grad():
    out_teaching, w_teaching = mha(query, memory, memory, keep, return_weights=True)
    out_efficient = efficient(query, memory, memory, keep)
    _, w_efficient = efficient(query, memory, memory, keep, return_weights=True)
assert torch.allclose(out_efficient, out_teaching, atol=1e-5)
assert torch.allclose(w_efficient, w_teaching, atol=1e-6)
print("cross-attention, output:", tuple(out_efficient.shape), " weights:", tuple(w_efficient.shape))
print("efficient == teaching, outputs and weights")

# %% [markdown]
# And training gives the same gradients: `W_qkv`'s gradient is the three gradients of
# `W_q, W_k, W_v` stacked.

# %%
small = MultiHeadAttention(64, 4).to(device)
small_efficient = EfficientMultiHeadAttention.from_module(small)
xs = torch.randn(2, 10, 64).to(device)
small(xs, xs, xs, causal_mask(10, device=device)).pow(2).sum().backward()
small_efficient(xs, xs, xs, causal_mask(10, device=device)).pow(2).sum().backward()
stacked = torch.cat([small.W_q.weight.grad, small.W_k.weight.grad, small.W_v.weight.grad])
assert torch.allclose(small_efficient.W_qkv.weight.grad, stacked, atol=1e-5)
assert torch.allclose(small_efficient.W_o.weight.grad, small.W_o.weight.grad, atol=1e-5)
print("W_qkv.grad:", tuple(small_efficient.W_qkv.weight.grad.shape), "== the three gradients stacked")

# %% [markdown]
# ## 5. The `L × L` weight matrix, made concrete
#
# For one sequence (`B = 1`) and 8 heads, the weights are `8 · L²` numbers of 4 bytes each
# (float32). Double the length and they take four times the memory; the lengths below grow 4×
# per row, so the memory grows 16×:

# %%
for length in (1024, 4096, 16384):
    n_bytes = 1 * 8 * length * length * 4
    print(f"L = {length:>6,}: 1 x 8 x {length:,} x {length:,} x 4 bytes = {n_bytes / 2**20:>6,.0f} MiB")

# %% [markdown]
# At 16k tokens a single copy is 8 GiB, and the teaching module holds several at once: the
# scores, the softmax, and the masked weights it multiplies with V. (The book's configuration,
# `32 · 8 · 100²` numbers, is only 10 MB: the problem is the length, not the batch.)
#
# Let us measure at `L = 1024`, where it fits easily. The weights the teaching module returns
# are the predicted 32 MiB. `mha_lib.bench.peak_memories(steps, device)` measures how much
# memory one call of each step takes at its peak, above what was in use just before (after a
# first, unmeasured call). On a GPU it asks PyTorch's allocator
# (`torch.cuda.max_memory_allocated`). On the CPU PyTorch keeps no such count, so it asks the
# operating system: a separate Python process runs the step and reads its own peak resident
# memory (Linux only; elsewhere the CPU's memory is not measured and you get `None`). That is
# why a step is a `bench.Step` (a variant, a mode, a length, a model size), which the other
# process can rebuild, with fresh modules of the same shape. To save time we use a narrower
# model, `d_model = 128`: the weights do not depend on it.

# %%
# NBVAL_IGNORE_OUTPUT
length = 1024
teaching_small = MultiHeadAttention(128, 8).to(device).eval()
x_long = torch.randn(1, length, 128).to(device)
with torch.no_grad():
    _, w_long = teaching_small(x_long, x_long, x_long, return_weights=True)
weights_mib = w_long.numel() * w_long.element_size() / 2**20
print(f"weights returned at L = {length}: {tuple(w_long.shape)}, {weights_mib:.0f} MiB")
assert weights_mib == 32
del w_long

steps = [bench.Step(name, "forward", length, d_model=128, num_heads=8, device=device) for name in ("teaching", "efficient")]
peaks = dict(zip(["teaching", "efficient"], bench.peak_memories(steps, device)))  # bytes, or None
for name, peak in peaks.items():
    if peak is not None:
        print(f"{name:9s}: forward peak {peak / 2**20:6.1f} MiB")
if peaks["teaching"] is not None:
    assert peaks["teaching"] > 2 * 32 * 2**20 > 10 * peaks["efficient"]

# %% [markdown]
# The teaching module's forward pass needs a few copies of the weights at once (scores, the
# softmax, and the masked weights); the efficient one a few MiB.
#
# ## 6. Time and memory against length
#
# `mha_lib.bench.run_benchmark` times a training step (forward and backward) of each module at
# several lengths, and measures its peak memory. It warms every step up, then times every
# variant at every length once per round (round robin), for 5 rounds; one measurement repeats
# the step for at least `min_time` = 0.02 s. Load from other programs can only make a step
# *slower*, and the round robin spreads it over all lengths; we read the **fastest** of the 5
# (`stat="min"`), so one slow stretch cannot invent a jump or bend a curve.
# Here: the teaching module, the efficient one, and PyTorch's `nn.MultiheadAttention` with
# `need_weights=False` as the reference, at `L = 128 … 1024`. Timings and memory vary from
# machine to machine, so the outputs of these measuring cells are not compared when the course
# is tested; asserts check what must hold.

# %%
# NBVAL_IGNORE_OUTPUT
lengths = [128, 256, 512, 1024]
results = bench.run_benchmark(lengths, batch=1, d_model=128, num_heads=8, device=device, repeats=5,
                              min_time=0.02, modes=["fwd+bwd"], variants=["teaching", "efficient", "nn.MHA"])
print(bench.format_table(results, stat="min"))

# %%
# NBVAL_IGNORE_OUTPUT
def series(variant, field):
    return [getattr(r, field) for r in results if r.variant == variant]


fig, axes = plt.subplots(1, 2, figsize=(11, 4))
styles = {"teaching": "o-", "efficient": "o-", "nn.MHA": "s--"}  # efficient and nn.MHA may overlap
for variant, style in styles.items():
    axes[0].plot(lengths, [1e3 * s for s in series(variant, "fastest")], style, label=variant)
    if series(variant, "peak_bytes")[0] is not None:
        axes[1].plot(lengths, [b / 2**20 for b in series(variant, "peak_bytes")], style, label=variant)
first = 1e3 * series("efficient", "fastest")[0]
axes[0].plot(lengths, [first * n / lengths[0] for n in lengths], "k--", lw=1, label="∝ L")
if series("efficient", "peak_bytes")[0] is not None:
    first = series("efficient", "peak_bytes")[0] / 2**20
    axes[1].plot(lengths, [first * n / lengths[0] for n in lengths], "k--", lw=1, label="∝ L")
for ax, ylabel, first in [(axes[0], "ms per training step", 1e3 * series("teaching", "fastest")[0]),
                          (axes[1], "peak memory rise (MiB)", series("teaching", "peak_bytes")[0])]:
    if first is None:
        continue
    if ax is axes[1]:
        first = first / 2**20
    ax.plot(lengths, [first * (n / lengths[0]) ** 2 for n in lengths], "k:", label="∝ L²")
    ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel=ylabel)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
axes[0].set_title("Time: forward + backward")
axes[1].set_title("Memory: forward + backward")
fig.suptitle(f"B = 1, d_model = 128, H = 8, on {device.type}")
fig.tight_layout()
plt.show()

# %% [markdown]
# On a log-log plot a power law is a straight line, and its slope is the power. The teaching
# module's memory follows the `L²` guide: every doubling of `L` multiplies it by about 4. The
# fused kernel's memory grows far more slowly, with a slope near 1, as for `L` (its inputs,
# outputs and gradients are `L × d_model`), plus fixed costs that blur it at these sizes.
#
# Time is less clean. On a CPU the teaching module's time follows the `L²` guide (or grows
# even faster, once its `L × L` tensors no longer fit in the caches). The fused variants do
# the same `L²` arithmetic (every query still meets every key) with far less memory traffic,
# and the parts that grow more slowly, the projections (`∝ L`) and each call's fixed costs,
# still take a share of their time: on an idle CPU their slope has measured between about 1
# and 2.5, while the teaching module's is about 2 or more. Load from other programs distorts
# the slopes, because more threads than cores stall the short steps most: with the course's
# whole test suite running alongside, we measured `nn.MultiheadAttention` at 0.5 once and the
# teaching module at 1.3, below the fused one, another time. So the slopes are checked only
# on a machine that is not busy (a load average below its number of cores), and the cell says
# when it skips the check. (On a GPU these sizes are so small that fixed costs dominate, and
# every slope is flatter.) Let us measure the slopes, memory first:

# %%
def slope(values):
    """Least-squares slope of log(value) against log(L) over the last three lengths."""
    xs, ys = [math.log(n) for n in lengths[-3:]], [math.log(v) for v in values[-3:]]
    mx, my = sum(xs) / 3, sum(ys) / 3
    return sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)


if series("teaching", "peak_bytes")[0] is not None:
    teaching_slope, efficient_slope = slope(series("teaching", "peak_bytes")), slope(series("efficient", "peak_bytes"))
    assert 1.7 < teaching_slope < 2.3, teaching_slope
    assert efficient_slope < 1.6, efficient_slope  # near L's 1, far from L²'s 2
    memory_ratio = series("teaching", "peak_bytes")[-1] / series("efficient", "peak_bytes")[-1]
    assert memory_ratio > 8, memory_ratio  # at the largest L the order is clear, and would fail reversed
    print("memory grows like L^2 for the teaching module and far more slowly for the efficient one:", True)

# %% [markdown]
# Now time, fitted over the three longest lengths to the fastest repetitions, and the ratio of
# the two modules' times at the longest length, where the order is clearest (on an idle CPU the
# teaching module took 2.8 times as long at `L = 1024`). The asserts run only on a CPU, where
# these were measured, and only when it was not busy:

# %%
# NBVAL_IGNORE_OUTPUT
# (the slopes vary a little from machine to machine; the asserts check what the text says)
def load_is_low():
    """Whether the 1-minute load average is below the number of cores (says so when it is not)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # not on Windows
    if load >= (os.cpu_count() or 1):
        print(f"timing not checked: the load average is {load:.1f} on {os.cpu_count()} cores, so the machine "
              "was busy while timing; run this section again when it is idle")
    return load < (os.cpu_count() or 1)


time_slopes = {variant: slope(series(variant, "fastest")) for variant in ("teaching", "efficient", "nn.MHA")}
for variant, value in time_slopes.items():
    print(f"slope of time against L, {variant:9s}: {value:.2f}")
time_ratio = series("teaching", "fastest")[-1] / series("efficient", "fastest")[-1]
print(f"at L = {lengths[-1]}, the teaching module takes {time_ratio:.1f} times the efficient one's time")
if device.type == "cpu" and load_is_low():
    assert time_slopes["teaching"] > 1.5, time_slopes  # the L x L tensors: about L², or steeper
    assert all(0 < time_slopes[v] < time_slopes["teaching"] for v in ("efficient", "nn.MHA")), time_slopes
    assert time_ratio > 1.5, time_ratio  # reversed, the efficient module would be the slow one

# %% [markdown]
# ### When the fused function stores the weights after all
#
# `F.scaled_dot_product_attention` is one function with several kernels, and each kernel
# accepts only some inputs. When no fused kernel accepts them, PyTorch quietly runs its
# explicit "math" kernel, which computes and stores the `(B, H, Lq, Lk)` weights just like the
# teaching module. On the CPU (PyTorch 2.13) that happens for dropout in a training step, for a
# float mask that requires grad (a learned bias), and for a mask of **three** dimensions: the
# CPU's fused kernel takes a mask of two, `(Lq, Lk)`, or of four, `(B or 1, H or 1, Lq, Lk)`,
# nothing in between. A per-head mask `(H, Lq, Lk)` is such a mask (the course's last chapter
# uses one, and chapter 06's ALiBi and T5 biases have that shape); the same numbers seen as
# `(1, H, Lq, Lk)`, a view, run the fused kernel. (Forced onto it with
# `torch.nn.attention.sdpa_kernel`, PyTorch says why it refuses the 3-D mask: "Please use the
# following attn mask shapes: 2d … 4d …".) The name of `grad_fn` tells which kernel ran:

# %%
# NBVAL_IGNORE_OUTPUT
per_head_mask = causal_mask(L, device=device).expand(H, L, L)  # (H, L, L), one pattern per head
cases = {
    "no mask": {},
    "(L, L) mask": {"attn_mask": causal_mask(L, device=device)},
    "(H, L, L) mask": {"attn_mask": per_head_mask},
    "(1, H, L, L) mask": {"attn_mask": per_head_mask[None]},  # the same numbers, a view with one more axis
    "dropout 0.1": {"dropout_p": 0.1},
    "float mask, grad": {"attn_mask": torch.zeros(L, L, device=device, requires_grad=True)},
}
for name, kwargs in cases.items():
    kernel = F.scaled_dot_product_attention(q_leaf, k_heads, v_heads, **kwargs).grad_fn.name()
    print(f"{name:17s} {kernel}")
    if device.type == "cpu":
        assert ("Flash" in kernel) == (name in ("no mask", "(L, L) mask", "(1, H, L, L) mask")), (name, kernel)

# %% [markdown]
# The math kernel's backward pass is autograd's own (here `UnsafeViewBackward0`, the last step
# of the explicit computation). So `EfficientMultiHeadAttention` gives the kernel every mask with
# four dimensions (an `(H, Lq, Lk)` one as `(1, H, Lq, Lk)`), and per-head masks and biases run
# the fused kernel too. What that is worth, measured: a training step of the efficient module at
# `L = 1024`, with chapter 12's mask that shows each of 2 heads one half of the keys, and with
# ALiBi's causal bias (chapter 06), before and after. "Before" is the math kernel, which
# `bench.Step(..., kernel="math")` forces and PyTorch chose for the 3-D mask (the two measured
# the same peak memory, 26 MiB, for `F.scaled_dot_product_attention` at this size).

# %%
# NBVAL_IGNORE_OUTPUT
# (times and memory vary by machine; memory does not depend on the load, so it is asserted everywhere on a CPU)
head_steps = {(mask, kernel): bench.Step("efficient", "fwd+bwd", length, d_model=64, num_heads=2, device=device,
                                         mask=mask, kernel=kernel)
              for mask in ("halves", "alibi") for kernel in ("math", "auto")}
head_times = bench.time_steps(head_steps, repeats=3, warmup=1, min_time=0.0)  # round robin, seconds
head_peaks = dict(zip(head_steps, bench.peak_memories(list(head_steps.values()), device)))
for mask in ("halves", "alibi"):
    for kernel, label in (("math", "before (math)"), ("auto", "after (fused)")):
        peak = head_peaks[mask, kernel]
        peak_text = "" if peak is None else f", peak {peak / 2**20:5.1f} MiB"
        print(f"{mask:6s} {label:13s}: {1e3 * min(head_times[mask, kernel]):6.0f} ms per training step{peak_text}")
if device.type == "cpu" and head_peaks["halves", "math"] is not None:
    for mask in ("halves", "alibi"):
        assert head_peaks[mask, "auto"] < 0.7 * head_peaks[mask, "math"], (mask, head_peaks)
vectorised = device.type == "cpu" and torch.backends.cpu.get_cpu_capability() != "DEFAULT"
if device.type == "cpu" and not vectorised:
    print("time not checked: PyTorch runs its plain C++ kernels here (ATEN_CPU_CAPABILITY=default)")
if vectorised and load_is_low():
    for mask in ("halves", "alibi"):
        assert min(head_times[mask, "auto"]) < min(head_times[mask, "math"]), (mask, head_times)

# %% [markdown]
# The time saving needs the fused kernel's vector code. On PyTorch's plain C++ kernel path
# (`ATEN_CPU_CAPABILITY=default`, what a CPU without AVX2 runs) the math path still does most of
# its work in matrix products from an optimised library (MKL here), which picks its own vector
# code, while the fused kernel's own loops (the online softmax) lose theirs. There, at this
# `L = 1024`, we measured the halves mask at 53 ms before and 58 ms after, ALiBi at 78 and 78; at
# `L = 2048` the fused kernel was ahead again (halves 212 and 169 ms). So the cell checks the time
# only on a vectorised path, and the memory everywhere.
#
# So on a CPU, `EfficientMultiHeadAttention` saves the weights' memory wherever a fused kernel
# runs: no mask, or a bool mask or float bias that needs no gradient, whatever its shape, and no
# dropout while training. A per-head mask still costs its own `H · L²` numbers (the CPU kernel
# turns a bool mask into 4-byte floats first), and so does a dense ALiBi bias, which undoes
# part of ALiBi's point: kernels that know the pattern compute it tile by tile instead
# (FlashAttention's `alibi_slopes`, FlexAttention's `score_mod`).
# `python -m mha_lib.bench --mask halves` (or `--mask alibi`) measures it at every length, and
# `--dropout 0.1` or `--mask float-grad` what the fallback costs. On a GPU the kernels and their
# limits differ; `grad_fn` tells you which one ran.

# %% [markdown]
# ## 7. How flash attention avoids the `L × L` matrix
#
# Flash attention splits Q into blocks of rows and K, V into blocks of rows too. For each pair
# of blocks it computes a small tile of scores, uses it at once, and throws it away. The full
# `L × L` matrix never exists, in any memory. The catch is the softmax, which divides by a
# sum over **all** keys, a sum that is not known until the last block has been seen. The
# answer is the **online softmax** (Milakov & Gimelshein 2018): for every query keep a running
# maximum `m` of the scores seen so far and a running sum `l` of `exp(score − m)`, and a third
# running quantity, the output `o`, the weighted sum of the values. When a new block raises
# the maximum from `m` to `m'`, everything summed so far is rescaled by `exp(m − m')`. Only
# `L × d` numbers are stored, plus `m` and `l` (the backward pass recomputes the tiles instead
# of storing them).
#
# The two FlashAttention papers nest the loops differently. The first (Dao et al., 2022) keeps
# a block of K and V on chip while the query blocks stream past, so every query block's `o`,
# `m` and `l` travel to and from main memory once per block of keys; and it keeps `o`
# normalised, dividing by the running `l` after every block. FlashAttention-2 (Dao, 2023), the
# order drawn below, swaps the loops: one block of queries stays on chip while the blocks of K
# and V stream past, so its `o`, `m` and `l` never leave the chip until they are finished, and
# different query blocks share nothing, so each can run on its own part of the GPU (more
# parallel work for long sequences with a small batch). It also **defers the division**: `o`
# holds weights not yet divided by `l` (as in Rabe & Staats, 2021), and `o / l` once at the
# end is exactly softmax-weighted attention, which saves the divisions of every block (slow
# operations next to a GPU's matrix units). The picture shows one block of queries meeting
# the third block of keys and values.

# %%
fig, ax = plt.subplots(figsize=(11, 5.2))
n_blocks, size = 4, 1.0  # 4 blocks of queries, 4 blocks of keys/values
grid_x, grid_y = 2.0, 1.0  # lower-left corner of the L x L score grid
row, col = 1, 2  # the tile being computed: query block 1, key block 2 (from the top, from the left)

def tile(x0, y0, w, h, color, text="", alpha=1.0, **kw):
    ax.add_patch(Rectangle((x0, y0), w, h, facecolor=color, edgecolor="black", alpha=alpha, lw=1, **kw))
    if text:
        ax.text(x0 + w / 2, y0 + h / 2, text, ha="center", va="center", fontsize=10)

for i in range(n_blocks):  # Q blocks down the left side, K and V blocks along the top
    top = grid_y + (n_blocks - 1 - i) * size
    tile(0.3, top, 0.6, size, "tab:orange" if i == row else "moccasin", f"Q{i + 1}")
    tile(grid_x + i * size, grid_y + n_blocks * size + 0.15, size, 0.45, "tab:blue" if i == col else "lightsteelblue", f"K{i + 1}")
    tile(grid_x + i * size, grid_y + n_blocks * size + 0.65, size, 0.45, "tab:green" if i == col else "honeydew", f"V{i + 1}")
    for j in range(n_blocks):  # the L x L grid: never stored
        done = i == row and j < col
        tile(grid_x + j * size, top, size, size, "lightgrey" if done else "white", alpha=0.8, ls="--")
tile(grid_x + col * size, grid_y + (n_blocks - 1 - row) * size, size, size, "tab:red", alpha=0.85)
ax.text(grid_x + n_blocks * size / 2, grid_y - 0.75, "L × L scores: one tile at a time, on chip, never stored",
        ha="center", fontsize=10)
ax.text(grid_x + 0.5 * size, grid_y + (n_blocks - 1 - row) * size + 0.5, "used,\ndropped", ha="center",
        va="center", fontsize=8, color="dimgrey")
y_row = grid_y + (n_blocks - 0.5 - row) * size
ax.text(grid_x + (col + 0.5) * size, y_row, "S =\nQ2 K3ᵀ/√d", ha="center", va="center", fontsize=8.5)
ax.add_patch(FancyArrowPatch((grid_x + 0.1, grid_y - 0.2), (grid_x + n_blocks * size - 0.1, grid_y - 0.2),
                             arrowstyle="->", mutation_scale=14, color="black"))
ax.text(grid_x + n_blocks * size / 2, grid_y - 0.3, "K, V blocks stream past each Q block, left to right",
        ha="center", va="top", fontsize=8.5)
ax.text(0.6, grid_y - 0.2, "Q2 stays\non chip", ha="center", va="top", fontsize=8.5, color="tab:orange")

state_x = grid_x + n_blocks * size + 0.5
ax.add_patch(FancyArrowPatch((grid_x + n_blocks * size + 0.05, y_row), (state_x - 0.05, y_row),
                             arrowstyle="->", mutation_scale=14, color="tab:red"))
ax.text(state_x, y_row + 1.55, "running state of each query in Q2", fontsize=10, weight="bold")
updates = [
    ("m' = max(m, rowmax(S))", "running max"),
    ("l  = exp(m - m')·l + rowsum(exp(S - m'))", "running sum"),
    ("o  = exp(m - m')·o + exp(S - m') @ V3", "running output"),
    ("m  = m'", ""),
    ("after the last block:  output = o / l", ""),
]
for n, (formula, note) in enumerate(updates):
    ax.text(state_x, y_row + 1.05 - 0.45 * n, f"{formula:<41} {note}", fontsize=9.5, family="monospace")
ax.set(xlim=(0, 12.6), ylim=(0, grid_y + n_blocks * size + 1.25), aspect="equal")
ax.axis("off")
ax.set_title("Flash attention: tiles of scores and an online softmax")
plt.show()

# %% [markdown]
# **Why it is faster, not only smaller: bytes moved.** A GPU computes far faster than it reads
# its main memory (HBM), so the explicit computation's speed is set by the bytes that travel
# between HBM and the small on-chip memory (SRAM), which is the FlashAttention paper's point.
# The explicit computation writes the `L × L` scores to HBM, reads them for the softmax, writes
# the weights, and reads them again for `weights @ V`. Flash attention reads Q once, and K and
# V once per block of queries. Both do the same arithmetic: `Q Kᵀ` and `weights @ V` are
# `2 · L² · d` floating-point operations each (a multiply and an add per term), `4 · L² · d`
# in all. For one head of one layer, in float16, on an A100 (2.0 TB/s; 312 TFLOP/s in its
# float16 matrix units):

# %%
L_io, d_io, block_rows, bytes_per = 4096, 64, 128, 2  # length, head size, queries per block, float16
matrix = L_io * L_io * bytes_per  # one L x L tensor
vectors = L_io * d_io * bytes_per  # one of Q, K, V, O
explicit = 4 * vectors + 4 * matrix  # Q, K, V, O once; scores written and read; weights written and read
flash = 2 * vectors + 2 * vectors * (L_io // block_rows)  # Q, O once; K and V once per query block
flops = 4 * L_io * L_io * d_io  # Q Kᵀ and weights @ V, 2 L² d each, the same for both
compute_us = flops / 312e12 * 1e6
print(f"{'':8s} {'MiB moved':>9s} {'µs at 2.0 TB/s':>15s} {'GFLOP':>6s} {'µs at 312 TFLOP/s':>18s}")
for name, moved in (("explicit", explicit), ("flash", flash)):
    print(f"{name:8s} {moved / 2**20:9.1f} {moved / 2.0e12 * 1e6:15.1f} {flops / 1e9:6.2f} {compute_us:18.1f}")
print(f"flash moves {explicit / flash:.1f}x fewer bytes, and stores no L x L tensor at all")
assert explicit / flash > 3 and explicit / 2.0e12 * 1e6 > 4 * compute_us  # explicit: memory-bound
assert 0.5 < (flash / 2.0e12 * 1e6) / compute_us < 2  # flash: bytes and arithmetic take about as long

# %% [markdown]
# The explicit computation spends about five times longer moving bytes than computing: it is
# memory-bound. Flash attention's bytes (17 µs) and its arithmetic (14 µs) now take about as
# long, so it is no longer purely memory-bound: FlashAttention-2's gains over the first version
# came from doing the arithmetic better (fewer non-matrix operations, more parallel work),
# reaching 50 to 73 % of the A100's theoretical peak FLOP rate, by the paper's measurements.

# %% [markdown]
# ### The online softmax in a few lines
#
# Here it is for one query, reading 12 keys and values in blocks of 4, next to the plain
# version that builds all 12 weights first. We sort the keys by score, so that every new block
# raises the maximum: the case where the rescaling matters. The printout follows the running
# max and sum. The sum can shrink: when the max jumps, the terms summed so far are rescaled by
# `exp(m − m')`, a factor below 1, because they are now measured against the larger max.

# %%
def online_attention(q, k, v, block=4):
    """softmax(k q / √d) @ v for one query q (d,), reading k (L, d) and v (L, d_v) block by block."""
    m = torch.tensor(float("-inf"))  # running max of the scores seen so far
    l = torch.tensor(0.0)            # running sum of exp(score - m)
    o = torch.zeros(v.size(-1))      # running sum of exp(score - m) * value
    for start in range(0, k.size(0), block):
        s = k[start:start + block] @ q / math.sqrt(q.size(-1))  # (block,) scores of this block only
        m_new = torch.maximum(m, s.max())
        rescale = torch.exp(m - m_new)  # the old terms were computed against the old max
        p = torch.exp(s - m_new)        # (block,)
        l = rescale * l + p.sum()
        o = rescale * o + p @ v[start:start + block]
        m = m_new
        print(f"keys {start:2d}-{start + block - 1:2d}: max so far {m.item():6.3f}, sum so far {l.item():6.3f}")
    return o / l


q1, k12, v12 = torch.randn(8), 2 * torch.randn(12, 8), torch.randn(12, 3)
k12 = k12[(k12 @ q1).argsort()]  # keys in increasing order of score
online = online_attention(q1, k12, v12)
plain = torch.softmax(k12 @ q1 / math.sqrt(8), dim=-1) @ v12
assert torch.allclose(online, plain, atol=1e-6)
print("online:", online)
print("plain: ", plain)
print("equal (within 1e-6):", torch.allclose(online, plain, atol=1e-6))

# %% [markdown]
# ### Skipping the tiles a mask blocks
#
# A causal mask blocks every score above the diagonal, almost half of them. Computing such a
# score and then blocking it is wasted work, and a kernel that works tile by tile can avoid it:
# before it computes a tile, it asks whether the mask leaves any score of that tile. A tile
# above the diagonal has none and is **skipped**: no `Q Kᵀ`, no `exp`, no `@ V`. A tile below
# the diagonal has no blocked score and is computed without the mask; only the tiles that the
# diagonal cuts need it. (FlashAttention's causal loop stops at the diagonal.) The same holds for
# any mask that blocks whole tiles, such as chapter 12's, which shows head 0 only the first half
# of the keys and head 1 only the second half.
#
# `mha_lib.efficient.blockwise_attention(q, k, v, mask, causal=..., block=128)` is the online
# softmax above, for a whole block of queries at once and in FlashAttention-2's order, with this
# test before every tile. It returns the output and the tiles it computed and skipped;
# `skip=False` computes every tile (the blocked ones masked to `−∞`), the baseline. Both give
# PyTorch's numbers:

# %%
from mha_lib.efficient import blockwise_attention

L_tiles, block = 1024, 128
q_t, k_t, v_t = (torch.randn(1, 2, L_tiles, 64).to(device) for _ in range(3))  # (B, H, L, d_k): 2 heads
first = torch.arange(L_tiles) < L_tiles // 2  # (L,): the keys of the first half
halves = torch.stack([first, ~first])[:, None, :].expand(2, L_tiles, L_tiles).to(device)  # (H, L, L)
runs = {  # blockwise_attention's arguments, F.scaled_dot_product_attention's
    "causal": (dict(causal=True), dict(is_causal=True)),
    "halves": (dict(mask=halves), dict(attn_mask=halves)),
}
tile_counts = {}
threads = torch.get_num_threads()
torch.set_num_threads(1)  # small operations, one per tile: see below
for name, (ours, theirs) in runs.items():
    expected = F.scaled_dot_product_attention(q_t, k_t, v_t, **theirs)  # (1, 2, L, d_k)
    for skip in (False, True):
        out, tiles = blockwise_attention(q_t, k_t, v_t, block=block, skip=skip, **ours)
        assert torch.allclose(out, expected, atol=1e-5)
        tile_counts[name, skip] = tiles
        print(f"{name}, {'skipping  ' if skip else 'every tile'}: {tiles.computed:3d} tiles computed "
              f"({tiles.masked:3d} of them with the mask), {tiles.skipped:2d} skipped, of 2 x 64")
torch.set_num_threads(threads)
print("every output == F.scaled_dot_product_attention's (within 1e-5)")
assert tile_counts["causal", True] == (2 * 36, 2 * 28, 2 * 8)  # per head: 36 of 64, 8 of them on the diagonal
assert tile_counts["halves", True] == (2 * 32, 2 * 32, 0)  # per head: its half, 32 of 64, none masked

# %% [markdown]
# Per head, a causal mask leaves 36 of the 64 tiles of `L = 1024` in tiles of 128 (the 8 on the
# diagonal, cut by it, and the 28 below it) and the halves mask 32: the kernel does 56 % and
# 50 % of the work, and needs the mask in only 8 tiles, or none. Drawn from the masks themselves,
# for one head of each:

# %%
def tile_kinds(mask):
    """(nq, nk) for an (L, L) bool mask: 0 = skipped, 1 = computed with the mask, 2 = without it."""
    tiles = mask.reshape(L_tiles // block, block, L_tiles // block, block).transpose(1, 2)  # (nq, nk, block, block)
    some, every = tiles.any(dim=(-2, -1)), tiles.all(dim=(-2, -1))
    return some.int() + every.int()


kinds = {"causal": tile_kinds(causal_mask(L_tiles)), "halves, head 0": tile_kinds(halves[0].cpu()),
         "halves, head 1": tile_kinds(halves[1].cpu())}
assert sum((k > 0).sum().item() for k in kinds.values()) == 36 + 2 * 32  # the tiles blockwise_attention computed
fig, axes = plt.subplots(1, 3, figsize=(9, 3.2), layout="constrained")
colors = plt.matplotlib.colors.ListedColormap(["white", "tab:orange", "tab:blue"])
for ax, (name, kind) in zip(axes, kinds.items()):
    ax.imshow(kind, cmap=colors, vmin=0, vmax=2)
    ax.set_xticks(range(0, 8, 2), [str(block * j) for j in range(0, 8, 2)])
    ax.set_yticks(range(0, 8, 2), [str(block * i) for i in range(0, 8, 2)])
    ax.set_xticks([j - 0.5 for j in range(1, 8)], minor=True)
    ax.set_yticks([i - 0.5 for i in range(1, 8)], minor=True)
    ax.grid(which="minor", color="lightgrey")
    ax.set(title=f"{name}: {(kind > 0).sum().item()} of 64", xlabel="first key of the tile")
axes[0].set_ylabel("first query of the tile")
fig.suptitle("Tiles of 128 × 128 at L = 1024: blue computed, orange computed with the mask, white skipped")
plt.show()

# %% [markdown]
# Skipping half of the tiles should save about half of the time. Measured on one thread (each
# tile is a small computation, and on a shared CPU two threads per small operation spend much
# of their time waiting for each other), the fastest of 3 round-robin repetitions. The assert
# checks the ratio, with a margin that skipping nothing would fail, and only when the machine
# is not busy:

# %%
# NBVAL_IGNORE_OUTPUT
# (times vary by machine; the assert checks the ratio on a CPU that is not busy)
torch.set_num_threads(1)
tile_steps = {(name, skip): (lambda ours=ours, skip=skip: blockwise_attention(q_t, k_t, v_t, block=block, skip=skip, **ours))
              for name, (ours, _) in runs.items() for skip in (False, True)}
tile_times = bench.time_steps(tile_steps, device, repeats=3, warmup=1, min_time=0.0)  # seconds, round robin
torch.set_num_threads(threads)
tile_ratios = {}
for name in runs:
    every, skipping = min(tile_times[name, False]), min(tile_times[name, True])
    tile_ratios[name] = skipping / every
    share = tile_counts[name, True].computed / tile_counts[name, False].computed
    print(f"{name}: every tile {1e3 * every:4.0f} ms, skipping {1e3 * skipping:4.0f} ms: "
          f"{tile_ratios[name]:.2f} of the time for {share:.2f} of the tiles")
if device.type == "cpu" and load_is_low():
    assert all(ratio < 0.8 for ratio in tile_ratios.values()), tile_ratios  # skipping nothing: about 1

# %% [markdown]
# The time follows the tiles: at `L = 1024`, on one thread of our 2-core CPU while other
# programs kept it busy, skipping took 0.41 and 0.52 of the time in two runs for the causal mask
# (for 0.56 of the tiles), and 0.48 and 0.57 for the halves mask (for 0.50).
#
# PyTorch's FlexAttention (`torch.nn.attention.flex_attention`) is built on the same test. You
# describe the mask as a function of the positions, `mask_mod(b, h, q_idx, kv_idx)`;
# `create_block_mask` evaluates it at every position once, before any attention runs, and keeps,
# for every block of 128 queries, the tiles of 128 keys to compute: `kv_num_blocks` counts those
# that need the mask and `full_kv_num_blocks` those that need none. Its picture and its counts
# are ours:

# %%
from torch.nn.attention.flex_attention import create_block_mask

flex_masks = {
    "causal": create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, B=None, H=None,
                                Q_LEN=L_tiles, KV_LEN=L_tiles, device=device),
    "halves": create_block_mask(lambda b, h, q_idx, kv_idx: (kv_idx < L_tiles // 2) == (h % 2 == 0), B=None, H=2,
                                Q_LEN=L_tiles, KV_LEN=L_tiles, device=device),
}
print(flex_masks["causal"])
for name, block_mask in flex_masks.items():
    with_mask, without = block_mask.kv_num_blocks.sum().item(), block_mask.full_kv_num_blocks.sum().item()
    heads = 1 if name == "causal" else 2  # H=None: one block mask that every head shares
    print(f"{name}: {with_mask + without} tiles to compute ({with_mask} with the mask) of {heads} x 64")
    ours, per_ours = tile_counts[name, True], 2 // heads  # ours counted both heads
    assert (per_ours * (with_mask + without), per_ours * with_mask) == (ours.computed, ours.masked)

# %% [markdown]
# Compiled, `torch.compile(flex_attention)(q, k, v, block_mask=...)` runs a fused kernel that
# skips exactly these tiles. This chapter does not compile it: on our 2-core CPU, with other
# programs running (a load average of about 10), compiling took 17 to 59 s, more than the whole
# chapter may take. Compiled, at `L = 1024` with 2 heads of 64 (the fastest of 5 calls, three
# rounds), it took 133 to 143 ms with the causal block mask and 230 to 244 ms computing every
# tile with the same causal mask applied inside each (a `score_mod` of `−∞` above the
# diagonal): 0.58 of the time. Uncompiled, `flex_attention` warns that it computes the whole
# `L × L` matrix, skipping nothing.

# %% [markdown]
# ## 8. A query that may attend to nothing
#
# Chapter 04 showed that a query whose keys are all masked gives `softmax(−∞, …, −∞) = 0/0`,
# and that `mha_lib` returns zero weights and a zero output for it instead of NaN. In an online
# softmax the same row fails one step earlier: its running max stays `−∞`, and the rescale
# factor `exp(m − m') = exp(−∞ − (−∞))` is already NaN.

# %%
minus_inf = torch.tensor(float("-inf"))
print("exp(-inf - (-inf)) =", torch.exp(minus_inf - minus_inf).item())

# %% [markdown]
# PyTorch 2.13's kernels return zeros for such rows on the CPU, but fused GPU kernels have
# returned NaN for them in some versions (pytorch/pytorch issue #110213). So
# `EfficientMultiHeadAttention` does not rely on it: it opens such rows for the kernel and sets
# their output to zero afterwards. Its output there is then `W_o`'s bias, as for the teaching
# module:

# %%
blocked = torch.ones(7, 12, dtype=torch.bool, device=device)
blocked[2] = False  # query 2 may attend to no key
with torch.no_grad():
    out_efficient = efficient(query, memory, memory, blocked)
    out_teaching = mha(query, memory, memory, blocked)
assert torch.isfinite(out_efficient).all() and torch.allclose(out_efficient, out_teaching, atol=1e-5)
assert torch.allclose(out_efficient[:, 2], efficient.W_o.bias.expand(4, -1), atol=1e-6)
print("no NaN; the blocked query's output is W_o's bias; efficient == teaching")

# %% [markdown]
# ## 9. The benchmark: `python -m mha_lib.bench`
#
# The measurements of section 6, at full scale and for four implementations, are one command
# away. From the course's folder, with the virtual environment active (or `.venv/bin/python`):
#
# ```bash
# python -m mha_lib.bench --quick                  # 128, 256, 512 tokens; under a minute on a CPU
# python -m mha_lib.bench --plot bench.png         # 128 … 4096 tokens, and a plot
# python -m mha_lib.bench --batch 32 --lengths 100 --repeats 21   # the book's configuration
# python -m mha_lib.bench --help                   # --device, --dtype, --d-model, --heads, ...
# ```
#
# It compares the teaching module, the efficient one, and `nn.MultiheadAttention` with
# `need_weights=True` (its default, which returns the weights averaged over the heads) and
# `need_weights=False`, the baseline of every ratio. It times an inference forward pass and a
# training step, and reports the peak memory of each. Things to look for in your table:
#
# - **memory**: the variants that store weights grow like `L²`, the fused ones like `L` (add
#   `--dropout 0.1` or `--mask float-grad` to see the CPU's fallback grow like `L²` too). On a
#   2-core CPU (shared with other work), a training step at `L = 4096` (`B = 1`) took
#   1,585 MiB with the teaching module and 75 MiB with the efficient one: under 5 %.
# - **time**: at the book's configuration (`B = 32, L = 100, d_model = 512`, not the small
#   model of section 6), the third command above measured a training step of the efficient
#   module at 0.88 to 0.90 × the time of `nn.MultiheadAttention(need_weights=False)` (the
#   median of 21 repetitions, on an idle 2-core CPU). On the same CPU under load from other
#   programs, the median ratio ranged from 0.70 to 0.85. `nn.MultiheadAttention` copies its
#   projections into a new layout before attending; most of the time goes into the
#   projections' matrix products, which both do alike.
# - **`need_weights=True` costs memory**: PyTorch must then materialise the weights, like the
#   teaching module.
# - **The fast path**: in inference (`eval()` and no gradients), `nn.MultiheadAttention` takes
#   a "fast path" of its own, even with `need_weights=False`; on the CPU it stored the
#   `L × L` scores in our runs.
#
# Run it on your machine: numbers depend on the hardware, and on a GPU the gaps get larger.
#
# ## Recap
#
# - The teaching module pays for readability twice: three projections instead of one, and a
#   stored `(B, H, L, L)` weight tensor that grows with `L²`.
# - **Fused projections**: stacking `W_q, W_k, W_v` into `W_qkv` (`(3·d_model, d_model)`)
#   computes Q, K and V in one matrix product; `split`, `view` and `transpose` are free views.
#   Same maths, same numbers up to rounding. Cross-attention uses slices of the same weight.
# - **Fused attention**: `F.scaled_dot_product_attention` returns the output only and picks a
#   kernel per device (flash or memory-efficient on GPUs, a flash-attention-style kernel on
#   the CPU).
#   Its boolean masks mean True = may attend, like the course's.
# - One copy of the weights for `B = 1, H = 8` in float32 is 32 MiB at 1k tokens, 512 MiB at
#   4k and 8 GiB at 16k; measured, the teaching module's memory grows like `L²`, the fused
#   kernel's like `L`. On the CPU the fused function falls back to a kernel that stores the
#   weights for a mask of three dimensions, dropout while training, and a float mask that
#   requires grad; the module passes a per-head `(H, L, L)` mask or bias as `(1, H, L, L)`,
#   which the fused kernel takes (at `L = 1024`, less than half the memory of the math kernel).
# - Flash attention's bytes and arithmetic take about as long on an A100 (17 and 14 µs at
#   `L = 4096`): the explicit computation is memory-bound, flash attention no longer purely.
# - Flash attention computes the scores tile by tile, on chip, and never stores them; the
#   online softmax (a running max, a running sum, a rescaled running output) makes that exact.
#   FlashAttention-2 keeps a block of queries on chip while keys and values stream past, and
#   divides by the running sum once, at the end.
# - A tile that the mask blocks entirely need not be computed: at `L = 1024` in tiles of 128 a
#   causal mask leaves 36 of 64 tiles per head, chapter 12's halves mask 32;
#   `mha_lib.efficient.blockwise_attention` counts them and skips them, FlexAttention's
#   `create_block_mask` finds the same tiles.
# - `mha_lib.EfficientMultiHeadAttention` puts both ideas together: the teaching module's
#   contract and outputs (checked here), its weights via `from_module`, weights on request by
#   the explicit path, and zero output for queries that may attend to nothing.
# - `python -m mha_lib.bench` measures time and memory honestly: warm-up, repetitions in
#   round robin, medians, peak memory per step (on the CPU, the peak resident memory of a
#   separate process).
#
# ## Exercises
#
# Practise what this chapter built in `exercises/10_efficient_attention.ipynb`; each exercise
# checks itself and tells you what is wrong. See the README for how to start your own copy.
#
# ## What comes next
#
# **Chapter 11** runs attention the way a
# language model generates text, one token at a time, with a cache of keys and values, and shows
# how fewer key/value heads and sliding windows keep that cache small. **Chapter 12**, the
# course's last, takes up the challenge at the end of Priyesh Dave's post: restrict head 0 to the
# first half of the sequence and head 1 to the second half.
