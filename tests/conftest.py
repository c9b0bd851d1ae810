"""Shared fixtures and helpers.

Every device-parametrized test runs on the CPU, and on CUDA when present. The helpers build
what several test files need: random inputs that are the same on every device (``randn``),
masks (``causal``, ``random_lengths``), PyTorch's own attention weights
(``reference_weights``) and PyTorch twins of mha_lib's modules holding the same weights
(``load_into_torch_mha``, ``torch_twin``, ``assert_matches_torch_mha``).
"""

from __future__ import annotations

from typing import Any

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn

matplotlib.use("Agg")  # no windows during tests

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine"),
    ]),
]

# Tolerances: float64 agrees to rounding error; float32 to ~1e-6 relative;
# bfloat16 keeps 8 bits of mantissa, so only ~1e-2.
TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def randn(*shape: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal numbers drawn in float64 on the CPU, then moved: the same on every device."""
    return torch.randn(*shape, dtype=torch.float64).to(device, dtype)


def random_lengths(B: int, L: int) -> torch.Tensor:
    """Random true lengths in 1..L, for a padding mask; the first sequence is full."""
    lengths = torch.randint(1, L + 1, (B,))
    lengths[0] = L
    return lengths


def causal(Lq: int, Lk: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A causal ``(Lq, Lk)`` mask, True = may attend; with Lq < Lk the last query sees every key."""
    return torch.ones(Lq, Lk, dtype=torch.bool, device=device).tril(diagonal=Lk - Lq)


def reference_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """PyTorch's own attention weights ``(..., Lq, Lk)``: attend over the identity matrix as values."""
    eye = torch.eye(k.size(-2), dtype=q.dtype, device=q.device).expand(*k.shape[:-1], k.size(-2))
    return F.scaled_dot_product_attention(q, k, eye, attn_mask=mask)


def load_into_torch_mha(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    """Copy a mha_lib module's projections into an nn.MultiheadAttention.

    PyTorch keeps W_q, W_k, W_v stacked in one (3 * d_model, d_model) in_proj_weight, the
    layout of EfficientMultiHeadAttention's W_qkv. A module without W_o (AttentionHead) gets
    an identity output projection.
    """
    if hasattr(ours, "W_qkv"):
        weight, bias = ours.W_qkv.weight, ours.W_qkv.bias
    else:
        weight = torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight])
        bias = None if ours.W_q.bias is None else torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias])
    with torch.no_grad():
        theirs.in_proj_weight.copy_(weight)
        if hasattr(ours, "W_o"):
            theirs.out_proj.weight.copy_(ours.W_o.weight)
        else:
            theirs.out_proj.weight.copy_(torch.eye(theirs.embed_dim, dtype=weight.dtype))
        if bias is not None:
            theirs.in_proj_bias.copy_(bias)
            if hasattr(ours, "W_o"):
                theirs.out_proj.bias.copy_(ours.W_o.bias)
            else:
                theirs.out_proj.bias.zero_()


def torch_twin(ours: nn.Module, dtype: torch.dtype, device: torch.device | str) -> tuple[nn.Module, nn.MultiheadAttention]:
    """``ours`` and an nn.MultiheadAttention holding its weights, both on (device, dtype), in eval mode.

    The copy is made in float64, so that both hold the same numbers in every dtype.
    """
    ours = ours.to(dtype=torch.float64)
    d_model = ours.W_q.in_features if hasattr(ours, "W_q") else ours.d_model
    num_heads = getattr(ours, "num_heads", 1)
    bias = (ours.W_qkv if hasattr(ours, "W_qkv") else ours.W_q).bias is not None
    theirs = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, dtype=torch.float64)
    load_into_torch_mha(ours, theirs)
    return ours.to(device, dtype).eval(), theirs.to(device, dtype).eval()


def assert_matches_torch_mha(ours: nn.Module, theirs: nn.MultiheadAttention, query: torch.Tensor,
                             key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
                             **theirs_kwargs) -> torch.Tensor:
    """``ours(query, key, value, mask)`` gives nn.MultiheadAttention's output and per-head weights
    (``theirs_kwargs``: the same mask in PyTorch's convention). Returns our weights."""
    out, weights = ours(query, key, value, mask, return_weights=True)
    ref_out, ref_weights = theirs(query, key, value, need_weights=True, average_attn_weights=False, **theirs_kwargs)
    tol = TOLERANCES[query.dtype]
    assert out.shape == ref_out.shape and out.dtype == query.dtype
    torch.testing.assert_close(out, ref_out, **tol)
    torch.testing.assert_close(weights.reshape(ref_weights.shape), ref_weights, **tol)
    return weights


def assert_rejects_bad_inputs(module: nn.Module) -> None:
    """``module`` (built with d_model=8) names what is wrong with a query, key or value:
    a shape, a length or batch size that disagree, something that is not a tensor."""
    x = torch.randn(2, 5, 8)
    bad = [
        ((torch.randn(2, 5, 6), x, x), ValueError, r"query must have shape \(B, L, d_model=8\), got \(2, 5, 6\)"),
        ((x, torch.randn(5, 8), x), ValueError, r"key must have shape \(B, L, d_model=8\), got \(5, 8\)"),
        ((x, x, torch.randn(1, 2, 5, 8)), ValueError, r"value must have shape \(B, L, d_model=8\), got \(1, 2, 5, 8\)"),
        ((x, x, torch.randn(2, 4, 8)), ValueError, r"key and value must have the same length Lk, got 5 and 4"),
        ((x, torch.randn(3, 5, 8), torch.randn(3, 5, 8)), ValueError, r"same batch size, got 2, 3, 3"),
        ((x, [[0.0]], x), TypeError, "key must be a torch.Tensor, got list"),
        ((x, x, [[0.0]]), TypeError, "value must be a torch.Tensor, got list"),
    ]
    for args, error, message in bad:
        with pytest.raises(error, match=message):
            module(*args)


def expect_fail(result: Any, *words: str, status: str = "failed") -> None:
    """A check's result that rejected a wrong answer, with every one of ``words`` in its message."""
    from mha_lib.checks import CheckResult

    assert isinstance(result, CheckResult)
    assert not result, f"the check passed a wrong answer: {result}"
    assert result.status == status, result
    text = str(result).lower()
    for word in words:
        assert word.lower() in text, f"{word!r} missing from:\n{result}"


def expect_pass(result: Any) -> None:
    """A check's result that accepted a right answer."""
    from mha_lib.checks import CheckResult

    assert isinstance(result, CheckResult)
    assert result, f"the check failed a right answer:\n{result}"
    assert result.status == "passed" and str(result).startswith("✅")
