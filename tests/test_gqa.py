"""Grouped-query and multi-query attention (num_kv_heads) in both modules, and repeat_kv."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import TOLERANCES, weight_shaped_inputs
from mha_lib import (EfficientMultiHeadAttention, MultiHeadAttention, causal_mask, combine_heads, padding_mask,
                     repeat_kv)

CONFIGS = [  # (d_model, H, H_kv): GQA, MQA, and plain MHA
    (16, 4, 2),
    (32, 8, 2),
    (24, 6, 1),
    (16, 4, 4),
    (8, 1, 1),
]
MODULES = ["teaching", "efficient"]


def make(kind, d_model, H, H_kv, dtype=torch.float64, device="cpu", **kwargs):
    torch.manual_seed(1)
    module = MultiHeadAttention(d_model, H, num_kv_heads=H_kv, **kwargs).to(device, dtype).eval()
    return module if kind == "teaching" else EfficientMultiHeadAttention.from_module(module)


def projections(module, query, key, value):
    """W_q query, W_k key, W_v value of either module, as (B, L, features)."""
    if not isinstance(module, EfficientMultiHeadAttention):
        return module.W_q(query), module.W_k(key), module.W_v(value)
    w_q, w_k, w_v = module.W_qkv.weight.split(module.qkv_sizes)
    b_q, b_k, b_v = module.W_qkv.bias.split(module.qkv_sizes)
    return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)


def torch_gqa(module, query, key, value, mask=None):
    """The same projections, then PyTorch's own F.scaled_dot_product_attention(enable_gqa=True)."""
    q, k, v = projections(module, query, key, value)
    B, H, H_kv, d_k = q.size(0), module.num_heads, module.num_kv_heads, module.d_k
    q = q.view(B, -1, H, d_k).transpose(1, 2)  # (B, H, Lq, d_k)
    k = k.view(B, -1, H_kv, d_k).transpose(1, 2)  # (B, H_kv, Lk, d_k)
    v = v.view(B, -1, H_kv, d_k).transpose(1, 2)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return module.W_o(combine_heads(heads))


def make_mask(kind, B, Lq, Lk, device):
    if kind == "none":
        return None
    if kind == "causal":
        return torch.ones(Lq, Lk, dtype=torch.bool, device=device).tril(diagonal=Lk - Lq)
    return padding_mask([Lk] + [max(1, Lk - 1 - b) for b in range(B - 1)], max_len=Lk).to(device)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "D{}_H{}_Hkv{}".format(*c))
@pytest.mark.parametrize("kind", MODULES)
def test_matches_torch_sdpa_with_enable_gqa(kind, config, mask_kind, dtype, device):
    D, H, H_kv = config
    module = make(kind, D, H, H_kv, dtype, device)
    B, Lq, Lk = 3, 5, 7
    for query, key, value in [
        [torch.randn(B, Lk, D, dtype=torch.float64).to(device, dtype)] * 3,  # self-attention
        [torch.randn(B, L, D, dtype=torch.float64).to(device, dtype) for L in (Lq, Lk, Lk)],  # cross
    ]:
        mask = make_mask(mask_kind, B, query.size(1), Lk, device)
        expected = torch_gqa(module, query, key, value, mask)
        out, weights = module(query, key, value, mask, return_weights=True)
        assert weights.shape == (B, H, query.size(1), Lk)
        torch.testing.assert_close(module(query, key, value, mask), expected, **TOLERANCES[dtype])
        torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("kind", MODULES)
def test_as_many_kv_heads_as_query_heads_is_the_plain_module(kind):
    cls = MultiHeadAttention if kind == "teaching" else EfficientMultiHeadAttention
    plain = cls(16, 4).double().eval()
    grouped = cls(16, 4, num_kv_heads=4).double().eval()
    grouped.load_state_dict(plain.state_dict())  # the same parameter shapes, the same weights
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(grouped(x, x, x, causal_mask(6)), plain(x, x, x, causal_mask(6)), atol=0, rtol=0)


@pytest.mark.parametrize("config", [(16, 4, 2), (32, 8, 2), (24, 6, 1)], ids=lambda c: "D{}_H{}_Hkv{}".format(*c))
def test_grouped_heads_equal_plain_heads_with_copied_key_value_weights(config):
    """GQA is MHA whose key/value heads come in identical groups: copy each key/value head's
    rows of W_k, W_v to the n_rep consecutive query heads of its group, and a plain module agrees."""
    D, H, H_kv = config
    grouped = make("teaching", D, H, H_kv)
    plain = MultiHeadAttention(D, H).double().eval()
    n_rep, d_k = H // H_kv, D // H
    with torch.no_grad():
        for name in ("W_q", "W_o"):
            getattr(plain, name).load_state_dict(getattr(grouped, name).state_dict())
        for name in ("W_k", "W_v"):
            w = getattr(grouped, name).weight.view(H_kv, 1, d_k, D).expand(H_kv, n_rep, d_k, D)
            b = getattr(grouped, name).bias.view(H_kv, 1, d_k).expand(H_kv, n_rep, d_k)
            getattr(plain, name).weight.copy_(w.reshape(D, D))
            getattr(plain, name).bias.copy_(b.reshape(D))
    x = torch.randn(2, 6, D, dtype=torch.float64)
    out, weights = grouped(x, x, x, causal_mask(6), return_weights=True)
    ref, ref_weights = plain(x, x, x, causal_mask(6), return_weights=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(weights, ref_weights)
    assert weights.shape == (2, H, 6, 6)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "D{}_H{}_Hkv{}".format(*c))
def test_parameter_shapes(config):
    D, H, H_kv = config
    d_k = D // H
    teaching = MultiHeadAttention(D, H, num_kv_heads=H_kv)
    assert teaching.W_q.weight.shape == (D, D) and teaching.W_o.weight.shape == (D, D)
    assert teaching.W_k.weight.shape == teaching.W_v.weight.shape == (H_kv * d_k, D)
    fused = EfficientMultiHeadAttention.from_module(teaching)
    assert fused.W_qkv.weight.shape == (D + 2 * H_kv * d_k, D) and fused.W_qkv.bias.shape == (D + 2 * H_kv * d_k,)
    assert (fused.num_heads, fused.num_kv_heads) == (H, H_kv)
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in teaching.parameters())
    for module in (teaching, fused):  # said when it differs from the default
        assert (f"num_kv_heads={H_kv}" in repr(module)) == (H_kv != H)
    assert MultiHeadAttention(D, H).num_kv_heads == EfficientMultiHeadAttention(D, H).num_kv_heads == H


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("config", [(16, 4, 2), (24, 6, 1)], ids=lambda c: "D{}_H{}_Hkv{}".format(*c))
def test_efficient_matches_teaching_with_gradients(config, dtype, device):
    D, H, H_kv = config
    teaching = make("teaching", D, H, H_kv, dtype, device)
    fused = EfficientMultiHeadAttention.from_module(teaching)
    x1 = torch.randn(2, 7, D, dtype=torch.float64).to(device, dtype).requires_grad_(True)
    x2 = x1.detach().clone().requires_grad_(True)
    mask = causal_mask(7, device=device)
    out1, out2 = teaching(x1, x1, x1, mask), fused(x2, x2, x2, mask)
    torch.testing.assert_close(out2, out1, **TOLERANCES[dtype])
    upstream = torch.randn_like(out1)
    (out1 * upstream).sum().backward()
    (out2 * upstream).sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad, **TOLERANCES[dtype])
    expected = torch.cat([teaching.W_q.weight.grad, teaching.W_k.weight.grad, teaching.W_v.weight.grad])
    torch.testing.assert_close(fused.W_qkv.weight.grad, expected, **TOLERANCES[dtype])


def test_efficient_never_materialises_the_weights_with_grouped_heads():
    fused = make("efficient", 32, 8, 2, torch.float32).train()
    x = torch.randn(2, 37, 32)
    assert weight_shaped_inputs(lambda: fused(x, x, x, causal_mask(37)).sum().backward(), 37, 37) == []


# ---------------------------------------------------------------- repeat_kv
def test_repeat_kv_groups_consecutive_query_heads():
    x = torch.randn(2, 3, 5, 4)
    out = repeat_kv(x, 4)
    assert out.shape == (2, 12, 5, 4)
    for h in range(12):
        assert torch.equal(out[:, h], x[:, h // 4])  # query heads 0-3 share kv head 0, 4-7 head 1, ...
    assert torch.equal(out, x.repeat_interleave(4, dim=1))
    assert not torch.equal(out, x.repeat(1, 4, 1, 1))  # tiling would give head h the kv head h % 3
    assert repeat_kv(x, 1) is x


def test_repeat_kv_refuses_bad_input():
    with pytest.raises(ValueError, match=r"\(B, H_kv, L, d_k\), got shape \(3, 5, 4\)"):
        repeat_kv(torch.randn(3, 5, 4), 2)
    for n_rep in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="n_rep must be a positive int"):
            repeat_kv(torch.randn(1, 2, 3, 4), n_rep)


@pytest.mark.parametrize("cls", [MultiHeadAttention, EfficientMultiHeadAttention])
def test_num_kv_heads_must_divide_num_heads(cls):
    with pytest.raises(ValueError, match="num_kv_heads=3 does not divide num_heads=8"):
        cls(32, 8, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads=16 does not divide num_heads=8"):
        cls(32, 8, num_kv_heads=16)
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="num_kv_heads must be a positive int"):
            cls(32, 8, num_kv_heads=bad)
