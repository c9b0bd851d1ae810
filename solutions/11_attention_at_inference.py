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
# # Solutions · Chapter 11 · Attention at inference
#
# <!-- BEGIN SOLUTION -->
# > **Worked solutions.** This notebook is the source of `exercises/11_attention_at_inference.ipynb`:
# > the same exercises, with the solutions filled in and a short discussion after each.
# <!-- END SOLUTION -->
#
# Four exercises, one per idea of chapter 11: the sliding-window mask, the key/value heads that
# groups of query heads share, one decoding step with a key/value cache and rotary positions, and
# the fold that lets multi-head latent attention decode from its latents alone.
#
# <!-- EXERCISE ONLY
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=11`, or `.venv/bin/python -m mha_course start 11`; see the README), so that
# updates to the course never overwrite your work.
# -->

# %%
import math

import torch

from mha_lib import MultiHeadLatentAttention, apply_rotary, causal_mask, scaled_dot_product_attention, split_heads
from mha_lib.checks import (check_absorb_up_projections, check_cached_attention, check_repeat_kv,
                            check_sliding_window_mask)

# %% [markdown]
# ## Exercise 11.1 · The sliding-window mask
#
# Write `sliding_window_mask(seq_len, window)`: a bool tensor `(L, L)`, rows = queries,
# columns = keys, True (may attend) exactly where `0 <= i - j < window`. Each query sees itself
# and the `window - 1` keys before it, never a key after it. Don't call
# `mha_lib.sliding_window_mask`.
#
# <details><summary>Hint</summary>
#
# `i = torch.arange(L)[:, None]` and `j = torch.arange(L)[None, :]` broadcast to every pair
# `(i, j)`; combine two comparisons with `&`.
# </details>

# %%
def sliding_window_mask(seq_len, window):
    # BEGIN SOLUTION
    offset = torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]  # (L, L): i - j
    return (offset >= 0) & (offset < window)
    # END SOLUTION


# %%
check_sliding_window_mask(sliding_window_mask)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** The usual slips are off by one (`i - j <= window` gives every query one key
# too many) and forgetting `i - j >= 0`, which turns the window into Longformer's two-sided one and
# lets a decoder read the future. Another way to write it: `ones.tril() & ~ones.tril(-window)`.
# <!-- END SOLUTION -->

# %% [markdown]
# ## Exercise 11.2 · Share key/value heads
#
# Write `repeat_kv(x, n_rep)`: from `x (B, H_kv, L, d_k)`, the key (or value) heads of a
# grouped-query layer, build `(B, H_kv · n_rep, L, d_k)` in which head `h` is head `h // n_rep`
# of `x`: query heads `0 .. n_rep - 1` share key/value head 0, the next `n_rep` share head 1, and
# so on. Don't call `mha_lib.repeat_kv`.
#
# <details><summary>Hint</summary>
#
# `torch.repeat_interleave` repeats each entry along one axis; `Tensor.repeat` tiles the whole
# axis instead. Print which head lands where for `H_kv = 2, n_rep = 3` before you run the check.
# </details>

# %%
def repeat_kv(x, n_rep):
    # BEGIN SOLUTION
    return torch.repeat_interleave(x, n_rep, dim=1)  # (B, H_kv * n_rep, L, d_k)
    # END SOLUTION


# %%
check_repeat_kv(repeat_kv)

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** `x.repeat(1, n_rep, 1, 1)` has the right shape and the wrong grouping: heads
# 0, 1, 0, 1, … Both groupings would train, but PyTorch's `enable_gqa=True`, Hugging Face and
# checkpoints use consecutive groups, so a tiled model would read every other key/value head. The
# library writes it as `x[:, :, None].expand(...).reshape(...)`, which is the same thing.
# <!-- END SOLUTION -->

# %% [markdown]
# ## Exercise 11.3 · One decoding step with a cache
#
# Write `attend_with_cache(query, key, value, k_cache, v_cache)` for one attention layer with
# rotary positions (chapter 06):
#
# - `query, key, value (B, H, n, d_k)`: the heads of the `n` new tokens, **not yet rotated**;
# - `k_cache, v_cache (B, H, T, d_k)`: the keys (already rotated) and the values of the `T`
#   tokens before them; `T = 0` at the first step (empty tensors).
#
# Rotate the new queries and keys by their positions, append the new keys and values to the
# caches, let the new queries attend to all `T + n` keys (each new token to every cached one and
# causally within the chunk), and return `(output, k_cache, v_cache)`: the output
# `(B, H, n, d_k)` and both caches, now `(B, H, T + n, d_k)`. Use `apply_rotary` and
# `scaled_dot_product_attention` (imported above).
#
# <details><summary>Hint 1</summary>
#
# The new tokens sit at positions `T .. T + n - 1`, with `T = k_cache.size(-2)` read **before**
# you append anything.
# </details>
# <details><summary>Hint 2</summary>
#
# The mask is `(n, T + n)`: new token `r` may see keys `0 .. T + r`. `torch.tril` on a
# non-square matrix needs the offset: `torch.ones(n, T + n, dtype=torch.bool).tril(diagonal=T)`.
# </details>

# %%
def attend_with_cache(query, key, value, k_cache, v_cache):
    # BEGIN SOLUTION
    T, n = k_cache.size(-2), query.size(-2)
    positions = torch.arange(T, T + n, device=query.device)  # where the new tokens sit
    query, key = apply_rotary(query, positions), apply_rotary(key, positions)  # never the values
    k_cache = torch.cat([k_cache, key], dim=-2)  # (B, H, T + n, d_k)
    v_cache = torch.cat([v_cache, value], dim=-2)
    mask = torch.ones(n, T + n, dtype=torch.bool, device=query.device).tril(diagonal=T)  # (n, T + n)
    output, _ = scaled_dot_product_attention(query, k_cache, v_cache, mask)  # (B, H, n, d_k)
    return output, k_cache, v_cache
    # END SOLUTION


# %%
check_cached_attention(attend_with_cache)

# %% [markdown]
# Decode a sequence of your own with it, in chunks of your choice (say 4, then 1, 1, 1), and
# compare the outputs with rotary attention over the whole sequence at once with a causal mask.

# %%
# BEGIN SOLUTION
g = torch.Generator().manual_seed(0)
q, k, v = torch.randn(3, 1, 2, 7, 8, generator=g, dtype=torch.float64)  # (B, H, L, d_k) each
full, _ = scaled_dot_product_attention(apply_rotary(q), apply_rotary(k), v, torch.ones(7, 7, dtype=torch.bool).tril())
k_cache = v_cache = torch.zeros(1, 2, 0, 8, dtype=torch.float64)
outputs, start = [], 0
for n in (4, 1, 1, 1):
    chunk = slice(start, start + n)
    out, k_cache, v_cache = attend_with_cache(q[..., chunk, :], k[..., chunk, :], v[..., chunk, :], k_cache, v_cache)
    outputs.append(out)
    start += n
print("chunks of 4, 1, 1, 1 == the full causal forward:", torch.allclose(torch.cat(outputs, dim=-2), full))
# END SOLUTION

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** Four mistakes are common, and the check names each: forgetting to append (every
# step sees only itself), reading `T` after appending (the new tokens get positions shifted by
# `n`), building the mask as `tril` of `(n, T + n)` without the offset (for a single new token
# that mask is `[True, False, …]`: it hides everything but position 0), and restarting the
# positions at 0 for every chunk. `mha_lib.KVCache` and `forward(..., cache=)` do the same steps;
# for one new token with no other mask they skip the mask altogether, since it would allow
# everything.
# <!-- END SOLUTION -->

# %% [markdown]
# ## Exercise 11.4 · Absorb the up-projections
#
# Multi-head latent attention (chapter 11, section 7) caches one latent `c = W_dkv x` per token;
# head `h` rebuilds its key `W_uk[h] c` and its value `W_uv[h] c` from it. Write
# `absorb_up_projections(mla)`: given a `MultiHeadLatentAttention` with `H = mla.num_heads` heads
# of `d_k = mla.d_k` features and a latent of `d_latent = mla.d_latent`, return `(W_uk, W_ov)`,
# the two matrices that let a decoding step attend over the latents without building a key or a
# value:
#
# - `W_uk (H, d_k, d_latent)`: each head's key up-projection, `k_h = W_uk[h] c`, to fold into
#   that head's query (`q_h @ W_uk[h]` is the query in latent space);
# - `W_ov (d_model, H, d_latent)`: `W_o` with `W_uv` folded in, `W_ov[:, h] = W_o[:, h] @ W_uv[h]`,
#   where `W_o[:, h]` is the `(d_model, d_k)` block of `W_o.weight` that reads head `h`.
#
# These are what `mla.absorbed_weights()` returns; don't call it. `W_uk`, `W_uv` and `W_o` are
# `nn.Linear` layers. Read every size from the module (`mla.num_heads`, `mla.d_k`, `mla.d_latent`):
# the check hands over modules of other sizes than the example's, in training mode with gradients
# on, and the same module again after changing its weights; return tensors in the module's dtype,
# and leave the module as you found it (its mode, `requires_grad`, hooks and weights).
#
# <details><summary>Hint 1</summary>
#
# `nn.Linear.weight` is `(out_features, in_features)`. `W_uk.weight` and `W_uv.weight` are
# `(H · d_k, d_latent)`, their rows head by head, in the order `split_heads` cuts a projection's
# output; `W_o.weight` is `(d_model, H · d_k)`, its columns head by head.
# </details>
# <details><summary>Hint 2</summary>
#
# `torch.einsum("mhk,hkc->mhc", W_o_per_head, W_uv_per_head)` multiplies every head's blocks at
# once. Try your function on `MultiHeadLatentAttention(12, 3, d_latent=7)` (`d_k = 4`) and print
# the shapes: with `d_k` different from `d_latent`, a missing or extra transpose shows.
# </details>

# %%
def absorb_up_projections(mla):
    # BEGIN SOLUTION
    H, d_k, d_latent = mla.num_heads, mla.d_k, mla.d_latent
    W_uk = mla.W_uk.weight.view(H, d_k, d_latent)  # rows h·d_k .. (h+1)·d_k build head h's key
    W_uv = mla.W_uv.weight.view(H, d_k, d_latent)  # and its value
    W_o = mla.W_o.weight.view(-1, H, d_k)  # (d_model, H, d_k): the columns that read each head
    W_ov = torch.einsum("mhk,hkc->mhc", W_o, W_uv)  # W_o[:, h] @ W_uv[h], every head at once
    return W_uk, W_ov
    # END SOLUTION


# %%
check_absorb_up_projections(absorb_up_projections)

# %% [markdown]
# Use your two matrices: compute `mla(x, x, x, mask=causal_mask(L))` for a layer and inputs of
# your own from the latents `mla.W_dkv(x)`, without building a key or a value, and compare.
#
# <details><summary>Hint</summary>
#
# Every head attends over the same latents `(B, 1, L, d_latent)`, with the queries
# `split_heads(mla.W_q(x), H) @ W_uk`. The scores must still be divided by `√d_k`, and
# `scaled_dot_product_attention` divides by the square root of its keys' width, `d_latent`:
# multiply the queries by `√(d_latent / d_k)`. Then `torch.einsum` the blended latents with
# `W_ov`, and add `W_o`'s bias.
# </details>

# %%
# BEGIN SOLUTION
torch.manual_seed(0)
mla = MultiHeadLatentAttention(12, 3, d_latent=7).double().eval()
x = torch.randn(2, 5, 12, dtype=torch.float64)
with torch.no_grad():
    W_uk, W_ov = absorb_up_projections(mla)
    q = split_heads(mla.W_q(x), mla.num_heads) @ W_uk  # (B, H, L, d_latent): each head's query in latent space
    q = q * math.sqrt(mla.d_latent / mla.d_k)  # the scores keep their 1/√d_k
    latents = mla.W_dkv(x)[:, None]  # (B, 1, L, d_latent): one key and one value, shared by every head
    blended, _ = scaled_dot_product_attention(q, latents, latents, causal_mask(5))  # (B, H, L, d_latent)
    out = torch.einsum("bhlc,mhc->blm", blended, W_ov) + mla.W_o.bias  # (B, L, d_model)
    print("absorbed == mla(x, x, x, mask=causal_mask(5)):", torch.allclose(out, mla(x, x, x, mask=causal_mask(5))))
# END SOLUTION

# %% [markdown]
# <!-- BEGIN SOLUTION -->
# **Discussion.** `W_uk` needs no arithmetic at all: it is the weight, viewed per head. The
# slips the check names are a transpose where none is needed (`W_uk.weight.T.reshape(...)` has
# the right shape and scrambled numbers), the head axis split in the wrong order (head `h` must
# get the block of rows `h·d_k .. (h+1)·d_k`, as `split_heads` cuts, not every `H`-th row),
# `W_uv` multiplied on the wrong side of `W_o[:, h]`, the two up-projections swapped (`W_uk` goes
# with the queries, `W_uv` with `W_o`), `W_o` returned without the fold, and
# `W_o.weight @ W_uv.weight`, which sums the heads' folded blocks: each head blends the latents
# with its own weights, so each needs its own block. The fold costs no sequence length: it is
# computed once per layer, and a decoding step then reads each cached latent as it is, for every
# head, instead of rebuilding `H` keys and `H` values from it. In the second cell the scale is
# the one thing to watch: the scores are the same numbers in either order, divided by `√d_k`,
# whatever width the dot product runs over.
# <!-- END SOLUTION -->

# %% [markdown]
# <!-- EXERCISE ONLY
# ## Done?
#
# Compare with `solutions/11_attention_at_inference.ipynb`, then go on to chapter 12.
# -->
# <!-- BEGIN SOLUTION -->
# ## Next
#
# Go on to chapter 12.
# <!-- END SOLUTION -->
