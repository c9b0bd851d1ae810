"""EfficientMultiHeadAttention against the teaching MultiHeadAttention and nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import TOLERANCES, assert_matches_torch_mha, assert_rejects_bad_inputs, causal, randn, torch_twin
from mha_lib import EfficientMultiHeadAttention, MultiHeadAttention, causal_mask, padding_mask

DTYPES = [torch.float64, torch.float32, torch.bfloat16]


def twin_modules(d_model, num_heads, dtype, device, bias=True, dropout=0.0):
    """The teaching module and its fused copy, holding the same weights."""
    teaching = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias).to(device, dtype).eval()
    return teaching, EfficientMultiHeadAttention.from_module(teaching)


def make_inputs(kind, B, Lq, Lk, D, device, dtype):
    """(query, key, value) for self-attention (one tensor), cross-attention to one memory
    (key is value), or three different tensors; each takes a different projection path."""
    if kind == "self":
        x = randn(B, Lq, D, device=device, dtype=dtype)
        return x, x, x
    query = randn(B, Lq, D, device=device, dtype=dtype)
    if kind == "memory":
        memory = randn(B, Lk, D, device=device, dtype=dtype)
        return query, memory, memory
    return query, randn(B, Lk, D, device=device, dtype=dtype), randn(B, Lk, D, device=device, dtype=dtype)


def make_mask(kind, B, H, Lq, Lk, device):
    if kind == "none":
        return None
    if kind == "causal":  # query i sees keys 0 … i + (Lk - Lq): the last query sees everything
        return causal(Lq, Lk, device)
    if kind == "padding":
        return padding_mask([Lk] + [max(1, Lk - 2 - b) for b in range(B - 1)], max_len=Lk).to(device)
    if kind == "per_head":  # (H, Lq, Lk): each head sees its own random half of the keys
        mask = torch.rand(H, Lq, Lk) < 0.5
        mask[..., 0] = True  # no fully masked rows here (they have their own test)
        return mask.to(device)
    if kind == "float":  # added to the scores; -inf blocks
        mask = torch.randn(Lq, Lk, dtype=torch.float64)
        mask[torch.rand(Lq, Lk) < 0.3] = float("-inf")
        mask[:, 0] = 0.0
        return mask.to(device)
    raise ValueError(kind)


CASES = [  # (inputs, B, Lq, Lk, d_model, H)
    ("self", 2, 5, 5, 16, 4),
    ("self", 3, 9, 9, 24, 3),
    ("memory", 2, 4, 7, 16, 2),
    ("distinct", 3, 6, 3, 12, 1),
    ("distinct", 1, 1, 6, 8, 8),
]
MASKS = ["none", "causal", "padding", "per_head", "float"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}_B{}_Lq{}_Lk{}_D{}_H{}".format(*c))
def test_matches_teaching_module(case, mask_kind, dtype, device):
    kind, B, Lq, Lk, D, H = case
    teaching, fused = twin_modules(D, H, dtype, device)
    query, key, value = make_inputs(kind, B, Lq, Lk, D, device, dtype)
    mask = make_mask(mask_kind, B, H, Lq, Lk, device)

    expected, expected_weights = teaching(query, key, value, mask, return_weights=True)
    out = fused(query, key, value, mask)
    out_w, weights = fused(query, key, value, mask, return_weights=True)

    assert out.shape == (B, Lq, D) and out.dtype == dtype and weights.shape == (B, H, Lq, Lk)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])
    torch.testing.assert_close(out_w, expected, **TOLERANCES[dtype])
    torch.testing.assert_close(weights, expected_weights, **TOLERANCES[dtype])


def leaf_copies(inputs):
    """Fresh leaves that keep the aliasing of ``inputs`` (query is key is value stays so)."""
    copies: dict[int, torch.Tensor] = {}
    for x in inputs:
        copies.setdefault(id(x), x.detach().clone().requires_grad_(True))
    return [copies[id(x)] for x in inputs]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("kind", ["self", "memory", "distinct"])
def test_gradients_match_teaching_module(kind, dtype, device):
    B, Lq, Lk, D, H = 2, 5, 7 if kind != "self" else 5, 16, 4
    teaching, fused = twin_modules(D, H, dtype, device)
    inputs = make_inputs(kind, B, Lq, Lk, D, device, dtype)
    inputs, inputs_fused = leaf_copies(inputs), leaf_copies(inputs)
    mask = make_mask("padding", B, H, Lq, Lk, device)
    upstream = randn(B, Lq, D, device=device, dtype=dtype)

    (teaching(*inputs, mask) * upstream).sum().backward()
    (fused(*inputs_fused, mask) * upstream).sum().backward()

    tol = TOLERANCES[dtype]
    assert (inputs_fused[0] is inputs_fused[2]) == (kind == "self")
    for x, y in zip(inputs, inputs_fused):
        torch.testing.assert_close(y.grad, x.grad, **tol)
    W_qkv_grad = torch.cat([teaching.W_q.weight.grad, teaching.W_k.weight.grad, teaching.W_v.weight.grad])
    b_qkv_grad = torch.cat([teaching.W_q.bias.grad, teaching.W_k.bias.grad, teaching.W_v.bias.grad])
    torch.testing.assert_close(fused.W_qkv.weight.grad, W_qkv_grad, **tol)
    torch.testing.assert_close(fused.W_qkv.bias.grad, b_qkv_grad, **tol)
    torch.testing.assert_close(fused.W_o.weight.grad, teaching.W_o.weight.grad, **tol)
    torch.testing.assert_close(fused.W_o.bias.grad, teaching.W_o.bias.grad, **tol)


def test_gradcheck():
    fused = EfficientMultiHeadAttention(6, 2).double()
    q = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, True, True, False])
    assert torch.autograd.gradcheck(lambda a, b: fused(a, b, b, mask), (q, kv), fast_mode=True)
    assert torch.autograd.gradcheck(lambda a: fused(a, a, a, causal_mask(3)), (q,), fast_mode=True)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_fully_masked_rows_are_zero_not_nan(mask_dtype, device):
    """A query that may attend to nothing: zero weights, attention output 0 (so the module
    outputs W_o's bias), finite gradients, exactly as the teaching module."""
    B, Lq, Lk, D, H = 2, 4, 6, 16, 4
    teaching, fused = twin_modules(D, H, torch.float32, device)
    query, memory, _ = make_inputs("memory", B, Lq, Lk, D, device, torch.float32)
    allowed = torch.ones(B, 1, Lq, Lk, dtype=torch.bool)
    allowed[0, 0, 1] = False  # sequence 0, query 1 sees no key
    allowed[1, 0, 3] = False
    mask = allowed if mask_dtype == torch.bool else torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    mask = mask.to(device)

    q1 = query.clone().requires_grad_(True)
    q2 = query.clone().requires_grad_(True)
    expected = teaching(q1, memory, memory, mask)
    out = fused(q2, memory, memory, mask)

    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, **TOLERANCES[torch.float32])
    torch.testing.assert_close(out[0, 1], fused.W_o.bias, atol=1e-6, rtol=0)
    out.sum().backward()
    expected.sum().backward()
    assert torch.isfinite(q2.grad).all() and (q2.grad[0, 1] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in fused.parameters())
    torch.testing.assert_close(q2.grad, q1.grad, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("kind", ["self", "memory", "distinct"])
def test_bias_false(kind, device):
    teaching, fused = twin_modules(16, 4, torch.float64, device, bias=False)
    assert fused.W_qkv.bias is None and fused.W_o.bias is None
    assert sum(p.numel() for p in fused.parameters()) == 4 * 16 * 16
    inputs = make_inputs(kind, 2, 5, 6, 16, device, torch.float64)
    torch.testing.assert_close(fused(*inputs), teaching(*inputs), **TOLERANCES[torch.float64])


def test_dropout_only_in_training():
    teaching, fused = twin_modules(16, 4, torch.float32, "cpu", dropout=0.5)
    x = torch.randn(2, 10, 16)
    # evaluation: no dropout, the same function as the teaching module
    torch.testing.assert_close(fused(x, x, x), teaching(x, x, x), **TOLERANCES[torch.float32])
    fused.train()
    a, b = fused(x, x, x), fused(x, x, x)
    assert not torch.allclose(a, b), "training mode must drop attention weights at random"
    assert not torch.allclose(a, teaching(x, x, x))
    _, weights = fused(x, x, x, return_weights=True)
    _, eval_weights = teaching(x, x, x, return_weights=True)
    kept = weights != 0
    assert 0.3 < kept.float().mean() < 0.7  # about half dropped, the survivors scaled by 1 / (1 - p)
    torch.testing.assert_close(weights[kept], 2 * eval_weights[kept])
    # Dropout is unbiased: averaged over many draws, training ≈ evaluation.
    many = x[:1].expand(2000, -1, -1)  # 2000 independent draws of the dropout mask in one batch
    with torch.no_grad():
        mean = fused(many, many, many).mean(0)
    torch.testing.assert_close(mean, teaching(x[:1], x[:1], x[:1])[0], atol=0.02, rtol=0)
    fused.eval()
    torch.testing.assert_close(fused(x, x, x), fused(x, x, x), atol=0, rtol=0)


def test_from_module_copies_everything(device):
    teaching = MultiHeadAttention(16, 4, dropout=0.25, bias=True).to(device, torch.float64).train()
    fused = EfficientMultiHeadAttention.from_module(teaching)
    assert (fused.d_model, fused.num_heads, fused.d_k, fused.dropout) == (16, 4, 4, 0.25)
    assert fused.training and fused.W_qkv.weight.dtype == torch.float64
    assert fused.W_qkv.weight.device.type == torch.device(device).type
    assert fused.W_qkv.weight.shape == (48, 16)
    torch.testing.assert_close(fused.W_qkv.weight[16:32], teaching.W_k.weight, atol=0, rtol=0)
    # a copy, not a view: training one module leaves the other alone
    with torch.no_grad():
        teaching.W_v.weight.zero_()
    assert fused.W_qkv.weight[32:].abs().sum() > 0
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in teaching.parameters())


def twin_torch_modules(d_model, num_heads, dtype, device, bias=True):
    """Ours and nn.MultiheadAttention: its in_proj_weight has our W_qkv's layout exactly."""
    return torch_twin(EfficientMultiHeadAttention(d_model, num_heads, bias=bias), dtype, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}_B{}_Lq{}_Lk{}_D{}_H{}".format(*c))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_nn_multihead_attention(case, bias, dtype, device):
    kind, B, Lq, Lk, D, H = case
    fused, theirs = twin_torch_modules(D, H, dtype, device, bias)
    query, key, value = make_inputs(kind, B, Lq, Lk, D, device, dtype)
    assert_matches_torch_mha(fused, theirs, query, key, value)  # the explicit path, which has the weights
    torch.testing.assert_close(fused(query, key, value), theirs(query, key, value)[0], **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_masks_match_nn_multihead_attention(dtype, device):
    """Ours: True = may attend. nn.MultiheadAttention: True = blocked (attn_mask, key_padding_mask)."""
    B, L, D, H = 3, 6, 16, 4
    fused, theirs = twin_torch_modules(D, H, dtype, device)
    x = randn(B, L, D, device=device, dtype=dtype)
    allowed = causal_mask(L, device=device)
    keep = padding_mask([6, 4, 2], max_len=L).to(device)  # (B, 1, 1, L)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(fused(x, x, x, allowed), theirs(x, x, x, attn_mask=~allowed, need_weights=False)[0], **tol)
    torch.testing.assert_close(
        fused(x, x, x, keep), theirs(x, x, x, key_padding_mask=~keep[:, 0, 0], need_weights=False)[0], **tol
    )
    torch.testing.assert_close(
        fused(x, x, x, keep & allowed),
        theirs(x, x, x, attn_mask=~allowed, key_padding_mask=~keep[:, 0, 0], need_weights=False)[0],
        **tol,
    )


def test_causality(device):
    """With a causal mask, changing a later token leaves the earlier outputs unchanged."""
    fused = EfficientMultiHeadAttention(16, 4).to(device, torch.float64).eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64).to(device)
    x2 = x.clone()
    x2[:, 4] += 3.0
    mask = causal_mask(7, device=device)
    out, out2 = fused(x, x, x, mask), fused(x2, x2, x2, mask)
    torch.testing.assert_close(out2[:, :4], out[:, :4], atol=1e-12, rtol=0)
    assert not torch.allclose(out2[:, 4:], out[:, 4:])


class _RecordShapes(TorchDispatchMode):
    """Records the shape of every tensor that an aten operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append((str(func), tuple(t.shape)))
        return out


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_never_materialises_the_weights_on_cpu(mask_kind):
    """The point of the module: forward and backward create no (B, H, Lq, Lk) tensor.
    (The teaching module, checked the same way, does.)"""
    B, Lq, Lk, D, H = 2, 37, 37, 32, 4
    teaching, fused = twin_modules(D, H, torch.float32, "cpu")
    fused.train()  # training mode with dropout 0: the kernel must not save the weights either
    x = torch.randn(B, Lq, D)
    mask = make_mask(mask_kind, B, H, Lq, Lk, "cpu")

    def big_square_tensors(module):
        with _RecordShapes() as record:
            module(x, x, x, mask).sum().backward()
        return [(op, s) for op, s in record.shapes if s[-2:] == (Lq, Lk) and len(s) >= 3]

    assert big_square_tensors(teaching), "the check itself must catch the teaching module"
    assert big_square_tensors(fused) == []


def test_errors():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        EfficientMultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        EfficientMultiHeadAttention(8, 2, dropout=1.0)
    with pytest.raises(ValueError, match="must be positive"):
        EfficientMultiHeadAttention(8, 0)
    with pytest.raises(TypeError, match="from_module expects a mha_lib.MultiHeadAttention, got MultiheadAttention"):
        EfficientMultiHeadAttention.from_module(nn.MultiheadAttention(8, 2))
    fused = EfficientMultiHeadAttention(8, 2)
    assert_rejects_bad_inputs(fused)
    x = torch.randn(2, 5, 8)
    for return_weights in (False, True):
        with pytest.raises(ValueError, match=r"mask of shape \(3, 5, 5\) does not broadcast"):
            fused(x, x, x, mask=torch.ones(3, 5, 5, dtype=torch.bool), return_weights=return_weights)
        with pytest.raises(TypeError, match="mask has dtype torch.int64"):
            fused(x, x, x, mask=torch.ones(5, 5, dtype=torch.long), return_weights=return_weights)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_pytorch_cpu_kernel_itself_gives_zeros_for_fully_masked_rows(mask_dtype):
    """Chapter 09 says so: on the CPU, torch 2.13's F.scaled_dot_product_attention itself returns
    zeros, not NaN, for a query that sees no key. (The module's guard does not rely on it.)"""
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    allowed = torch.ones(3, 5, dtype=torch.bool)
    allowed[1] = False
    mask = allowed if mask_dtype == torch.bool else torch.zeros(3, 5).masked_fill(~allowed, float("-inf"))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all() and (out[:, :, 1] == 0).all() and (out[:, :, 0] != 0).any()
