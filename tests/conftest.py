"""Shared fixtures and helpers.

Every device-parametrized test runs on the CPU, and on CUDA when present. The helpers build
what several test files need: random inputs that are the same on every device (``randn``),
masks (``causal``, ``random_lengths``), PyTorch's own attention weights
(``reference_weights``) and PyTorch twins of mha_lib's modules holding the same weights
(``load_into_torch_mha``, ``torch_twin``, ``assert_matches_torch_mha``), the inputs and masks
that the attention modules' tests try (``make_inputs``, ``make_mask``), a detector of stored
attention weights (``weight_shaped_inputs``), and the learner-style answers that the exercise
checks' tests feed them (``sdpa``, ``MHA``, ...). Test files import helpers from here only,
never from one another.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

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


def make_inputs(kind: str, B: int, Lq: int, Lk: int, D: int, device: torch.device | str,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query, key, value) for self-attention (``"self"``: one tensor, Lq = Lk), cross-attention to
    one memory (``"memory"``: key is value), or three different tensors (``"distinct"``); the
    efficient module projects each in its own way."""
    if kind == "self":
        x = randn(B, Lq, D, device=device, dtype=dtype)
        return x, x, x
    query = randn(B, Lq, D, device=device, dtype=dtype)
    if kind == "memory":
        memory = randn(B, Lk, D, device=device, dtype=dtype)
        return query, memory, memory
    if kind == "distinct":
        return query, randn(B, Lk, D, device=device, dtype=dtype), randn(B, Lk, D, device=device, dtype=dtype)
    raise ValueError(kind)


def make_mask(kind: str, B: int, H: int, Lq: int, Lk: int, device: torch.device | str) -> torch.Tensor | None:
    """A mask of each kind the modules take; none of them blocks every key of a query."""
    if kind == "none":
        return None
    if kind == "causal":  # query i sees keys 0 … i + (Lk - Lq): the last query sees everything
        return causal(Lq, Lk, device)
    if kind == "padding":  # (B, 1, 1, Lk): sequence 0 is full, sequence i ≥ 1 has max(1, Lk - 1 - i) tokens
        from mha_lib import padding_mask

        return padding_mask([Lk] + [max(1, Lk - 2 - b) for b in range(B - 1)], max_len=Lk).to(device)
    if kind == "per_head":  # (H, Lq, Lk): each head sees its own random half of the keys
        mask = torch.rand(H, Lq, Lk) < 0.5
        mask[..., 0] = True  # no fully masked rows here (they have their own test)
        return mask.to(device)
    if kind == "float":  # (Lq, Lk) added to the scores; -inf blocks
        mask = torch.randn(Lq, Lk, dtype=torch.float64)
        mask[torch.rand(Lq, Lk) < 0.3] = float("-inf")
        mask[:, 0] = 0.0
        return mask.to(device)
    raise ValueError(kind)


def weight_shaped_inputs(step: Callable[[], Any], Lq: int, Lk: int) -> list[tuple[str, tuple[int, ...]]]:
    """Runs ``step()`` (say a forward and its backward) under PyTorch's profiler and returns
    ``(operation, shape)`` for every tensor that an operation took which could hold attention
    weights ``(..., Lq, Lk)`` of more than one head or sequence: its shape ends in ``(Lq, Lk)``
    and has more than one such plane. The profiler sees the backward pass and the operations
    inside others (the explicit "math" fallback of ``F.scaled_dot_product_attention``); stored
    weights are always taken by some operation (the product with the values, or its gradient)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    found = []
    for event in prof.events():
        for shape in event.input_shapes:  # one entry per argument; a tensor's is a list of ints
            if (isinstance(shape, list) and len(shape) >= 3 and all(isinstance(n, int) for n in shape)
                    and tuple(shape[-2:]) == (Lq, Lk) and math.prod(shape[:-2]) > 1):
                found.append((event.name, tuple(shape)))
    return found


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


# ------------------------------------------------------------------ answers for the exercise checks
# Learner-style implementations that tests/test_checks.py and tests/test_check_gallery.py feed the checks.


def sdpa(q, k, v, mask=None, *, scale=None, dim=-1, mask_after=False, invert=False, values=True):
    """A learner-style implementation with switches for the classic mistakes."""
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.size(-1)) if scale is None else scale(q, k, v))
    if mask is not None and not mask_after:
        scores = scores.masked_fill(mask if invert else ~mask, float("-inf"))
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and mask_after:
        weights = weights.masked_fill(~mask, 0.0)
    return (weights @ v if values else weights @ k), weights


def sdpa_safe_where(q, k, v, mask=None):
    """Right, with a guard: a query that may attend to no key gets zero weights, not NaN."""
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    weights = torch.where(empty, 0.0, torch.softmax(scores.masked_fill(empty, 0.0), -1))
    return weights @ v, weights


class MHA(nn.Module):
    """A learner-style module, with switches for the classic mistakes."""

    def __init__(self, d_model, num_heads, *, scale="d_k", transpose=True, out_proj=True, book_bug=False):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"{d_model} is not divisible by {num_heads}")
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.scale, self.transpose, self.out_proj, self.book_bug = scale, transpose, out_proj, book_bug

    def forward(self, query, key, value, mask=None):
        B = query.size(0)

        def split(x, size):
            if not self.transpose:
                return x.reshape(B, self.h, -1, size)
            return x.view(B, -1, self.h, size).transpose(1, 2)

        q, k = split(self.W_q(query), self.d_k), split(self.W_k(key), self.d_k)
        v = split(self.W_v(value), self.d_v if self.book_bug else self.d_k)
        d = {"d_k": self.d_k, "d_model": self.h * self.d_k}[self.scale]
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        heads = scores.softmax(-1) @ v
        concat = heads.transpose(1, 2).contiguous().view(B, -1, self.h * self.d_k) if self.transpose \
            else heads.reshape(B, -1, self.h * self.d_k)
        return self.W_o(concat) if self.out_proj else concat


class MHAWithLibrary(nn.Module):
    """Right, written differently: mha_lib's building blocks, returning (output, weights)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError("d_model must be divisible by num_heads")
        self.h = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        import mha_lib

        q, k, v = (mha_lib.split_heads(f(x), self.h) for f, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
        heads, weights = mha_lib.scaled_dot_product_attention(q, k, v, mask)
        return self.W_o(mha_lib.combine_heads(heads)), weights


def halves_right(L):
    """Chapter 12's (2, L, L) mask, right: head 0 sees the first half of the keys, head 1 the rest."""
    mask = torch.zeros(2, L, L, dtype=torch.bool)
    mask[0, :, : L // 2] = True
    mask[1, :, L // 2 :] = True
    return mask


def rows_that_see_nothing(B: int, Lq: int, Lk: int, mask_dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(allowed, mask)``: a bool ``(B, 1, Lq, Lk)`` pattern in which query 1 of sequence 0 and
    query 3 of sequence 1 may attend to no key, and the same as a mask of ``mask_dtype``
    (bool, or float with -inf where blocked) on ``device``."""
    allowed = torch.ones(B, 1, Lq, Lk, dtype=torch.bool)
    allowed[0, 0, 1] = False  # sequence 0, query 1 sees no key
    allowed[1, 0, 3] = False
    mask = allowed if mask_dtype == torch.bool else torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    return allowed, mask.to(device)
