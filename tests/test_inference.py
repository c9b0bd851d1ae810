"""Decoding with a KVCache equals recomputing everything with a causal mask."""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import TOLERANCES
from mha_lib import (EfficientMultiHeadAttention, KVCache, MultiHeadAttention, apply_rotary, causal_mask,
                     sliding_window_mask, split_heads)

D, H, L = 32, 4, 10
SCHEDULES = {  # chunk sizes that add up to L
    "token_by_token": [1] * L,
    "3_1_4_2": [3, 1, 4, 2],
    "prompt_then_tokens": [6, 1, 1, 1, 1],
    "all_at_once": [L],
}


def make(kind, num_kv_heads, rotary, dtype=torch.float32, device="cpu"):
    torch.manual_seed(2)
    teaching = MultiHeadAttention(D, H, num_kv_heads=num_kv_heads, rotary=rotary).to(device, dtype).eval()
    return teaching if kind == "teaching" else EfficientMultiHeadAttention.from_module(teaching)


def decode(module, x, sizes, cache=None, masks=None, return_weights=False):
    """Feed x chunk by chunk through one cache; return the outputs side by side (and the weights)."""
    cache = KVCache() if cache is None else cache
    outputs, weights, start = [], [], 0
    for i, n in enumerate(sizes):
        chunk = x[:, start : start + n]
        mask = None if masks is None else masks[i]
        out = module(chunk, chunk, chunk, mask, return_weights=return_weights, cache=cache)
        if return_weights:
            out, w = out
            weights.append(w)
        outputs.append(out)
        start += n
    return (torch.cat(outputs, dim=1), weights) if return_weights else torch.cat(outputs, dim=1)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=str)
@pytest.mark.parametrize("rotary", [False, True], ids=["no_rope", "rope"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("kind", ["teaching", "efficient"])
def test_decoding_with_a_cache_equals_the_full_causal_forward(kind, num_kv_heads, rotary, schedule, device):
    module = make(kind, num_kv_heads, rotary, device=device)
    x = torch.randn(2, L, D, device=device)
    expected = module(x, x, x, causal_mask(L, device=device))  # (B, L, D)
    cache = KVCache()
    with torch.no_grad():
        decoded = decode(module, x, SCHEDULES[schedule], cache)
    torch.testing.assert_close(decoded, expected, **TOLERANCES[torch.float32])
    assert len(cache) == L and cache.keys.shape == cache.values.shape == (2, num_kv_heads, L, D // H)


@pytest.mark.parametrize("kind", ["teaching", "efficient"])
def test_the_weights_are_the_rows_of_the_full_weights(kind):
    module = make(kind, 2, True, torch.float64)
    x = torch.randn(1, L, D, dtype=torch.float64)
    _, full = module(x, x, x, causal_mask(L), return_weights=True)  # (1, H, L, L)
    _, chunks = decode(module, x, [3, 1, 4, 2], return_weights=True)
    start = 0
    for w, n in zip(chunks, [3, 1, 4, 2]):
        assert w.shape == (1, H, n, start + n)  # the new queries over every position so far
        torch.testing.assert_close(w, full[:, :, start : start + n, : start + n])
        start += n


@pytest.mark.parametrize("rotary", [False, True])
def test_the_cache_holds_the_keys_after_projection_and_rope(rotary):
    module = make("teaching", 2, rotary, torch.float64)
    x = torch.randn(2, L, D, dtype=torch.float64)
    cache = KVCache()
    decode(module, x, [4, 3, 3], cache)
    keys = split_heads(module.W_k(x), 2)  # (B, H_kv, L, d_k)
    if rotary:
        keys = apply_rotary(keys)
    torch.testing.assert_close(cache.keys, keys)
    torch.testing.assert_close(cache.values, split_heads(module.W_v(x), 2))


def test_the_comparison_catches_the_usual_mistakes():
    """Each mistake the chapter's exercise names gives a different answer from the full forward."""
    module = make("teaching", 2, True, torch.float64)
    x = torch.randn(1, L, D, dtype=torch.float64)
    expected = module(x, x, x, causal_mask(L))
    torch.testing.assert_close(decode(module, x, [1] * L), expected)  # the right way
    # no cache at all: every token sees only itself; positions restart at 0 every step
    forgetful = torch.cat([module(x[:, i : i + 1], x[:, i : i + 1], x[:, i : i + 1]) for i in range(L)], dim=1)
    assert not torch.allclose(forgetful, expected)
    # a fresh cache per chunk: each chunk forgets the past
    amnesic = torch.cat([decode(module, x[:, s : s + n], [n]) for s, n in [(0, 4), (4, 3), (7, 3)]], dim=1)
    assert not torch.allclose(amnesic, expected)
    # a chunk attended without causality: its first tokens see its later ones
    x1, x2 = x[:, :4], x[:, 4:]
    assert not torch.allclose(module(x1, x1, x1), expected[:, :4])
    # with a cache the module adds the causality itself: even an all-True mask stays causal
    cache = KVCache()
    first = module(x1, x1, x1, cache=cache)
    rest = module(x2, x2, x2, torch.ones(L - 4, L, dtype=torch.bool), cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), expected)


@pytest.mark.parametrize("kind", ["teaching", "efficient"])
def test_a_sliding_window_mask_combines_with_the_cache(kind):
    """The decoder passes the last n rows of the window mask over T + n positions."""
    module = make(kind, 2, True, torch.float64)
    x = torch.randn(2, L, D, dtype=torch.float64)
    window = 3
    expected = module(x, x, x, sliding_window_mask(L, window))
    sizes, ends = [3, 1, 4, 2], list(itertools.accumulate([3, 1, 4, 2]))
    masks = [sliding_window_mask(end, window)[-n:] for n, end in zip(sizes, ends)]  # (n, T + n)
    torch.testing.assert_close(decode(module, x, sizes, masks=masks), expected)
    float_masks = [torch.zeros(m.shape, dtype=torch.float64).masked_fill(~m, float("-inf")) for m in masks]
    torch.testing.assert_close(decode(module, x, sizes, masks=float_masks), expected)


def test_extend_masks_the_new_queries():
    """KVCache.extend: n new queries at T ... T + n - 1 see every cached key and, causally, the new ones."""
    def kv(n):
        return torch.zeros(2, 4, n, 8), torch.zeros(2, 4, n, 8)  # (B, H_kv, n, d_k)

    cache = KVCache()
    assert cache.extend(*kv(1))[2] is None  # one new token sees everything
    cache.reset()
    cache.extend(*kv(2))
    keys, values, mask = cache.extend(*kv(3))
    assert keys.shape == values.shape == (2, 4, 5, 8) and len(cache) == 5
    assert mask.int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    padding = torch.tensor([True, False, True, True, True])  # (Lk,): key 1 is padding
    cache.reset()
    cache.extend(*kv(3))
    assert cache.extend(*kv(2), padding)[2].int().tolist() == [[1, 0, 1, 1, 0], [1, 0, 1, 1, 1]]
    bias = torch.zeros(5)
    cache.reset()
    cache.extend(*kv(3))
    assert torch.isneginf(cache.extend(*kv(2), bias)[2]).int().tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]


def test_a_mask_is_checked_against_the_cached_length():
    mha, cache = MultiHeadAttention(D, H).eval(), KVCache()
    x = torch.randn(1, 3, D)
    mha(x, x, x, cache=cache)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast .*\(1, 4, 3, 6\)"):
        mha(x, x, x, torch.ones(3, 4, dtype=torch.bool), cache=cache)  # the keys are T + n = 6


def test_nbytes_and_length_are_exact():
    """The book's configuration: d_model 512, 8 heads of 64, float32: 2 · 8 · 64 · 4 bytes per token."""
    mha = MultiHeadAttention(512, 8).eval()
    gqa = MultiHeadAttention(512, 8, num_kv_heads=2).eval()
    x = torch.randn(1, 16, 512)
    caches = {}
    with torch.no_grad():
        for name, module in (("mha", mha), ("gqa", gqa)):
            caches[name] = KVCache()
            assert caches[name].nbytes == 0 and len(caches[name]) == 0
            decode(module, x, [5, 1, 10], caches[name])
    assert len(caches["mha"]) == len(caches["gqa"]) == 16
    assert caches["mha"].nbytes == 2 * 1 * 8 * 16 * 64 * 4 == 65536
    assert caches["gqa"].nbytes * 4 == caches["mha"].nbytes  # 2 key/value heads of 8: a quarter
    bf16 = KVCache()
    bf16.update(torch.zeros(3, 2, 7, 64, dtype=torch.bfloat16), torch.zeros(3, 2, 7, 64, dtype=torch.bfloat16))
    assert bf16.nbytes == 2 * 3 * 2 * 7 * 64 * 2 and len(bf16) == 7
    assert repr(bf16) == "KVCache(len=7, keys=(3, 2, 7, 64), nbytes=10752)"
    bf16.reset()
    assert len(bf16) == 0 and bf16.nbytes == 0 and bf16.keys is None


def test_misuse_is_refused_clearly():
    module = MultiHeadAttention(D, H, num_kv_heads=2)
    x, memory = torch.randn(2, 3, D), torch.randn(2, 5, D)
    with pytest.raises(ValueError, match="KVCache works for self-attention only"):
        module(x, memory, memory, cache=KVCache())
    with pytest.raises(TypeError, match="cache must be a mha_lib.KVCache, got dict"):
        module(x, x, x, cache={})
    cache = KVCache()
    module(x, x, x, cache=cache)
    other = torch.randn(3, 1, D)  # another batch size
    with pytest.raises(ValueError, match=r"holds \(B, H_kv, d_k, dtype, device\) = \(2, 2, 8, .*reset\(\)"):
        module(other, other, other, cache=cache)
    with pytest.raises(ValueError, match="one shape"):
        cache.update(torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 2, 8))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 3\) does not broadcast.*\(2, 4, 3, 6\)"):
        module(x, x, x, causal_mask(3), cache=cache)  # the mask must cover the cached keys too
    assert len(cache) == 3


def test_appending_writes_in_place_and_grows_by_doubling():
    """Constant-time appends, shown without a clock (which load can break): one token at a time to
    4,096 positions (B 1, 8 heads, d_k 64), the buffers are replaced only when full, each time by
    one twice as large, so the positions copied from old buffers add up to fewer than T, where
    appending by torch.cat copies the whole cache every step (T² / 2 positions). Between two
    reallocations the keys stay in one block of memory, written in place."""
    cache, T = KVCache(), 4096
    k1, v1 = torch.randn(1, 8, 1, 64), torch.randn(1, 8, 1, 64)
    buffers, copied = [], 0
    with torch.no_grad():
        for t in range(T):
            keys, values = cache.update(k1 + t, v1 - t)
            pointer = keys.untyped_storage().data_ptr()
            if not buffers or buffers[-1][0] != pointer:
                copied += t  # a new buffer: the t positions held so far were copied into it
                buffers.append((pointer, cache.capacity))
    capacities = [capacity for _, capacity in buffers]
    assert capacities == [2**i for i in range(13)], capacities  # 1, 2, 4, ..., 4096
    assert copied < T < T * (T - 1) // 2 / 1000
    assert len(cache) == T and cache.nbytes == 2 * 8 * T * 64 * 4
    torch.testing.assert_close(cache.keys[0, :, :, 0], (k1[0, :, 0, :1] + torch.arange(T)).expand(8, T))
    torch.testing.assert_close(cache.values[0, 3, -1], v1[0, 3, 0] - (T - 1))


def test_a_capacity_is_allocated_once_and_then_doubled():
    cache = KVCache(capacity=16)
    with torch.no_grad():
        cache.update(torch.zeros(2, 2, 3, 4), torch.zeros(2, 2, 3, 4))
        pointer = cache.keys.untyped_storage().data_ptr()
        assert cache.capacity == 16 and len(cache) == 3
        for _ in range(13):
            cache.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))
        assert cache.keys.untyped_storage().data_ptr() == pointer and cache.capacity == 16
        cache.update(torch.ones(2, 2, 1, 4), torch.ones(2, 2, 1, 4))  # the 17th position
    assert cache.capacity == 32 and len(cache) == 17 and cache.keys.sum() == 2 * 2 * 14 * 4
    with pytest.raises(ValueError, match="capacity must be"):
        KVCache(capacity=0)


def test_assigned_keys_are_never_written_into():
    """Trimming a rolling window assigns views of the cache; the next append copies, never writes into them."""
    cache = KVCache()
    keys, values = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    cache.keys, cache.values = keys, values
    assert len(cache) == 4 and cache.capacity == 4
    with torch.no_grad():
        cache.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))
    assert keys.sum() == 0 and values.sum() == 0 and len(cache) == 5 and cache.keys[..., 4, :].sum() == 16


def test_decoding_with_gradients_concatenates_so_that_backward_works():
    """With autograd recording, writing in place would change tensors saved for the backward pass."""
    module = make("efficient", 2, True)
    x = torch.randn(1, L, D)
    cache = KVCache()
    out = decode(module, x, [1] * L, cache)  # 5 of the 10 appends go into spare capacity
    out.sum().backward()  # would raise "modified by an inplace operation" after in-place appends
    full = make("efficient", 2, True)
    full(x, x, x, causal_mask(L)).sum().backward()
    torch.testing.assert_close(module.W_qkv.weight.grad, full.W_qkv.weight.grad)
