"""Multi-head latent attention (MLA) against independent formulations.

- the module equals keys and values built by hand from the latent and PyTorch's
  ``F.scaled_dot_product_attention``, with and without decoupled RoPE, under every kind of mask;
- with an uncompressed latent and the right up-projections it *is* ``mha_lib.MultiHeadAttention``;
- the absorbed path (``W_uk`` folded into the queries, ``W_uv`` into ``W_o``) equals the unabsorbed
  one and never calls the up-projections;
- decoding with a ``LatentCache`` equals the full causal forward, and the cache holds only the latents.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import TOLERANCES, assert_rejects_bad_inputs, make_mask, randn, rows_that_see_nothing
from mha_lib import (KVCache, LatentCache, MultiHeadAttention, MultiHeadLatentAttention, apply_rotary, causal_mask,
                     kv_cache_bytes, latent_cache_bytes, sliding_window_mask)

SHAPES = [  # (B, Lq, Lk, d_model, H, d_latent)
    (2, 5, 5, 32, 4, 12),
    (1, 3, 7, 24, 3, 40),  # a latent wider than d_model: no compression, still exact
    (3, 1, 6, 16, 8, 4),
]
MASKS = ["none", "causal", "padding", "per_head", "float"]


def make(d_model, H, d_latent, d_rope=0, dtype=torch.float64, device="cpu", bias=True, seed=3):
    torch.manual_seed(seed)
    return MultiHeadLatentAttention(d_model, H, d_latent, bias=bias, d_rope=d_rope).to(device, dtype).eval()


def by_hand(m, query, memory, mask):
    """MLA written out: the latent, every head's keys and values up-projected from it, PyTorch's attention."""
    B, Lq, _ = query.shape
    H, d_k = m.num_heads, m.d_k

    def heads(t, width):  # (B, L, H·width) -> (B, H, L, width)
        return t.view(B, t.size(1), H, width).permute(0, 2, 1, 3)

    latent = F.linear(memory, m.W_dkv.weight, m.W_dkv.bias)  # (B, Lk, d_latent)
    q = heads(F.linear(query, m.W_q.weight, m.W_q.bias), d_k)
    k, v = heads(latent @ m.W_uk.weight.T, d_k), heads(latent @ m.W_uv.weight.T, d_k)
    if m.d_rope:  # rotated extra features: per head for the queries, one shared key
        q = torch.cat([q, apply_rotary(heads(query @ m.W_qr.weight.T, m.d_rope))], dim=-1)
        k_rope = apply_rotary(memory @ m.W_kr.weight.T)[:, None].expand(B, H, -1, -1)
        k = torch.cat([k, k_rope], dim=-1)  # the default scale: 1 / √(d_k + d_rope)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, Lq, d_k)
    return F.linear(out.permute(0, 2, 1, 3).reshape(B, Lq, H * d_k), m.W_o.weight, m.W_o.bias)


# --- against independent formulations ----------------------------------------------------


@pytest.mark.parametrize("absorb", [False, True], ids=["unabsorbed", "absorbed"])
@pytest.mark.parametrize("d_rope", [0, 4], ids=["no_rope", "decoupled_rope"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_equals_keys_and_values_built_by_hand_and_pytorch_attention(shape, mask_kind, d_rope, absorb, device):
    B, Lq, Lk, D, H, d_latent = shape
    m = make(D, H, d_latent, d_rope, device=device)
    query = randn(B, Lq, D, device=device, dtype=torch.float64)
    memory = randn(B, Lk, D, device=device, dtype=torch.float64)
    mask = make_mask(mask_kind, B, H, Lq, Lk, device)
    out = m(query, memory, memory, mask, absorb=absorb)
    assert out.shape == (B, Lq, D)
    torch.testing.assert_close(out, by_hand(m, query, memory, mask), **TOLERANCES[torch.float64])


@pytest.mark.parametrize("absorb", [False, True], ids=["unabsorbed", "absorbed"])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "per_head"])
def test_an_uncompressed_latent_without_biases_is_multi_head_attention(mask_kind, absorb):
    """d_latent = H·d_k, W_dkv = I, W_uk = W_k, W_uv = W_v: exactly MultiHeadAttention."""
    D, H, L = 24, 4, 6
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, bias=False).double().eval()
    mla = make(D, H, D, bias=False)
    with torch.no_grad():
        mla.W_dkv.weight.copy_(torch.eye(D))
        for ours, theirs in (("W_q", "W_q"), ("W_uk", "W_k"), ("W_uv", "W_v"), ("W_o", "W_o")):
            getattr(mla, ours).weight.copy_(getattr(mha, theirs).weight)
    x = randn(2, L, D, dtype=torch.float64)
    mask = make_mask(mask_kind, 2, H, L, L, "cpu")
    out, weights = mla(x, x, x, mask, return_weights=True, absorb=absorb)
    ref_out, ref_weights = mha(x, x, x, mask, return_weights=True)
    torch.testing.assert_close(out, ref_out, **TOLERANCES[torch.float64])
    torch.testing.assert_close(weights, ref_weights, **TOLERANCES[torch.float64])


@pytest.mark.parametrize("absorb", [False, True], ids=["unabsorbed", "absorbed"])
def test_a_latent_that_stacks_keys_and_values_is_multi_head_attention_with_biases(absorb):
    """d_latent = 2·d_model, W_dkv = [W_k; W_v] with their biases, W_uk = [I 0], W_uv = [0 I]."""
    D, H, L = 16, 2, 5
    torch.manual_seed(1)
    mha = MultiHeadAttention(D, H).double().eval()
    mla = make(D, H, 2 * D)
    eye, zero = torch.eye(D, dtype=torch.float64), torch.zeros(D, D, dtype=torch.float64)
    with torch.no_grad():
        mla.W_dkv.weight.copy_(torch.cat([mha.W_k.weight, mha.W_v.weight]))
        mla.W_dkv.bias.copy_(torch.cat([mha.W_k.bias, mha.W_v.bias]))
        mla.W_uk.weight.copy_(torch.cat([eye, zero], dim=1))
        mla.W_uv.weight.copy_(torch.cat([zero, eye], dim=1))
        for name in ("W_q", "W_o"):
            getattr(mla, name).load_state_dict(getattr(mha, name).state_dict())
    x = randn(3, L, D, dtype=torch.float64)
    torch.testing.assert_close(mla(x, x, x, causal_mask(L), absorb=absorb), mha(x, x, x, causal_mask(L)),
                               **TOLERANCES[torch.float64])


# --- absorption -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("d_rope", [0, 4, 8], ids=lambda r: f"d_rope={r}")
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_absorbed_equals_unabsorbed(shape, mask_kind, d_rope, dtype, device):
    B, Lq, Lk, D, H, d_latent = shape
    m = make(D, H, d_latent, d_rope, dtype=dtype, device=device)
    query, memory = randn(B, Lq, D, device=device, dtype=dtype), randn(B, Lk, D, device=device, dtype=dtype)
    mask = make_mask(mask_kind, B, H, Lq, Lk, device)
    out, weights = m(query, memory, memory, mask, return_weights=True)
    out_absorbed, weights_absorbed = m(query, memory, memory, mask, return_weights=True, absorb=True)
    assert out_absorbed.dtype == dtype and weights_absorbed.shape == (B, H, Lq, Lk)
    torch.testing.assert_close(out_absorbed, out, **TOLERANCES[dtype])
    torch.testing.assert_close(weights_absorbed, weights, **TOLERANCES[dtype])


def test_the_absorbed_path_never_up_projects_and_the_unabsorbed_one_does():
    m = make(32, 4, 8)
    calls = []
    for name in ("W_uk", "W_uv"):
        getattr(m, name).register_forward_hook(lambda module, args, out, name=name: calls.append((name, args[0].shape)))
    x = randn(2, 9, 32, dtype=torch.float64)
    m(x, x, x, absorb=True)
    assert calls == []
    m(x, x, x)
    assert calls == [("W_uk", (2, 9, 8)), ("W_uv", (2, 9, 8))]  # every token's latent, up-projected


def test_absorbed_weights_fold_the_up_projections():
    m = make(24, 3, 10)
    W_uk, W_ov = m.absorbed_weights()
    assert W_uk.shape == (3, 8, 10) and W_ov.shape == (24, 3, 10)
    c = randn(10, dtype=torch.float64)
    head = 1
    k_head = (m.W_uk.weight @ c)[head * 8 : (head + 1) * 8]  # head 1's key for the latent c
    torch.testing.assert_close(W_uk[head] @ c, k_head)
    v = m.W_uv.weight @ c  # every head's value for the latent c, side by side
    torch.testing.assert_close(W_ov.sum(1) @ c, m.W_o.weight @ v)  # W_o applied to the values, in one fold


def test_absorbed_gradients_equal_unabsorbed_gradients():
    m = make(16, 2, 6, d_rope=4)
    x = randn(2, 5, 16, dtype=torch.float64)
    grads = []
    for absorb in (False, True):
        m.zero_grad()
        m(x, x, x, causal_mask(5), absorb=absorb).square().sum().backward()
        grads.append({name: p.grad.clone() for name, p in m.named_parameters()})
    assert set(grads[0]) == {"W_q.weight", "W_q.bias", "W_dkv.weight", "W_dkv.bias", "W_uk.weight", "W_uv.weight",
                             "W_o.weight", "W_o.bias", "W_qr.weight", "W_kr.weight"}
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], **TOLERANCES[torch.float64])


@pytest.mark.parametrize("absorb", [False, True], ids=["unabsorbed", "absorbed"])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32], ids=["bool", "float"])
def test_a_query_that_sees_no_key_gets_a_zero_head_output(mask_dtype, absorb):
    m = make(16, 2, 6, dtype=torch.float32)
    allowed, mask = rows_that_see_nothing(2, 5, 5, mask_dtype, "cpu")
    x = randn(2, 5, 16)
    out, weights = m(x, x, x, mask, return_weights=True, absorb=absorb)
    assert not out.isnan().any() and (weights[0, :, 1] == 0).all() and (weights[1, :, 3] == 0).all()
    torch.testing.assert_close(out[0, 1], m.W_o.bias)  # no head contributes: only W_o's bias is left
    assert (weights[0, :, 0] > 0).all()


# --- decoding with a LatentCache ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("schedule", [[1] * 8, [3, 1, 4], [5, 1, 1, 1], [8]], ids=str)
@pytest.mark.parametrize("d_rope", [0, 4], ids=["no_rope", "decoupled_rope"])
@pytest.mark.parametrize("absorb", [False, True], ids=["unabsorbed", "absorbed"])
def test_decoding_with_a_latent_cache_equals_the_full_causal_forward(absorb, d_rope, schedule, dtype, device):
    B, L, D, H, d_latent = 2, 8, 32, 4, 12
    m = make(D, H, d_latent, d_rope, dtype=dtype, device=device)
    x = randn(B, L, D, device=device, dtype=dtype)
    expected = m(x, x, x, causal_mask(L, device=device))
    cache, outputs, start = LatentCache(), [], 0
    with torch.no_grad():
        for n in schedule:
            chunk = x[:, start : start + n]
            outputs.append(m(chunk, chunk, chunk, cache=cache, absorb=absorb))
            start += n
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, **TOLERANCES[dtype])
    assert len(cache) == L and cache.latent.shape == (B, L, d_latent)
    assert (cache.rope_keys is None) if d_rope == 0 else cache.rope_keys.shape == (B, L, d_rope)
    assert cache.nbytes == B * L * (d_latent + d_rope) * x.element_size()
    assert cache.nbytes == latent_cache_bytes(1, d_latent, L, batch=B, d_rope=d_rope,
                                              bytes_per_element=x.element_size())


def test_the_cache_holds_the_latents_and_the_rotated_rope_keys_only():
    m = make(32, 4, 6, d_rope=4)
    x = randn(1, 7, 32, dtype=torch.float64)
    cache = LatentCache()
    with torch.no_grad():
        for t in range(7):  # both paths fill one cache
            m(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=cache, absorb=t % 2 == 1)
        torch.testing.assert_close(cache.latent, m.W_dkv(x))
        torch.testing.assert_close(cache.rope_keys, apply_rotary(m.W_kr(x)))
    tensors = {name for name, value in vars(cache).items() if isinstance(value, torch.Tensor)}
    assert tensors == {"latent", "rope_keys"}
    # 10 numbers a token, where a KVCache of this layer's 4 heads of 8 would hold 2 · 4 · 8 = 64
    assert cache.nbytes * 64 == kv_cache_bytes(1, 4, 8, 7, bytes_per_element=8) * 10


@pytest.mark.parametrize("absorb", [False, True], ids=["unabsorbed", "absorbed"])
def test_decoding_with_a_window_mask_equals_the_windowed_forward(absorb):
    m = make(16, 2, 6, d_rope=2)
    L, window = 9, 3
    x = randn(1, L, 16, dtype=torch.float64)
    expected = m(x, x, x, sliding_window_mask(L, window))
    cache = LatentCache()
    prompt = m(x[:, :4], x[:, :4], x[:, :4], sliding_window_mask(4, window), cache=cache, absorb=absorb)
    steps = [m(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], sliding_window_mask(t + 1, window)[-1:],
               cache=cache, absorb=absorb) for t in range(4, L)]
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), expected, **TOLERANCES[torch.float64])


def test_reset_empties_the_cache_for_a_new_sequence():
    m = make(16, 2, 6)
    cache = LatentCache()
    x = randn(1, 4, 16, dtype=torch.float64)
    m(x, x, x, cache=cache)
    assert len(cache) == 4 and cache.nbytes == 4 * 6 * 8
    cache.reset()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.latent is None
    y = randn(1, 3, 16, dtype=torch.float64)
    torch.testing.assert_close(m(y, y, y, cache=cache), m(y, y, y, causal_mask(3)))


# --- sizes and numbers ------------------------------------------------------------------


def test_numpy_sizes_are_accepted():
    m = MultiHeadLatentAttention(np.int64(16), np.int32(4), np.int64(6), d_rope=np.int64(2))
    assert (m.d_model, m.num_heads, m.d_latent, m.d_rope, m.d_k) == (16, 4, 6, 2, 4)
    assert all(type(n) is int for n in (m.d_model, m.num_heads, m.d_latent, m.d_rope))
    assert m.W_dkv.weight.shape == (6, 16) and m.W_uk.weight.shape == (16, 6) and m.W_qr.weight.shape == (8, 16)
    assert "d_latent=6" in repr(m) and "d_rope=2" in repr(m)


def test_latent_cache_bytes_for_deepseek_v2():
    per_token_layer = latent_cache_bytes(num_layers=1, d_latent=512, seq_len=1, d_rope=64, bytes_per_element=1)
    mha = kv_cache_bytes(num_layers=1, num_kv_heads=128, d_k=128, seq_len=1, bytes_per_element=1)
    assert (per_token_layer, mha) == (576, 32_768)
    assert latent_cache_bytes(60, 512, 4096, batch=2, d_rope=64) == 60 * 2 * 4096 * 576 * 2
    assert latent_cache_bytes(3, 8, 0) == 0


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(d_latent=0), ValueError, r"d_latent must be a positive int, got 0"),
        (dict(d_latent=4.0), ValueError, r"d_latent must be a positive int, got 4\.0 \(a float\); write 4"),
        (dict(d_latent=True), ValueError, r"d_latent must be a positive int, got True \(a bool\)"),
        (dict(d_latent="4"), ValueError, r"d_latent must be a positive int, got '4' \(a str\)"),
        (dict(d_latent=4, d_rope=3), ValueError, r"d_rope must be an even int >= 0 .* got 3"),
        (dict(d_latent=4, d_rope=-2), ValueError, r"d_rope must be an even int >= 0 .* got -2"),
        (dict(d_latent=4, d_rope=2.5), ValueError, r"d_rope must be an even int >= 0, got 2\.5"),
        (dict(d_latent=4, bias="no"), ValueError, r"bias must be True or False, got 'no'"),
        (dict(d_latent=4, dropout=1.0), ValueError, r"dropout must be in \[0, 1\), got 1\.0"),
    ],
)
def test_a_bad_configuration_fails_at_construction(kwargs, error, message):
    with pytest.raises(error, match=message):
        MultiHeadLatentAttention(16, 4, **kwargs)


def test_bad_sizes_name_the_argument():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        MultiHeadLatentAttention(10, 4, 6)
    with pytest.raises(ValueError, match=r"latent_cache_bytes expects sizes >= 0, .*negative: \['seq_len'\]"):
        latent_cache_bytes(1, 8, -1)
    with pytest.raises(ValueError, match=r"d_latent must be an int >= 0, got 8\.0"):
        latent_cache_bytes(1, 8.0, 4)


def test_bad_query_key_value_are_refused_as_by_the_other_modules():
    assert_rejects_bad_inputs(MultiHeadLatentAttention(8, 2, 4))


def test_bad_forward_arguments_are_refused_with_a_message():
    m = make(16, 2, 6, dtype=torch.float32)
    x, y = randn(2, 5, 16), randn(2, 5, 16)
    with pytest.raises(ValueError, match="builds keys and values from one latent: pass one tensor as key and value"):
        m(x, x, y)
    with pytest.raises(TypeError, match=r"cache must be a mha_lib.LatentCache .*got KVCache"):
        m(x, x, x, cache=KVCache())
    with pytest.raises(ValueError, match="absorb must be True or False, got 'yes'"):
        m(x, x, x, absorb="yes")
    with pytest.raises(ValueError, match=r"mask of shape \(5, 4\) does not broadcast .*\(2, 2, 5, 5\)"):
        m(x, x, x, torch.ones(5, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="self-attention only"):
        m(x, y, y, cache=LatentCache())
    with pytest.raises(TypeError, match=r"dtype torch.float64 but the module's weights are torch.float32"):
        m(x.double(), x.double(), x.double())


def test_a_cache_serves_one_layer_and_one_kind_of_module():
    a, b = make(16, 2, 6), make(16, 2, 6, seed=4)
    x = randn(1, 3, 16, dtype=torch.float64)
    cache = LatentCache()
    a(x, x, x, cache=cache)
    with pytest.raises(ValueError, match="holds another layer's latents: use one LatentCache per layer"):
        b(x, x, x, cache=cache)
    wider = make(16, 2, 8)
    cache = LatentCache()
    wider(x, x, x, cache=cache)
    with pytest.raises(ValueError, match=r"holds \(B, d_latent, d_rope, dtype, device\) = \(1, 8, None"):
        cache.update(randn(1, 1, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="a LatentCache serves MultiHeadLatentAttention .*takes a KVCache"):
        MultiHeadAttention(16, 2).double()(x, x, x, cache=LatentCache())
