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
# # Chapter 11 · Attention at inference: the key/value cache, shared heads, sliding windows, latent attention
#
# A language model writes one token at a time. To pick token `t + 1` it runs its layers over
# everything written so far, then appends the new token and does it again. Run naively, every
# step repeats all the work of the step before. This chapter shows the trick every model uses to
# avoid that, the **key/value cache**, what it costs in memory and in bytes read per step, and
# two changes to multi-head attention that keep it small: **fewer key/value heads** (multi-query
# and grouped-query attention, in most of today's models) and **sliding windows** (Mistral 7B;
# Gemma 2 and 3 in some of their layers), kept working on long texts by **attention sinks**, the
# first tokens held in the cache (StreamingLLM; gpt-oss instead learns one extra "sink" logit per
# head); section 6 names the others, and section 7 builds one of them,
# DeepSeek-V2's **multi-head latent attention**, which caches one small vector per token and
# rebuilds every head's keys and values from it.
#
# **By the end of this chapter you will be able to**
#
# - say why decoding without a cache recomputes every key and value at every step, and count
#   the work it wastes;
# - decode with `mha_lib.KVCache`, token by token or in chunks, and prove that it equals the
#   full causal forward pass, with and without rotary positions; measure why it appends in
#   place instead of with `torch.cat`;
# - compute the cache's memory for the book's `512 × 8` configuration and for a 7B-class model,
#   and measure it with `cache.nbytes`;
# - use `num_kv_heads` for multi-query (MQA) and grouped-query attention (GQA), say which query
#   heads share which key/value head, and how much memory that saves;
# - build a sliding-window mask with `mha_lib.sliding_window_mask`, decode with it, and show
#   that the cache then never needs more than the window, keeping attention sinks if asked;
# - compute the bytes a decoding step reads, and say why sharing key/value heads makes it faster;
# - decode with `mha_lib.MultiHeadLatentAttention`, which caches a small latent instead of keys and
#   values, fold its up-projections into the queries and the output projection, and say why plain
#   RoPE prevents that fold and what DeepSeek-V2 does instead.
#
# *Sources.* N. Shazeer, "Fast Transformer Decoding: One Write-Head is All You Need" (2019),
# multi-query attention. J. Ainslie et al., "GQA: Training Generalized Multi-Query Transformer
# Models from Multi-Head Checkpoints" (2023). I. Beltagy et al., "Longformer: The
# Long-Document Transformer" (2020), local attention; A. Jiang et al., "Mistral 7B" (2023), the
# causal sliding window and its rolling cache. G. Xiao et al., "Efficient Streaming Language
# Models with Attention Sinks" (2024). DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient
# Mixture-of-Experts Language Model" (2024, arXiv:2405.04434), multi-head latent attention (MLA) and
# its decoupled RoPE, section 2.1. The 7B-class configuration (32 layers, 32 heads of 128) is LLaMA-2-7B's
# (H. Touvron et al., "Llama 2", 2023).

# %% [markdown]
# ## Set-up

# %%
import copy
import itertools
import os
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from mha_lib import (KVCache, LatentCache, MultiHeadAttention, MultiHeadLatentAttention, apply_rotary, causal_mask,
                     combine_heads, get_device, kv_cache_bytes, latent_cache_bytes, plot_attention, repeat_kv,
                     seed_everything, sliding_window_mask, split_heads)
from mha_lib.bench.decode import decode_benchmark, format_result

# %config InlineBackend.figure_formats = ["retina"]  # figures at twice the pixels: sharp on any screen and in the web book
device = get_device()
seed_everything(0)
torch.set_printoptions(precision=3, sci_mode=False)
print("Running on:", device.type)

# %% [markdown]
# ## 1. Decoding without a cache repeats itself
#
# A decoder's self-attention is causal: the output at position `t` depends on tokens `0 .. t`
# only. To generate, the model needs the output at the newest position, then the next one, and
# so on. Without a cache, step `t` runs the whole prefix again with `causal_mask(t + 1)` and
# keeps its last row. (We feed fixed random vectors instead of generated tokens: the attention
# layer's work is the same whatever the tokens are.)

# %%
d_model, H, L = 64, 8, 10
mha = MultiHeadAttention(d_model, H).to(device).eval()
x = torch.randn(1, L, d_model).to(device)  # (B, L, d_model): the tokens, as embeddings

with torch.no_grad():
    full = mha(x, x, x, mask=causal_mask(L, device=device))  # (1, L, d_model), all positions at once
    steps = [mha(x[:, : t + 1], x[:, : t + 1], x[:, : t + 1], mask=causal_mask(t + 1, device=device))[:, -1:]
             for t in range(L)]  # step t: the prefix 0..t again, keep the last output
recomputed = torch.cat(steps, dim=1)  # (1, L, d_model)
assert torch.allclose(recomputed, full, atol=1e-5)
print("token by token, recomputing the prefix == one causal forward (within 1e-5):", True)

# %% [markdown]
# Step `t` projects `t + 1` tokens into queries, keys and values, although only the newest one
# is new: the keys and values of tokens `0 .. t - 1` are exactly those of the step before. In
# this one layer that is plain (a key depends on its own token only); in a stack of layers it
# holds because the causal mask keeps every layer's output at position `j` from depending on
# later tokens, so the next layer's inputs at `j` never change either. Over `L` steps the layer
# projects `1 + 2 + … + L = L(L+1)/2` tokens instead of `L`, and computes `1² + 2² + … + L²`
# scores instead of `1 + 2 + … + L`.

# %%
print(f"{'tokens L':>8} {'projections, recompute':>23} {'with a cache':>13} {'scores, recompute':>18} {'with a cache':>13}")
for n in (10, 256, 4096):
    print(f"{n:8d} {n * (n + 1) // 2:23,d} {n:13,d} {n * (n + 1) * (2 * n + 1) // 6:18,d} {n * (n + 1) // 2:13,d}")

# %% [markdown]
# ## 2. The key/value cache
#
# So keep them. A **key/value cache** stores, for every attention layer, the keys and values of
# the tokens seen so far. Each step projects only the new token, appends its key and value, and
# lets its query attend to everything in the cache. `mha_lib.KVCache` is one layer's cache;
# pass it to the module as `cache=`, with the same tensor (the new tokens) as query, key and
# value. One token at a time gives exactly the causal forward pass:

# %%
def decode_step(layer, new, cache, mask=None):
    """New tokens (B, n, d_model) attend to the cached ones and causally to each other."""
    return layer(new, new, new, cache=cache, mask=mask)  # (B, n, d_model); the cache grows by n


cache = KVCache()
with torch.no_grad():
    outputs = [decode_step(mha, x[:, t : t + 1], cache) for t in range(L)]  # (1, 1, D) each
decoded = torch.cat(outputs, dim=1)  # (1, L, d_model)
assert torch.allclose(decoded, full, atol=1e-5)
print("one token per step, with a cache == one causal forward (within 1e-5):", True)
print("cache:", len(cache), "positions;  keys", tuple(cache.keys.shape), " values", tuple(cache.values.shape),
      " (B, H, T, d_k)")

# %% [markdown]
# The new token needs no mask: it may see every cached position and itself, which is all there
# is. A **chunk** of `n` new tokens at once (a prompt, say) needs one: new token `r` sits at
# position `T + r` and may see keys `0 .. T + r`, so the mask over the `T + n` keys is a lower
# triangle shifted right by `T`. Here `T = 3` cached tokens and a chunk of `n = 2`:

# %%
T_demo, n_demo = 3, 2
chunk_mask = torch.ones(n_demo, T_demo + n_demo, dtype=torch.bool).tril(diagonal=T_demo)  # (n, T + n)
print(chunk_mask.int())

# %% [markdown]
# The module builds that mask itself. A prompt of 6 tokens in one chunk, then one token at a
# time: the same numbers again. With rotary positions (chapter 06) the new tokens are rotated by
# their true positions `T .. T + n - 1`, which the module reads from the cache's length; the keys
# in the cache are stored already rotated, so nothing is rotated twice.

# %%
for rotary in (False, True):
    layer = MultiHeadAttention(d_model, H, rotary=rotary).to(device).eval()
    cache = KVCache()
    with torch.no_grad():
        reference = layer(x, x, x, mask=causal_mask(L, device=device))
        prompt = decode_step(layer, x[:, :6], cache)  # (1, 6, D): one chunk
        rest = [decode_step(layer, x[:, t : t + 1], cache) for t in range(6, L)]
    same = torch.allclose(torch.cat([prompt, *rest], dim=1), reference, atol=1e-5)
    assert same
    print(f"rotary={rotary!s:5}: a chunk of 6, then 4 single tokens == one causal forward (within 1e-5):", same)

# %% [markdown]
# How much faster? `mha_lib.bench.decode` times both ways on one layer of the book's size
# (`d_model = 512`, 8 heads, batch 1; chapter 10's `EfficientMultiHeadAttention`, which takes
# `cache=` too) and checks that they agree. The notebook decodes 48 tokens
# to stay quick. `python -m mha_lib.bench decode --threads 1` decodes 256 and reports the fastest
# of three runs of each way. On this course's 2 shared CPU cores, one thread measured the cache 13× to 24×
# faster, depending on the load, and two threads 4.5× to 17×: a cached step is a dozen tiny
# operations whose time is mostly overhead. Run the command for your machine's numbers. What
# holds everywhere is the trend: the longer the text, the larger the gap, since recomputing
# grows like `L²` in projections and the cache like `L`. (Its last lines preview section 4: a
# layer with 2 key/value heads instead of 8 caches a quarter as much.)

# %%
# NBVAL_IGNORE_OUTPUT
# (timings vary from run to run and machine to machine; the asserts hold everywhere: the two ways agree,
# and even at 48 tokens the cache is faster)
# The two ways are timed in turns, 5 times each, so load from other programs slows both alike.
result = decode_benchmark(tokens=48, d_model=512, num_heads=8, kv_heads=2, repeats=5, device=device)
print(format_result(result))
assert result.max_abs_diff < 1e-4, f"the two ways disagree by {result.max_abs_diff:.1e}"
assert result.cache_s < result.recompute_s, f"cache {result.cache_s:.4f} s, recompute {result.recompute_s:.4f} s"

# %% [markdown]
# **Appending in constant time.** A cache must also grow cheaply. Appending with
# `torch.cat([keys, new], dim=-2)` copies the whole cache into a new tensor one position longer
# at every step, so a step's own cost grows with `T`, and `T` steps copy `T² / 2` positions.
# `KVCache` keeps buffers with room to spare, writes each new key and value in place, and only
# when a buffer is full replaces it by one twice as large: one copy, spread over the `T` appends
# before it (`KVCache(capacity=n)` reserves `n` positions from the start). `cache.keys` is a
# view of the positions in use. Measured: one token appended to a cache that holds 256 or 4096
# positions (batch 1, 8 heads of 64, float32), and a whole decoding step of the book's layer at
# those lengths, with `KVCache` and with a cache that appends by `torch.cat`, as `KVCache` did
# until this version (the fastest of 3 runs of 8 steps each). With one thread on this course's 2
# shared cores (the fastest of 40 runs of 64 appends), one append to 4096 positions took 0.98
# times as long as one to 256 with `KVCache`, and 22.6 times as long with `torch.cat`. A whole
# decoding step grows with `T` either way, since its query attends to every cached key; the
# copy is the share that `KVCache` removes.

# %%
# NBVAL_IGNORE_OUTPUT
# (timings vary with the machine and its load; asserted only when the machine is not busy)
class ConcatCache(KVCache):
    """The cache as it was: every append copies everything into a new tensor one position longer."""

    def _append(self, keys, values):
        if self.keys is not None:
            keys, values = torch.cat([self.keys, keys], dim=-2), torch.cat([self.values, values], dim=-2)
        self.keys, self.values = keys, values
        return keys, values


def seconds_per_step(make_cache, T, step, calls=8, repeats=3):
    """The fastest of `repeats` runs: fill a fresh cache with T positions, then time `calls` steps."""
    best = float("inf")
    for _ in range(repeats):
        cache = make_cache()
        cache.update(torch.randn(1, 8, T, 64).to(device), torch.randn(1, 8, T, 64).to(device))
        start = time.perf_counter()
        for _ in range(calls):
            step(cache)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


k_new, v_new = torch.randn(1, 8, 1, 64).to(device), torch.randn(1, 8, 1, 64).to(device)
decoder = MultiHeadAttention(512, 8).to(device).eval()
x_new = torch.randn(1, 1, 512).to(device)
kinds = {"torch.cat": ConcatCache, "KVCache": lambda: KVCache(capacity=4096 + 8)}
step_kinds = {"append one token": lambda cache: cache.update(k_new, v_new),
              "decoding step": lambda cache: decoder(x_new, x_new, x_new, cache=cache)}
timed = {}
with torch.no_grad():
    for (step_name, step), (kind, make_cache), T in itertools.product(step_kinds.items(), kinds.items(), (256, 4096)):
        timed[step_name, kind, T] = seconds_per_step(make_cache, T, step)
for step_name, kind in itertools.product(step_kinds, kinds):
    short, long = timed[step_name, kind, 256], timed[step_name, kind, 4096]
    print(f"{step_name:16s} {kind:9s}: T = 256 {1e6 * short:7.1f} µs, T = 4096 {1e6 * long:7.1f} µs, "
          f"{long / short:5.2f}x")
with torch.no_grad():  # what load cannot change: between reallocations, the keys stay in one block of memory
    cache = KVCache(capacity=64)
    cache.update(k_new, v_new)
    where = cache.keys.untyped_storage().data_ptr()
    for _ in range(63):
        cache.update(k_new, v_new)
    assert cache.keys.untyped_storage().data_ptr() == where and len(cache) == cache.capacity == 64
load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0  # 1-minute load average (not on Windows)
if device.type == "cpu" and load < (os.cpu_count() or 1):
    assert timed["append one token", "KVCache", 4096] < 1.5 * timed["append one token", "KVCache", 256]
    assert timed["append one token", "torch.cat", 4096] > 3 * timed["append one token", "torch.cat", 256]

# %% [markdown]
# ## 3. What the cache costs in memory
#
# The cache holds two tensors per layer, keys and values, each `(B, H_kv, T, d_k)`, with
# `H_kv = H` key/value heads for now (section 4 lowers it): every
# position, every key/value head, every feature. Per token and per layer that is
# `2 · H_kv · d_k` numbers. For the book's configuration (`d_model = 512`, 8 heads of 64) in
# float32: `2 · 8 · 64 · 4 = 4096` bytes, 4 KiB per token per layer. Measured after 16 tokens:

# %%
book = MultiHeadAttention(512, 8).to(device).eval()
tokens = torch.randn(1, 16, 512).to(device)
cache = KVCache()
with torch.no_grad():
    for t in range(16):
        decode_step(book, tokens[:, t : t + 1], cache)
print(f"measured: {cache.nbytes:,} bytes for {len(cache)} tokens = {cache.nbytes // len(cache):,} bytes per token")
assert cache.nbytes == kv_cache_bytes(num_layers=1, num_kv_heads=8, d_k=64, seq_len=16, bytes_per_element=4)
print("== 2 · 8 heads · 64 · 4 bytes · 16 tokens, the arithmetic")

# %% [markdown]
# A small layer, a small cache. Now a 7B-class model, LLaMA-2-7B's shape: 32 layers, 32 heads of
# `d_k = 128`, in float16 (2 bytes). Per token: `2 · 32 · 32 · 128 · 2 = 524 288` bytes, half a
# mebibyte. A context of 4096 tokens takes 2 GiB for **one** sequence; a server decoding 16
# sequences at once holds 32 GiB of cache, more than twice the model's own weights (7 billion
# parameters in float16, about 13 GiB).

# %%
per_token = kv_cache_bytes(num_layers=32, num_kv_heads=32, d_k=128, seq_len=1)  # float16: 2 bytes
print(f"7B-class, per token:          {per_token:>15,} bytes = {per_token / 2**20:.2f} MiB")
for batch in (1, 16):
    total = kv_cache_bytes(num_layers=32, num_kv_heads=32, d_k=128, seq_len=4096, batch=batch)
    print(f"4096 tokens, batch {batch:2d}:        {total:>15,} bytes = {total / 2**30:.0f} GiB")
print(f"the weights, 7e9 × 2 bytes:    {7e9 * 2:>15,.0f} bytes = {7e9 * 2 / 2**30:.0f} GiB")

# %% [markdown]
# A server holds many sequences of different and growing lengths at once. Reserving each one's
# longest possible cache wastes memory that other sequences could use, and growing by copying,
# as `KVCache` does, scatters free memory into pieces. vLLM's **paged cache** (PagedAttention,
# Kwon et al., 2023) keeps the cache in fixed blocks of a few tokens (16 by default), taken from
# one pool when needed; each sequence has a **block table** that maps position `t` to slot
# `t % 16` of block `table[t // 16]`, like an operating system's page table, and the attention
# kernel follows the table. Memory is then lost only in each sequence's last, partly filled
# block, and sequences with a common prompt can share its blocks. The other lever is the number
# size: a cache **quantised** to 8 bits (FP8 or int8, with a scale per tensor, head or channel)
# takes half the float16 bytes above, 0.25 MiB per token for the 7B-class model, and 2-bit
# schemes such as KIVI (Liu et al., 2024; keys quantised per channel, values per token) an
# eighth, for a small loss of accuracy.

# %% [markdown]
# ## 4. Fewer key/value heads: MQA and GQA
#
# The cache grows with the number of **key/value** heads. Shazeer's **multi-query attention**
# (MQA) keeps all the query heads but gives them one key head and one value head to share;
# Ainslie et al.'s **grouped-query attention** (GQA) sits in between: the `H` query heads form
# `H_kv` groups, and each group shares one key/value head. Mistral 7B has 8 key/value heads for
# its 32 query heads, LLaMA-2-70B 8 for 64. Each query head still draws its own attention map;
# only the keys and values it reads are shared.
#
# In `mha_lib`, `num_kv_heads` sets `H_kv`; `W_k` and `W_v` then produce `H_kv · d_k` features
# instead of `d_model`:

# %%
for kv in (8, 2, 1):
    m = MultiHeadAttention(512, 8, num_kv_heads=kv)
    kind = {8: "MHA", 2: "GQA", 1: "MQA"}[kv]
    params = sum(p.numel() for p in m.parameters())
    print(f"{kind}: num_kv_heads={kv}  W_q {tuple(m.W_q.weight.shape)}  W_k {tuple(m.W_k.weight.shape)}  "
          f"W_v {tuple(m.W_v.weight.shape)}  parameters {params:,}")

# %% [markdown]
# Which query head reads which key/value head? The heads of a group are **consecutive**: with 8
# query heads and 2 key/value heads, heads 0–3 share key/value head 0 and heads 4–7 share head 1.
# `mha_lib.repeat_kv(x, n_rep)` copies each key/value head `n_rep = H // H_kv` times in a row so
# that the usual per-head attention applies; it is the grouping of
# `F.scaled_dot_product_attention(..., enable_gqa=True)` and of Hugging Face's code.

# %%
kv_heads = torch.arange(2.0).view(1, 2, 1, 1)  # (B, H_kv, L, d_k): head h holds the number h
print("key/value head read by query heads 0..7:", repeat_kv(kv_heads, 4).flatten().int().tolist())

# %% [markdown]
# Put differently, GQA is multi-head attention whose heads are forced to share: an ordinary
# 8-head module whose key and value weights repeat the rows of each group computes exactly the
# same function.

# %%
gqa = MultiHeadAttention(d_model, H, num_kv_heads=2).to(device).eval()
plain = MultiHeadAttention(d_model, H).to(device).eval()
d_k, n_rep = d_model // H, H // 2
source_rows = (torch.arange(H) // n_rep)[:, None] * d_k + torch.arange(d_k)  # head h <- kv head h // n_rep
with torch.no_grad():
    for name in ("W_q", "W_o"):
        getattr(plain, name).load_state_dict(getattr(gqa, name).state_dict())
    for name in ("W_k", "W_v"):
        getattr(plain, name).weight.copy_(getattr(gqa, name).weight[source_rows.flatten()])  # (64, 64) from (16, 64)
        getattr(plain, name).bias.copy_(getattr(gqa, name).bias[source_rows.flatten()])
    out_gqa, w_gqa = gqa(x, x, x, return_weights=True)
    out_plain = plain(x, x, x)
assert torch.allclose(out_gqa, out_plain, atol=1e-5)
print("GQA (2 key/value heads) == 8-head MHA with tied key/value heads (within 1e-5)")
print("weights:", tuple(w_gqa.shape), " (B, H, Lq, Lk): still one map per query head")

# %% [markdown]
# And it is the grouping PyTorch itself uses: the same projections, then
# `F.scaled_dot_product_attention(q, k, v, enable_gqa=True)` with 8 query heads and 2 key/value
# heads (PyTorch 2.5 and later, which the course requires), give the module's output.

# %%
with torch.no_grad():
    q_h = split_heads(gqa.W_q(x), H)  # (B, 8, L, d_k)
    k_h, v_h = split_heads(gqa.W_k(x), 2), split_heads(gqa.W_v(x), 2)  # (B, 2, L, d_k) each
    heads = F.scaled_dot_product_attention(q_h, k_h, v_h, enable_gqa=True)  # (B, 8, L, d_k)
    pytorch_gqa = gqa.W_o(combine_heads(heads))  # (B, L, d_model)
assert torch.allclose(pytorch_gqa, out_gqa, atol=1e-5)
print("q:", tuple(q_h.shape), " k, v:", tuple(k_h.shape), " ->", tuple(pytorch_gqa.shape))
print("GQA module == PyTorch's F.scaled_dot_product_attention(enable_gqa=True) (within 1e-5)")

# %% [markdown]
# The cache shrinks to exactly `H_kv / H` of its multi-head size. For the 7B-class model of
# section 3, and measured on the book's layer after 16 tokens (each decoded with a cache and
# checked against the full causal forward):

# %%
print(f"{'':5} {'H_kv':>4} {'7B-class: bytes per token':>26} {'4096 tokens':>12} {'book layer, 16 tokens (measured)':>33}")
measured = {}
for kind, kv in (("MHA", 32), ("GQA", 8), ("MQA", 1)):
    book_kv = {32: 8, 8: 2, 1: 1}[kv]  # the book's layer has 8 query heads: MHA 8, GQA 2, MQA 1
    layer = MultiHeadAttention(512, 8, num_kv_heads=book_kv).to(device).eval()
    cache = KVCache()
    with torch.no_grad():
        steps = [decode_step(layer, tokens[:, t : t + 1], cache) for t in range(16)]
        assert torch.allclose(torch.cat(steps, 1), layer(tokens, tokens, tokens, mask=causal_mask(16, device=device)),
                              atol=1e-4)
    measured[kind] = cache.nbytes
    per = kv_cache_bytes(num_layers=32, num_kv_heads=kv, d_k=128, seq_len=1)
    print(f"{kind:5} {kv:4d} {per:26,d} {per * 4096 / 2**30:9.3f} GiB {cache.nbytes:24,d} bytes (H_kv = {book_kv})")
assert measured["GQA"] * 4 == measured["MHA"] and measured["MQA"] * 8 == measured["MHA"]

# %% [markdown]
# What does sharing cost? Fewer key/value heads means fewer distinct ways to describe each token
# for matching (keys) and fewer distinct contents to pass on (values); every head still asks its
# own question (its query). The model loses some quality, little for GQA, more for MQA. Ainslie
# et al. report GQA with 8 groups close to full multi-head quality at nearly MQA's speed, and
# show that a trained multi-head model can be converted by averaging the key and value heads of
# each group, then trained briefly.

# %% [markdown]
# ## 5. Sliding windows: a cache that stops growing
#
# GQA divides the cache by a constant; it still grows with every token. The other answer limits
# how far back a token may look. In **sliding-window attention** the query at position `i` sees
# only the last `window` keys, `i - window + 1 .. i`: the local attention of Longformer, in the
# causal form Mistral 7B uses with a window of 4096. The window counts the keys a query sees,
# itself included (chapter 12 keeps this convention). `mha_lib.sliding_window_mask(L, window)`
# is True exactly where `0 <= i - j < window`:

# %%
L_plot, window = 10, 4
masks = torch.stack([causal_mask(L_plot), sliding_window_mask(L_plot, window)]).float()  # (2, L, L)
labels = [f"t{i}" for i in range(L_plot)]
fig = plot_attention(masks, labels, head_titles=["causal: all the past", f"sliding window of {window}"],
                     title="Who may attend to whom (rows: queries, columns: keys)", annotate=False)
fig.axes[-1].set_yticks([0, 1])  # the colour bar: a mask has two values only
fig.axes[-1].set_ylabel("1 = may attend, 0 = blocked")
plt.show()

# %% [markdown]
# Decoding with a window: each new token may see only the last `window` positions of the cache.
# Passing the last row of the window mask to the cached forward gives exactly the windowed
# full forward pass:

# %%
win = MultiHeadAttention(d_model, H).to(device).eval()
cache = KVCache()
with torch.no_grad():
    reference = win(x, x, x, mask=sliding_window_mask(L, window, device=device))
    steps = [decode_step(win, x[:, t : t + 1], cache, mask=sliding_window_mask(t + 1, window, device=device)[-1:])
             for t in range(L)]  # the mask: the window's last row, (1, t + 1)
assert torch.allclose(torch.cat(steps, dim=1), reference, atol=1e-5)
print(f"decoding with a window of {window} == the windowed causal forward (within 1e-5)")

# %% [markdown]
# Keys that fall out of the window are never looked at again, so the cache may **forget** them.
# Keep only the last `window - 1` entries before each step (a rolling buffer, as in Mistral), and
# no mask is needed at all: the new token plus what is kept is exactly its window. The cache then
# never holds more than `window` positions, however long the text.

# %%
cache, largest = KVCache(), 0
with torch.no_grad():
    steps = []
    for t in range(L):
        if len(cache) > window - 1:  # forget what left the window
            cache.keys, cache.values = cache.keys[..., -(window - 1):, :], cache.values[..., -(window - 1):, :]
        steps.append(decode_step(win, x[:, t : t + 1], cache))
        largest = max(largest, len(cache))
assert torch.allclose(torch.cat(steps, dim=1), reference, atol=1e-5) and largest == window
print(f"a rolling cache of at most {largest} positions == the windowed forward (within 1e-5)")

# %% [markdown]
# (Without rotary positions the trimmed cache is enough. With RoPE the module reads each new
# token's position from the cache's length, which trimming shortens; a rolling buffer must then
# keep count of the positions itself, as Mistral's does.)
#
# **Attention sinks.** Trained models park much of their attention on the first tokens of a
# text, whatever they say, and a pure rolling window drops exactly those: Xiao et al. (2024,
# StreamingLLM) found that a model then falls apart once the text outgrows the window, and that
# keeping the first few positions in the cache, outside the window (four in their experiments;
# this cell keeps one), is enough to keep it working.
# `sliding_window_mask(L, window, sinks=s)` keeps the first `s` keys visible to every later
# query; the rolling cache keeps their entries and forgets the middle. (With RoPE, StreamingLLM
# caches the keys before rotating them and rotates them at every step by their place in the
# cache, the sinks at 0 … s−1 and the recent tokens right after, so no offset grows beyond the
# cache's size. `KVCache` holds keys already rotated by their place in the text, so trimming it
# works only without RoPE, as here.)

# %%
sinks = 1
with torch.no_grad():
    reference_sinks = win(x, x, x, mask=sliding_window_mask(L, window, sinks=sinks, device=device))
    cache, largest, steps = KVCache(), 0, []
    for t in range(L):
        if len(cache) > sinks + window - 1:  # forget the middle: keep the sinks and the last window - 1
            keep = [torch.cat([kv[..., :sinks, :], kv[..., -(window - 1):, :]], dim=-2)
                    for kv in (cache.keys, cache.values)]
            cache.keys, cache.values = keep
        steps.append(decode_step(win, x[:, t : t + 1], cache))
        largest = max(largest, len(cache))
assert torch.allclose(torch.cat(steps, dim=1), reference_sinks, atol=1e-5) and largest == sinks + window
print(f"a rolling cache of {sinks} sink + {window} recent positions == the windowed forward with sinks (within 1e-5)")

# %% [markdown]
# The mask with a sink, for 6 tokens and a window of 3: column 0 stays visible to every row, and
# the window slides past it.

# %%
print(sliding_window_mask(6, 3, sinks=1).int())

# %% [markdown]
#
# For Mistral 7B (32 layers, 8 key/value heads of 128, float16) the two answers combine: GQA makes
# a token cost 128 KiB, and the window of 4096 caps the cache at 4096 of them, 512 MiB per
# sequence, whether the text is 4096 tokens long or 32 768 (8 times less than a 32 768-token
# cache). A window does not blind the model to everything before it: in layer 2, a token reads
# tokens that have already gathered their own windows, so what it hears from reaches `window - 1`
# positions further back with every layer. How far that reaches, and the other ways of
# restricting where a head may look, are the subject of chapter 12.

# %%
per_token_mistral = kv_cache_bytes(num_layers=32, num_kv_heads=8, d_k=128, seq_len=1)
for n in (4096, 32_768):
    capped = min(n, 4096) * per_token_mistral
    print(f"Mistral-7B-like, {n:6,d} tokens: {n * per_token_mistral / 2**20:7,.0f} MiB without the window, "
          f"{capped / 2**20:5,.0f} MiB with it")

# %% [markdown]
# ## 6. What a decoding step reads
#
# Capacity is one reason to shrink the cache; Shazeer's argument for MQA was another: **the bytes
# read per decoding step**. Each new token is one small matrix-vector product per weight, so the
# GPU spends the step reading memory: all the weights once, plus every sequence's whole cache.
# With a batch of sequences the weights are read once for all of them, the caches once each, so
# the cache soon dominates. For a 7B-class model (32 layers, 32 heads of 128, float16) at 4096
# tokens, on a GPU that reads 3.35 TB/s (an H100):

# %%
weights_bytes = 7e9 * 2  # about 7 billion parameters in float16
print(f"{'batch':>5} {'H_kv':>5} {'cache GiB':>10} {'read per step GiB':>18} {'ms per step':>12}")
for batch in (1, 32):
    for kv_heads in (32, 8, 1):  # MHA, GQA with 8 groups, MQA
        cache_bytes = kv_cache_bytes(num_layers=32, num_kv_heads=kv_heads, d_k=128, seq_len=4096, batch=batch)
        read = weights_bytes + cache_bytes
        print(f"{batch:5d} {kv_heads:5d} {cache_bytes / 2**30:10.1f} {read / 2**30:18.1f} {read / 3.35e12 * 1e3:12.1f}")
mha_32 = weights_bytes + kv_cache_bytes(32, 32, 128, 4096, batch=32)
gqa_32 = weights_bytes + kv_cache_bytes(32, 8, 128, 4096, batch=32)
print(f"batch 32: the multi-head cache is {kv_cache_bytes(32, 32, 128, 4096, batch=32) / weights_bytes:.1f} times "
      f"the weights; 8 groups read {mha_32 / gqa_32:.1f} times fewer bytes per step")
assert kv_cache_bytes(32, 32, 128, 4096, batch=32) > 4 * weights_bytes and mha_32 / gqa_32 > 2.5

# %% [markdown]
# One sequence reads mostly weights, and sharing key/value heads barely changes its step. A
# batch of 32 reads nearly five times the weights' size in cache with full multi-head
# attention; with 8 groups a step reads 2.7 times fewer bytes, so it takes well under half the
# time.
# That, as much as capacity, is why serving favours GQA and MQA. Today's models go further:
# DeepSeek-V2 caches one small vector per token instead of keys and values (multi-head latent
# attention, the next section); caches are quantised to 8 or 4 bits; some models share one cache
# between neighbouring layers; and Gemma 2 alternates windowed and global layers, Gemma 3 keeps
# one global layer in six.

# %% [markdown]
# ## 7. Multi-head latent attention: cache a latent, not keys and values
#
# GQA makes heads share their keys and values. DeepSeek-V2's **multi-head latent attention**
# (MLA) keeps a key and a value for every head, and caches none of them. Each token's input `x_j`
# is compressed by a down-projection into one **latent** vector of `d_c` features, shared by all
# heads, and each head rebuilds its key and value from it with up-projections of its own:
#
# $$c_j = W_{dkv}\, x_j, \qquad k_{j,h} = W_{uk}[h]\, c_j, \qquad v_{j,h} = W_{uv}[h]\, c_j.$$
#
# Only `c_j` is cached: `d_c` numbers per token and layer instead of `2 · H · d_k`. The price is
# a constraint the model learns with: every head's keys and values are linear functions of the
# same `d_c` numbers (`W_uk · W_dkv` has rank at most `d_c`), so MLA is an architecture to train,
# not a way to shrink a trained multi-head model's cache for free.
#
# `mha_lib.MultiHeadLatentAttention(d_model, num_heads, d_latent)` has the five projections;
# `LatentCache` is its cache, used like `KVCache`. The paper's `d_h`, `d_c`, `d_h^R` are our
# `d_k`, `d_latent`, `d_rope`. Unlike DeepSeek-V2 we keep a full `W_q` (their query latent saves
# training activations, not cache) and no norm on the latent. On section 1's layer (64 wide, 8
# heads of 8), with a latent of 16:

# %%
mla = MultiHeadLatentAttention(d_model, H, d_latent=16).to(device).eval()
for name in ("W_q", "W_dkv", "W_uk", "W_uv", "W_o"):
    print(f"{name:5} {tuple(getattr(mla, name).weight.shape)}")
latent_cache, kv_cache = LatentCache(), KVCache()
with torch.no_grad():
    reference = mla(x, x, x, mask=causal_mask(L, device=device))
    decoded = torch.cat([decode_step(mla, x[:, t : t + 1], latent_cache) for t in range(L)], dim=1)
    for t in range(L):
        decode_step(mha, x[:, t : t + 1], kv_cache)  # section 1's multi-head layer, for comparison
assert torch.allclose(decoded, reference, atol=1e-5)
print("one token per step, with a LatentCache == one causal forward (within 1e-5):", True)
print(f"LatentCache: latent {tuple(latent_cache.latent.shape)} (B, T, d_latent), {latent_cache.nbytes} bytes")
print(f"KVCache of the 8-head layer: keys and values 2 x {tuple(kv_cache.keys.shape)}, {kv_cache.nbytes} bytes")
assert kv_cache.nbytes == 8 * latent_cache.nbytes  # 2 · 8 · 8 = 128 numbers a token, against 16

# %% [markdown]
# **The absorption.** Rebuilding every cached token's keys and values at every step would spend
# in arithmetic what the cache saved in memory. It is not needed: both up-projections can be moved
# out of the way. A head's score is
#
# $$q_h \cdot k_{j,h} = q_h^\top W_{uk}[h]\, c_j = \left(W_{uk}[h]^\top q_h\right) \cdot c_j :$$
#
# fold `W_uk[h]` into the query, and the head scores the cached latents directly. A head's output,
# before `W_o`, is `Σ_j w_j W_uv[h] c_j = W_uv[h] (Σ_j w_j c_j)`: blend the latents with the
# weights, and fold `W_uv[h]` into the block of `W_o` that reads head `h`. Keys and values are
# never built; every head attends over the same cached latents, like multi-query attention whose
# one key and one value are the latent itself. The scores must still be divided by `√d_k`; an
# attention function that divides by `√d_c` needs the queries scaled by `√(d_c / d_k)`. `forward(..., absorb=True)`
# does all that, and `absorbed_weights()` gives the two folded matrices. In float64, to show that
# the two orders differ by rounding only:

# %%
W_uk, W_ov = mla.absorbed_weights()
print("W_uk per head:          ", tuple(W_uk.shape), " (H, d_k, d_latent): each query becomes W_uk[h]ᵀ q_h")
print("W_o with W_uv folded in:", tuple(W_ov.shape), "(d_model, H, d_latent): reads the blended latents")
exact, x64 = copy.deepcopy(mla).double(), x.double()
with torch.no_grad():
    out, weights = exact(x64, x64, x64, mask=causal_mask(L, device=device), return_weights=True)
    out_absorbed, weights_absorbed = exact(x64, x64, x64, mask=causal_mask(L, device=device), return_weights=True,
                                           absorb=True)
assert torch.allclose(out_absorbed, out, atol=1e-12) and torch.allclose(weights_absorbed, weights, atol=1e-12)
print("absorbed == unabsorbed, outputs and weights (float64, within 1e-12):", True)
latent_cache = LatentCache()
with torch.no_grad():
    steps = [mla(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=latent_cache, absorb=True) for t in range(L)]
assert torch.allclose(torch.cat(steps, dim=1), reference, atol=1e-5)
print("decoding absorbed, with the LatentCache == one causal forward (within 1e-5):", True)

# %% [markdown]
# **Why not plain RoPE?** RoPE rotates a head's key after `W_uk`, by the key's position `j`, and
# the query by its position `i`, and the score becomes
# `(R_i q)ᵀ R_j W_uk[h] c_j = qᵀ R_{j-i} W_uk[h] c_j` (chapter 06: rotations compose into the
# rotation by the offset). The matrix between query and latent now depends on `j - i`, so no single
# matrix can be folded into the query: every cached key would have to be rebuilt at every step,
# or kept rotated in the cache, which brings back the key cache MLA set out to avoid.
#
# Try the naive fold anyway, for one head: fold `W_uk[h]` into a query rotated by its position,
# score the unrotated latents, and compare with the true scores of the rotated keys. They agree
# only at key position 0, where RoPE rotates by zero:

# %%
with torch.no_grad():
    c = torch.randn(L, 16).to(device)  # (T, d_latent): the cached latents of positions 0 .. L - 1
    q = torch.randn(1, d_model // H).to(device)  # (1, d_k): head 0's query at position L - 1
    keys = apply_rotary(c @ W_uk[0].T)  # (T, d_k): rebuilt, then rotated by 0 .. L - 1
    q_rot = apply_rotary(q, torch.tensor([L - 1], device=device))
    true_scores, folded_scores = (q_rot @ keys.T)[0], (q_rot @ W_uk[0] @ c.T)[0]  # (T,) each
agree = torch.isclose(folded_scores, true_scores, atol=1e-5)
print("folded scores agree at key positions:", torch.nonzero(agree).flatten().tolist())
assert agree[0] and not agree[1:].any()  # only position 0, which RoPE leaves unrotated

# %% [markdown]
# DeepSeek-V2's answer is **decoupled RoPE**: the latent path carries no positions, and a few
# rotary features ride alongside. Each head gets a rotary query of `d_h^R` features, and all heads
# share one rotary key of `d_h^R` features, cached already rotated beside the latent; a head's
# score is the sum of the two dot products over `√(d_h + d_h^R)`. The positions live in a part
# that needs no fold, and the fold works on the rest. `d_rope=` adds them (the same module, with
# `W_qr` and `W_kr`):

# %%
mla_rope = MultiHeadLatentAttention(d_model, H, d_latent=16, d_rope=4).to(device).eval()
rope_cache = LatentCache()
with torch.no_grad():
    reference_rope = mla_rope(x, x, x, mask=causal_mask(L, device=device))  # keys and values rebuilt
    steps = [mla_rope(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=rope_cache, absorb=True)
             for t in range(L)]
assert torch.allclose(torch.cat(steps, dim=1), reference_rope, atol=1e-5)
print("decoupled RoPE, absorbed, one token per step == one causal forward (within 1e-5):", True)
print(f"cached: latent {tuple(rope_cache.latent.shape)}, rotary keys {tuple(rope_cache.rope_keys.shape)}: "
      f"{rope_cache.nbytes // len(rope_cache)} bytes a token")

# %% [markdown]
# **What it saves.** DeepSeek-V2 has 60 layers of 128 heads with `d_h = 128`, a latent of
# `d_c = 512 = 4 d_h` and rotary parts of `d_h^R = 64 = d_h / 2`: it caches `d_c + d_h^R = 576`
# numbers per token and layer, where multi-head attention would cache `2 · n_h · d_h`. For the
# book's layer (8 heads of 64) we take the same proportions, `d_c = 256` and `d_rope = 32`, and
# measure the cache after the 16 tokens of section 3; the other kinds' bytes are section 4's
# measurements, divided by 16. A DeepSeek-V2-like model is computed, in 2-byte numbers, for one
# sequence of 128K tokens, the context length DeepSeek-V2 supports:

# %%
book_mla = MultiHeadLatentAttention(512, 8, d_latent=256, d_rope=32).to(device).eval()
cache = LatentCache()
with torch.no_grad():
    steps = [decode_step(book_mla, tokens[:, t : t + 1], cache) for t in range(16)]
    assert torch.allclose(torch.cat(steps, 1), book_mla(tokens, tokens, tokens, mask=causal_mask(16, device=device)),
                          atol=1e-4)
assert cache.nbytes == latent_cache_bytes(num_layers=1, d_latent=256, seq_len=16, d_rope=32, bytes_per_element=4)
measured["MLA"] = cache.nbytes
book_numbers = {"MHA": 2 * 8 * 64, "GQA": 2 * 2 * 64, "MQA": 2 * 1 * 64, "MLA": 256 + 32}
big = {kind: kv_cache_bytes(num_layers=60, num_kv_heads=kv, d_k=128, seq_len=1)
       for kind, kv in (("MHA", 128), ("GQA", 8), ("MQA", 1))}  # 2 bytes per number
big["MLA"] = latent_cache_bytes(num_layers=60, d_latent=512, seq_len=1, d_rope=64)
print(f"{'':4} {'book layer: numbers':>20} {'bytes (measured)':>17} {'DeepSeek-V2-like: numbers':>26} "
      f"{'60 layers, per token':>21} {'128K tokens':>12}")
for kind in ("MHA", "GQA", "MQA", "MLA"):
    assert measured[kind] == book_numbers[kind] * 4 * 16  # float32, 16 tokens
    print(f"{kind:4} {book_numbers[kind]:20,d} {measured[kind] // 16:17,d} {big[kind] // 60 // 2:26,d} "
          f"{big[kind] / 2**10:17,.1f} KiB {big[kind] * 2**17 / 2**30:8,.1f} GiB")
print("(GQA: 2 key/value heads for the book's layer, 8 for the DeepSeek-V2-like one)")
groups = big["MLA"] / kv_cache_bytes(num_layers=60, num_kv_heads=1, d_k=128, seq_len=1)
print(f"MLA caches as much as GQA with {groups:.2f} groups; {big['MHA'] / big['MLA']:.0f} times less than MHA")
assert groups == 2.25 and round(big["MHA"] / big["MLA"]) == 57 and big["MLA"] // 60 // 2 == 4.5 * 128
assert book_numbers["MLA"] == 288 > book_numbers["GQA"] == 256 and big["MHA"] // 60 // 2 == 32_768
assert big["MHA"] * 2**17 / 2**30 == 480 and round(big["MLA"] * 2**17 / 2**30, 1) == 8.4

# %% [markdown]
# With the book's 8 heads there is little to gain: the latent and its rotary key (288 numbers)
# cost more than GQA's 2 key/value heads (256). MLA's cache does not grow with the number of
# heads: it is `4.5 d_h` numbers per token and layer, as much as GQA with 2.25 groups (the paper's
# own comparison), so with DeepSeek-V2's 128 heads it is 57 times smaller than multi-head
# attention's, 8.4 GiB instead of 480 GiB for a 128K-token sequence. And each head still has keys
# and values of its own: in the paper's appendix D, multi-head attention beats GQA and MQA (7B
# dense models), and MLA beats multi-head attention (mixture-of-experts models). With absorption, a decoding step reads the
# latent cache once for all heads (section 6's bytes per step), and does more arithmetic per
# cached token, dot products over `d_c + d_h^R` features per head instead of `d_h + d_h^R`: on a
# GPU that waits for memory while decoding, a good trade.
#
# So servers use both orders. For **decoding**, one new query per sequence against a long cache,
# they absorb: the step reads the latents once and never rebuilds a key. For **prefill**, a
# whole prompt at once, every query meets every key of the prompt and the arithmetic dominates;
# there they keep the up-projections unabsorbed, rebuild each token's keys and values once, and
# run ordinary multi-head attention, whose scores take dot products over `d_h + d_h^R = 192`
# features per head instead of `d_c + d_h^R = 576` (3 times fewer), and whose blend over `d_h =
# 128` features instead of `d_c = 512`. The latents still go into the cache for the decoding
# steps that follow.

# %% [markdown]
# ## Recap
#
# - Decoding without a cache recomputes every key and value at every step: `L(L+1)/2`
#   projections for `L` tokens. A causal layer never changes its outputs at earlier positions,
#   so no layer's keys and values for earlier tokens change: a **key/value cache** stores them,
#   and each step projects only the new tokens.
# - `KVCache()` and `module(x_new, x_new, x_new, cache=cache)`: the new keys and values are
#   appended, the new queries see every cached position and causally within their chunk (a
#   lower triangle shifted by `T`), and RoPE positions continue from `len(cache)`. Decoding token
#   by token or in chunks equals the full causal forward.
# - The cache costs `2 · layers · H_kv · d_k · bytes` per token: 4 KiB per layer for the book's
#   layer in float32, 0.5 MiB for a 7B-class model in float16, 2 GiB per 4096-token sequence.
# - **MQA** (one key/value head) and **GQA** (`H_kv` groups of consecutive query heads) divide that
#   by `H / H_kv`; every query head keeps its own attention map. `repeat_kv` gives each group its
#   shared head.
# - **Sliding windows** (`sliding_window_mask`, True where `0 <= i - j < window`) cap the cache at
#   `window` positions: what leaves the window is never read again.
#   Keeping the first few positions as **attention sinks** (`sinks=`) keeps long texts working.
# - A decoding step reads the weights once and every sequence's cache: with a batch, the cache
#   dominates the bytes a step moves, and GQA/MQA cut the step's time, not only its memory.
# - **Multi-head latent attention** (`MultiHeadLatentAttention`, DeepSeek-V2) caches one latent
#   `c = W_dkv x` per token (`LatentCache`) and rebuilds every head's keys and values from it.
#   `W_uk` folds into the queries and `W_uv` into `W_o` (`absorb=True`), so the cache is never
#   up-projected. Plain RoPE would put a position-dependent rotation between query and latent and
#   break that fold; a small rotary key shared by the heads (decoupled RoPE, `d_rope=`) keeps it.
#   DeepSeek-V2 caches 576 numbers per token and layer where multi-head attention would cache 32 768.
#   Servers decode absorbed and run the prompt (prefill) unabsorbed, where rebuilding keys and
#   values once is cheaper than the wider dot products.
# - `KVCache` appends in place into buffers that double when full, so an append costs the same
#   at any length; servers page the cache into blocks (vLLM) and quantise it to 8 bits or fewer.
#
# ## Exercises
#
# Practise what this chapter built in `exercises/11_attention_at_inference.ipynb`: the sliding
# window mask, `repeat_kv`, one decoding step with a cache and rotary positions, and the fold of
# latent attention's up-projections (`W_uk` into the queries, `W_uv` into `W_o`); each
# exercise checks itself and tells you what is wrong. See the README for how to start your own
# copy.
#
# ## What comes next
#
# **Chapter 12**, the course's last, takes the sliding window further: global tokens,
# block-sparse and strided patterns, a different mask for every head, and how far information
# travels through a stack of restricted layers. Then it takes up the challenge at the end of
# Priyesh Dave's post: restrict head 0 to the first half of the sequence and head 1 to the
# second, and explain what that says about what heads are for.
