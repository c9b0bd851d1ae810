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
# # Exercises · Chapter 11 · Attention at inference
#
# Four exercises, one per idea of chapter 11: the sliding-window mask, the key/value heads that
# groups of query heads share, one decoding step with a key/value cache and rotary positions, and
# the fold that lets multi-head latent attention decode from its latents alone.
#
# Fill in the code where it says `raise NotImplementedError`, run the cell, then run the
# **check** cell below it: it runs your code on fresh random inputs and says what is wrong, if
# anything. Hints are folded away: click to open them. Work in your own copy
# (`make exercise N=11`, or `.venv/bin/python -m mha_course start 11`; see the README), so that
# updates to the course never overwrite your work.

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
    raise NotImplementedError  # your code here


# %%
check_sliding_window_mask(sliding_window_mask)

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
    raise NotImplementedError  # your code here


# %%
check_repeat_kv(repeat_kv)

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
    raise NotImplementedError  # your code here


# %%
check_cached_attention(attend_with_cache)

# %% [markdown]
# Decode a sequence of your own with it, in chunks of your choice (say 4, then 1, 1, 1), and
# compare the outputs with rotary attention over the whole sequence at once with a causal mask.

# %%
# your code here

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
    raise NotImplementedError  # your code here


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
# your code here

# %% [markdown]
# ## Done?
#
# Compare with `solutions/11_attention_at_inference.ipynb`, then go on to chapter 12.
