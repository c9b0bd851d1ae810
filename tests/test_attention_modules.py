"""What both attention modules promise, each test run on both: the teaching MultiHeadAttention
(chapter 03) and EfficientMultiHeadAttention (chapter 10).

nn.MultiheadAttention's output and per-head weights when holding the same weights, its mask
conventions, causality, dropout in training only, zero output for a query that may attend to
nothing, gradients, parameter counts, errors. What only one of them promises is in
test_multi_head.py (each head its own rows of W_q) and test_efficient.py (the teaching module's
function with one fused projection and a fused kernel, from_module, no stored (Lq, Lk) weights);
grouped heads in test_gqa.py, the key/value cache in test_inference.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import (TOLERANCES, assert_matches_torch_mha, assert_rejects_bad_inputs, make_inputs, randn,
                      rows_that_see_nothing, torch_twin)
from mha_lib import EfficientMultiHeadAttention, MultiHeadAttention, causal_mask, padding_mask

MODULES = [MultiHeadAttention, EfficientMultiHeadAttention]


@pytest.fixture(params=MODULES, ids=["teaching", "efficient"])
def cls(request: pytest.FixtureRequest) -> type[MultiHeadAttention]:
    return request.param


def build(cls, *args, **kwargs) -> MultiHeadAttention:
    """``cls(*args, **kwargs)``; the efficient one is ``from_module`` of the teaching one, so that
    both hold the same weights for one seed."""
    teaching = MultiHeadAttention(*args, **kwargs)
    return teaching if cls is MultiHeadAttention else EfficientMultiHeadAttention.from_module(teaching)


CASES = [  # (inputs, B, Lq, Lk, d_model, H): one tensor, a memory (key is value), three tensors
    ("self", 2, 5, 5, 16, 4),
    ("self", 3, 9, 9, 24, 3),
    ("memory", 2, 4, 7, 16, 2),
    ("distinct", 3, 4, 7, 24, 3),
    ("distinct", 3, 6, 3, 12, 1),
    ("distinct", 4, 6, 6, 12, 1),
    ("distinct", 1, 1, 6, 8, 8),
]


# ------------------------------------------------------------------ nn.MultiheadAttention
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "{}_B{}_Lq{}_Lk{}_D{}_H{}".format(*c))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_nn_multihead_attention(cls, case, bias, dtype, device):
    kind, B, Lq, Lk, D, H = case
    ours, theirs = torch_twin(build(cls, D, H, bias=bias), dtype, device)
    query, key, value = make_inputs(kind, B, Lq, Lk, D, device, dtype)

    weights = assert_matches_torch_mha(ours, theirs, query, key, value)  # with the weights
    assert weights.shape == (B, H, Lq, Lk)
    out = ours(query, key, value)  # without them: the efficient module's fused kernel
    assert out.shape == (B, Lq, D) and out.dtype == dtype
    torch.testing.assert_close(out, theirs(query, key, value, need_weights=False)[0], **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_causal_mask_with_both_conventions(cls, dtype, device):
    """Ours: True = may attend. nn.MultiheadAttention's attn_mask: True = blocked."""
    B, L, D, H = 2, 6, 16, 4
    ours, theirs = torch_twin(build(cls, D, H), dtype, device)
    x = randn(B, L, D, device=device, dtype=dtype)
    allowed = causal_mask(L, device=device)

    weights = assert_matches_torch_mha(ours, theirs, x, x, x, allowed, attn_mask=~allowed)
    assert (weights[..., ~allowed] == 0).all()
    expected = theirs(x, x, x, attn_mask=~allowed, need_weights=False)[0]
    torch.testing.assert_close(ours(x, x, x, allowed), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_key_padding_with_both_conventions(cls, dtype, device):
    """Ours: (B, 1, 1, Lk), True = real token. key_padding_mask: (B, Lk), True = padding."""
    B, Lq, Lk, D, H = 3, 4, 6, 16, 2
    ours, theirs = torch_twin(build(cls, D, H), dtype, device)
    query = randn(B, Lq, D, device=device, dtype=dtype)
    memory = randn(B, Lk, D, device=device, dtype=dtype)
    keep = padding_mask(torch.tensor([6, 2, 4], device=device), max_len=Lk)  # (B, 1, 1, Lk)

    weights = assert_matches_torch_mha(ours, theirs, query, memory, memory, keep, key_padding_mask=~keep[:, 0, 0])
    assert (weights[1, :, :, 2:] == 0).all()
    expected = theirs(query, memory, memory, key_padding_mask=~keep[:, 0, 0], need_weights=False)[0]
    torch.testing.assert_close(ours(query, memory, memory, keep), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_causal_and_padding_masks_combined(cls, dtype, device):
    """``keep & allowed`` (B, 1, L, L) is attn_mask and key_padding_mask together, in self-attention."""
    B, L, D, H = 3, 6, 16, 4
    ours, theirs = torch_twin(build(cls, D, H), dtype, device)
    x = randn(B, L, D, device=device, dtype=dtype)
    allowed = causal_mask(L, device=device)
    keep = padding_mask([6, 4, 2], max_len=L).to(device)  # (B, 1, 1, L)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(
        ours(x, x, x, keep), theirs(x, x, x, key_padding_mask=~keep[:, 0, 0], need_weights=False)[0], **tol
    )
    weights = assert_matches_torch_mha(ours, theirs, x, x, x, keep & allowed,
                                       attn_mask=~allowed, key_padding_mask=~keep[:, 0, 0])
    assert (weights[2, :, :, 2:] == 0).all() and (weights[..., ~allowed] == 0).all()
    torch.testing.assert_close(
        ours(x, x, x, keep & allowed),
        theirs(x, x, x, attn_mask=~allowed, key_padding_mask=~keep[:, 0, 0], need_weights=False)[0],
        **tol,
    )


# ------------------------------------------------------------------ masks
def test_per_head_mask_broadcasts(cls, device):
    """A (H, Lq, Lk) mask restricts each head separately (chapter 12's exercise)."""
    B, L, D, H = 2, 6, 8, 2
    mha = build(cls, D, H).to(device)
    x = torch.randn(B, L, D, device=device)
    mask = torch.zeros(H, L, L, dtype=torch.bool, device=device)
    mask[0, :, : L // 2] = True
    mask[1, :, L // 2 :] = True
    _, weights = mha(x, x, x, mask=mask, return_weights=True)
    assert (weights[:, 0, :, L // 2 :] == 0).all() and (weights[:, 1, :, : L // 2] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, L, device=device))


def test_causality(cls, device):
    """With a causal mask, changing a later token leaves the earlier outputs unchanged."""
    B, L, D, H = 2, 7, 16, 4
    mha = build(cls, D, H).to(device, torch.float64).eval()
    x = torch.randn(B, L, D, dtype=torch.float64).to(device)
    mask = causal_mask(L, device=device)
    x2 = x.clone()
    x2[:, 4] += 3.0
    out, out2 = mha(x, x, x, mask), mha(x2, x2, x2, mask)
    torch.testing.assert_close(out2[:, :4], out[:, :4], atol=1e-12, rtol=0)  # exact on the CPU
    assert not torch.allclose(out2[:, 4:], out[:, 4:])


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_fully_masked_rows_are_zero_not_nan(cls, mask_dtype, device):
    """A query that may attend to nothing: zero weights, attention output 0 (so the module
    outputs W_o's bias), finite gradients, zero for that query."""
    B, Lq, Lk, D, H = 2, 4, 6, 16, 4
    module = build(cls, D, H).to(device)
    query, memory, _ = make_inputs("memory", B, Lq, Lk, D, device, torch.float32)
    allowed, mask = rows_that_see_nothing(B, Lq, Lk, mask_dtype, device)  # queries (0, 1) and (1, 3)

    query.requires_grad_(True)
    out = module(query, memory, memory, mask)
    _, weights = module(query, memory, memory, mask, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (weights[0, :, 1] == 0).all() and (weights[1, :, 3] == 0).all()
    torch.testing.assert_close(weights[0, :, 0].sum(-1), torch.ones(H, device=device))
    torch.testing.assert_close(out[0, 1], module.W_o.bias, atol=1e-6, rtol=0)
    torch.testing.assert_close(out[1, 3], module.W_o.bias, atol=1e-6, rtol=0)
    assert not torch.allclose(out[0, 0], module.W_o.bias)
    out.sum().backward()
    assert torch.isfinite(query.grad).all() and (query.grad[0, 1] == 0).all() and (query.grad[1, 3] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in module.parameters())


# ------------------------------------------------------------------ dropout
def test_dropout_only_in_training(cls):
    module = build(cls, 16, 4, dropout=0.5)
    x = torch.randn(2, 10, 16)
    module.eval()
    expected, eval_weights = module(x, x, x, return_weights=True)
    assert not (eval_weights == 0).any()
    torch.testing.assert_close(eval_weights.sum(-1), torch.ones(2, 4, 10))
    # evaluation: no randomness, and (efficient module) the fused kernel agrees with the explicit path
    torch.testing.assert_close(module(x, x, x), expected, **TOLERANCES[torch.float32])
    torch.testing.assert_close(module(x, x, x), module(x, x, x), atol=0, rtol=0)

    module.train()
    a, b = module(x, x, x), module(x, x, x)
    assert not torch.allclose(a, b), "training mode must drop attention weights at random"
    assert not torch.allclose(a, expected)
    _, weights = module(x, x, x, return_weights=True)
    kept = weights != 0
    assert 0.3 < kept.float().mean() < 0.7  # about half dropped, the survivors scaled by 1 / (1 - p)
    torch.testing.assert_close(weights[kept], 2 * eval_weights[kept])
    # Dropout is unbiased: averaged over many draws, training ≈ evaluation.
    many = x[:1].expand(2000, -1, -1)  # 2000 independent draws of the dropout mask in one batch
    with torch.no_grad():
        mean = module(many, many, many).mean(0)
    torch.testing.assert_close(mean, expected[0], atol=0.02, rtol=0)


# ------------------------------------------------------------------ gradients
def test_gradcheck(cls):
    """Cross-attention with a (Lk,) mask, and self-attention with a causal one."""
    mha = build(cls, 6, 2).double()
    q = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, True, True, False])
    assert torch.autograd.gradcheck(lambda a, b: mha(a, b, b, mask), (q, kv))
    assert torch.autograd.gradcheck(lambda a: mha(a, a, a, causal_mask(3)), (q,))


def test_every_parameter_gets_a_gradient(cls):
    mha = build(cls, 8, 2)
    x = torch.randn(2, 5, 8)
    mha(x, x, x).pow(2).sum().backward()
    parameters = dict(mha.named_parameters())
    assert {"W_o.weight", "W_o.bias"} <= parameters.keys()
    for name, p in parameters.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# ------------------------------------------------------------------ sizes
def test_parameter_count_matches_pytorch(cls):
    """4 d² weights + 4 d biases, like nn.MultiheadAttention (and independent of H); 4 d² without biases."""
    for H in (1, 8):
        ours = sum(p.numel() for p in build(cls, 512, H).parameters())
        theirs = sum(p.numel() for p in nn.MultiheadAttention(512, H).parameters())
        assert ours == theirs == 4 * 512 * 512 + 4 * 512
    no_bias = list(build(cls, 16, 4, bias=False).parameters())
    assert all(p.dim() == 2 for p in no_bias) and sum(p.numel() for p in no_bias) == 4 * 16 * 16


def test_book_configuration_shapes(cls):
    """Transformers in Action, section 2.2.3: d_model 512, 8 heads of 64, a batch of 32 x 100."""
    mha = build(cls, 512, 8)
    assert mha.d_k == 64
    x = torch.randn(32, 100, 512)
    with torch.no_grad():
        out, weights = mha(x, x, x, return_weights=True)
        assert mha(x, x, x).shape == (32, 100, 512)
    assert out.shape == (32, 100, 512) and weights.shape == (32, 8, 100, 100)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("d_model", "heads"), [(10, 4), (512, 3)])
def test_indivisible_d_model_names_both_numbers(cls, d_model, heads):
    with pytest.raises(ValueError, match=rf"d_model={d_model} is not divisible by num_heads={heads}"):
        cls(d_model, heads)


def test_constructor_errors(cls):
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.0"):
        cls(8, 2, dropout=1.0)
    with pytest.raises(ValueError, match="must be positive"):
        cls(8, 0)


@pytest.mark.parametrize("return_weights", [False, True])
def test_input_errors(cls, return_weights):
    mha = cls(8, 2)
    assert_rejects_bad_inputs(mha)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5, 5\) does not broadcast"):
        mha(x, x, x, mask=torch.ones(3, 5, 5, dtype=torch.bool), return_weights=return_weights)
    with pytest.raises(TypeError, match="mask has dtype torch.int64"):
        mha(x, x, x, mask=torch.ones(5, 5, dtype=torch.long), return_weights=return_weights)
