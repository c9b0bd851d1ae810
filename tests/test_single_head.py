"""AttentionHead against F.scaled_dot_product_attention and nn.MultiheadAttention(num_heads=1)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from conftest import (
    TOLERANCES,
    assert_matches_torch_mha,
    assert_rejects_bad_inputs,
    causal,
    randn,
    random_lengths,
    reference_weights,
    torch_twin,
)
from mha_lib import AttentionHead, MultiHeadAttention, causal_mask, padding_mask

CASES = [  # (B, Lq, Lk, d_model, d_k, d_v)
    (2, 5, 5, 16, 8, 8),  # self-attention shapes
    (3, 4, 7, 12, 6, 10),  # cross-attention, d_v > d_k
    (1, 1, 6, 8, 8, 3),  # a single query, d_v < d_k
    (4, 6, 6, 10, 3, 5),
]
MASKS = [None, "causal", "padding"]


def case_id(case):
    return "B{}_Lq{}_Lk{}_D{}_dk{}_dv{}".format(*case)


def make_inputs(B, Lq, Lk, d_model, dtype, device):
    """Distinct query, key and value tensors, so that a swapped projection shows."""
    return (randn(B, L, d_model, device=device, dtype=dtype) for L in (Lq, Lk, Lk))


def make_mask(kind, B, Lq, Lk, device):
    """A mask for scores (B, Lq, Lk), True = may attend; no row is fully blocked."""
    if kind is None:
        return None
    if kind == "causal":  # (Lq, Lk)
        return causal(Lq, Lk, device)
    if kind == "padding":  # (B, 1, Lk)
        return padding_mask(random_lengths(B, Lk), max_len=Lk)[:, 0].to(device)
    raise ValueError(kind)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask_kind", MASKS, ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_matches_torch_sdpa_on_own_projections(case, mask_kind, dtype, device):
    B, Lq, Lk, D, d_k, d_v = case
    head = AttentionHead(D, d_k, d_v).to(device, dtype)
    query, key, value = make_inputs(B, Lq, Lk, D, dtype, device)
    mask = make_mask(mask_kind, B, Lq, Lk, device)

    out, weights = head(query, key, value, mask=mask, return_weights=True)

    # The reference projects explicitly (x Wᵀ + b), then lets PyTorch attend.
    q = query @ head.W_q.weight.T + head.W_q.bias  # (B, Lq, d_k)
    k = key @ head.W_k.weight.T + head.W_k.bias  # (B, Lk, d_k)
    v = value @ head.W_v.weight.T + head.W_v.bias  # (B, Lk, d_v)
    assert out.shape == (B, Lq, d_v) and weights.shape == (B, Lq, Lk)
    assert out.dtype == weights.dtype == dtype
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TOLERANCES[dtype])
    torch.testing.assert_close(weights, reference_weights(q, k, mask), **TOLERANCES[dtype])
    if mask is not None:
        assert (weights.masked_select(~mask.expand(B, Lq, Lk)) == 0).all()


def twin_heads(d_model, dtype, device, bias=True):
    """Our head with d_k = d_v = d_model, and nn.MultiheadAttention(num_heads=1) holding
    the same projections and an identity output projection."""
    return torch_twin(AttentionHead(d_model, d_model, bias=bias), dtype, device)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mask_kind", MASKS, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("case", [(2, 5, 5, 8), (3, 4, 7, 12), (1, 1, 3, 6)], ids=lambda c: "B{}_Lq{}_Lk{}_D{}".format(*c))
def test_matches_nn_multihead_attention_with_one_head(case, bias, mask_kind, dtype, device):
    B, Lq, Lk, D = case
    ours, theirs = twin_heads(D, dtype, device, bias)
    query, key, value = make_inputs(B, Lq, Lk, D, dtype, device)

    # The same mask in both conventions: ours True = may attend, theirs True = blocked.
    kwargs, mask = {}, None
    if mask_kind == "causal":
        mask = make_mask("causal", B, Lq, Lk, device)  # (Lq, Lk)
        kwargs["attn_mask"] = ~mask
    elif mask_kind == "padding":
        keep = padding_mask(random_lengths(B, Lk), max_len=Lk).to(device)  # (B, 1, 1, Lk)
        mask = keep[:, 0]  # (B, 1, Lk)
        kwargs["key_padding_mask"] = ~keep[:, 0, 0]  # (B, Lk)

    weights = assert_matches_torch_mha(ours, theirs, query, key, value, mask, **kwargs)
    assert weights.shape == (B, Lq, Lk)


def test_heads_side_by_side_are_multi_head_attention(device):
    """H heads, each holding its slice of MultiHeadAttention's projections, concatenated
    and passed through W_o, give the multi-head module's output and per-head weights."""
    B, L, D, H = 2, 6, 12, 3
    d_k = D // H
    mha = MultiHeadAttention(D, H).to(device, torch.float64).eval()
    x = torch.randn(B, L, D, dtype=torch.float64).to(device)
    mask = causal_mask(L, device=device)
    heads = []
    for h in range(H):
        head = AttentionHead(D, d_k).to(device, torch.float64)
        rows = slice(h * d_k, (h + 1) * d_k)
        with torch.no_grad():
            for name in ("W_q", "W_k", "W_v"):
                getattr(head, name).weight.copy_(getattr(mha, name).weight[rows])
                getattr(head, name).bias.copy_(getattr(mha, name).bias[rows])
        heads.append(head)

    results = [head(x, x, x, mask=mask, return_weights=True) for head in heads]
    out = mha.W_o(torch.cat([o for o, _ in results], dim=-1))  # (B, L, H * d_k)
    ref_out, ref_weights = mha(x, x, x, mask=mask, return_weights=True)

    torch.testing.assert_close(out, ref_out, **TOLERANCES[torch.float64])
    for h, (_, weights) in enumerate(results):
        torch.testing.assert_close(weights, ref_weights[:, h], **TOLERANCES[torch.float64])


def test_self_attention_is_permutation_equivariant(device):
    """Without a mask, shuffling the tokens shuffles the outputs the same way."""
    B, L, D = 3, 7, 8
    head = AttentionHead(D, 4, 5).to(device, torch.float64)
    x = torch.randn(B, L, D, dtype=torch.float64).to(device)
    perm = torch.randperm(L, device=device)
    assert not torch.equal(perm, torch.arange(L, device=device))

    out, weights = head(x, x, x, return_weights=True)
    out_p, weights_p = head(x[:, perm], x[:, perm], x[:, perm], return_weights=True)

    torch.testing.assert_close(out_p, out[:, perm], **TOLERANCES[torch.float64])
    torch.testing.assert_close(weights_p, weights[:, perm][:, :, perm], **TOLERANCES[torch.float64])
    # ... and the shuffled outputs really are in a different order.
    assert not torch.allclose(out_p, out)


def test_causal_mask_breaks_permutation_equivariance(device):
    """A causal mask depends on positions, so shuffling no longer just shuffles the outputs."""
    L, D = 5, 8
    head = AttentionHead(D, 4).to(device, torch.float64)
    x = torch.randn(1, L, D, dtype=torch.float64).to(device)
    perm = torch.arange(L - 1, -1, -1, device=device)
    mask = causal_mask(L, device=device)
    out = head(x, x, x, mask=mask)
    out_p = head(x[:, perm], x[:, perm], x[:, perm], mask=mask)
    assert not torch.allclose(out_p, out[:, perm])


def test_output_of_one_query_ignores_the_order_of_the_keys(device):
    B, Lq, Lk, D = 2, 3, 6, 8
    head = AttentionHead(D, 4).to(device, torch.float64)
    query, key, value = make_inputs(B, Lq, Lk, D, torch.float64, device)
    perm = torch.randperm(Lk, device=device)
    out = head(query, key, value)
    out_p = head(query, key[:, perm], value[:, perm])
    torch.testing.assert_close(out_p, out, **TOLERANCES[torch.float64])


def test_weights_are_a_softmax_over_the_keys(device):
    B, L, D = 2, 5, 8
    head = AttentionHead(D, 4).to(device)
    x = torch.randn(B, L, D).to(device)
    out, weights = head(x, x, x, return_weights=True)
    assert (weights > 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, L, device=device))
    torch.testing.assert_close(out, weights @ head.W_v(x))


def test_fully_masked_query_gets_zeros_not_nan(device):
    head = AttentionHead(8, 4).to(device, torch.float64)
    x = torch.randn(2, 4, 8, dtype=torch.float64).to(device)
    keep = torch.ones(4, 4, dtype=torch.bool, device=device)
    keep[2] = False  # query 2 may attend to nothing
    out, weights = head(x, x, x, mask=keep, return_weights=True)
    assert torch.isfinite(out).all()
    assert (weights[:, 2] == 0).all() and (out[:, 2] == 0).all()


def test_return_weights_false_returns_only_the_output():
    head = AttentionHead(8, 4, 6)
    x = torch.randn(2, 5, 8)
    out = head(x, x, x)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 5, 6)


@pytest.mark.parametrize("bias", [True, False])
def test_parameter_shapes_and_count(bias):
    D, d_k, d_v = 16, 6, 10
    head = AttentionHead(D, d_k, d_v, bias=bias)
    assert head.W_q.weight.shape == head.W_k.weight.shape == (d_k, D)
    assert head.W_v.weight.shape == (d_v, D)
    assert sum(p.numel() for p in head.parameters()) == D * (2 * d_k + d_v) + bias * (2 * d_k + d_v)
    assert (head.W_q.bias is None) == (not bias)
    assert AttentionHead(D, d_k).d_v == d_k  # d_v defaults to d_k


def test_gradcheck_inputs_and_weights():
    """Gradients with respect to the inputs and to every projection, in float64."""
    torch.manual_seed(0)
    head = AttentionHead(5, 3, 2).double()
    names = [name for name, _ in head.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in head.parameters())
    query = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 4, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, True, True, False])  # the last key is padding

    def f(q, kv, *weights):
        return functional_call(head, dict(zip(names, weights)), (q, kv, kv), {"mask": mask})

    assert torch.autograd.gradcheck(f, (query, memory, *params))


def test_every_parameter_gets_a_gradient():
    head = AttentionHead(8, 4, 3)
    x = torch.randn(2, 5, 8)
    head(x, x, x).pow(2).sum().backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 4), r"d_model must be a positive int, got 0"),
        ((8, -1), r"d_k must be a positive int, got -1"),
        ((8, 4, 2.5), r"d_v must be a positive int, got 2.5"),
        ((8, True), r"d_k must be a positive int, got True"),
    ],
)
def test_constructor_errors(args, message):
    with pytest.raises(ValueError, match=message):
        AttentionHead(*args)


def test_input_errors_name_the_shapes():
    assert_rejects_bad_inputs(AttentionHead(8, 4))


def test_mask_errors():
    head = AttentionHead(8, 4)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"at most 3 dimensions, got \(2, 1, 1, 5\).*padding_mask\(lengths\)\[:, 0\]"):
        head(x, x, x, mask=padding_mask([5, 3]))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 3\) does not broadcast .* \(2, 5, 5\)"):
        head(x, x, x, mask=torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"torch.int64"):
        head(x, x, x, mask=torch.ones(5, 5, dtype=torch.long))
    # The suggested fix works.
    out = head(x, x, x, mask=padding_mask([5, 3])[:, 0])
    assert out.shape == (2, 5, 4)
