"""Checks for chapter 03's pieces: the parameter count, splitting into heads, combining them."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import heads as mha_heads
from ._core import CheckResult, call, check_unchanged, cloned, close, diagnose, expect_tensor, fail, gen, randn, run_check

TRANSPOSE_HINT = ("A plain reshape to (B, H, L, d_k) mixes positions into heads. Cut the features with "
                  ".view(B, L, H, d_k), then .transpose(1, 2) to bring the head axis before the sequence axis.")
COMBINE_HINT = ("Undo the split in reverse order: .transpose(1, 2) back to (B, L, H, d_k), then "
                ".reshape(B, L, H * d_k) (or .contiguous().view(...)).")
INTERLEAVE_HINT = ("Head h owns one contiguous chunk of features, [h*d_k, (h+1)*d_k): view the last axis as "
                   "(H, d_k), not (d_k, H).")


def check_split_heads(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, num_heads)``: ``(B, L, D) -> (B, H, L, D // H)``, head h holding
    features ``[h·D/H, (h+1)·D/H)``."""

    def body() -> str:
        g = gen(3)
        cases = [((2, 5, 12), 3), ((1, 4, 8), 2), ((3, 2, 6), 6), ((2, 3, 8), 1)]
        for (B, L, D), H in cases:
            x = randn(g, B, L, D)
            (arg,) = cloned(x)
            out = call(fn, arg, H, what=f"your function (x {tuple(x.shape)}, num_heads={H})",
                       forbidden=[mha_heads.split_heads])
            check_unchanged(["x"], [x], [arg], "your function")
            d_k = D // H
            if isinstance(out, Tensor) and tuple(out.shape) == (B, L, H, d_k) and L != H:
                raise fail(f"the result has shape {(B, L, H, d_k)} (B, L, H, d_k), expected {(B, H, L, d_k)}",
                           "You stopped after the view: .transpose(1, 2) brings the head axis before the sequence axis.")
            out = expect_tensor(out, f"the result for x {tuple(x.shape)} and num_heads={H}", (B, H, L, d_k),
                                dtype=x.dtype, explain=" (B, H, L, d_k)")
            expected = x.view(B, L, H, d_k).transpose(1, 2)
            if not close(out, expected):
                raise diagnose(out, [
                    ("a reshape without the transpose", lambda: x.reshape(B, H, L, d_k), TRANSPOSE_HINT),
                    ("heads built from every H-th feature", lambda: [x.view(B, L, d_k, H).permute(0, 3, 1, 2),
                                                                    x.view(B, L, d_k, H).permute(0, 3, 1, 2)
                                                                    .transpose(-2, -1).reshape(B, H, L, d_k)],
                     INTERLEAVE_HINT),
                ], f"wrong values for x {tuple(x.shape)} and num_heads={H}",
                    "out[b, h, i] must be x[b, i, h*d_k:(h+1)*d_k].", expected=expected, dim=1, axis="head")
        return f"correct on {len(cases)} shapes"

    return run_check("split into heads", body)


def check_combine_heads(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x)``: ``(B, H, L, d_k) -> (B, L, H·d_k)``, the inverse of split_heads."""

    def body() -> str:
        g = gen(4)
        cases = [(2, 3, 5, 4), (1, 2, 4, 4), (3, 6, 2, 1), (2, 1, 3, 8)]
        for B, H, L, d_k in cases:
            x = randn(g, B, H, L, d_k)
            (arg,) = cloned(x)
            out = call(fn, arg, what=f"your function (x {tuple(x.shape)})", forbidden=[mha_heads.combine_heads])
            check_unchanged(["x"], [x], [arg], "your function")
            out = expect_tensor(out, f"the result for x {tuple(x.shape)}", (B, L, H * d_k), explain=" (B, L, H * d_k)")
            expected = x.transpose(1, 2).reshape(B, L, H * d_k)
            if not close(out, expected):
                raise diagnose(out, [
                    ("a reshape without the transpose", lambda: x.reshape(B, L, H * d_k), COMBINE_HINT),
                    ("features interleaved across heads", lambda: x.permute(0, 2, 3, 1).reshape(B, L, H * d_k),
                     "Put the heads side by side: features [h*d_k, (h+1)*d_k) come from head h. " + COMBINE_HINT),
                ], f"wrong values for x {tuple(x.shape)}", "out[b, i, h*d_k:(h+1)*d_k] must be x[b, h, i].")
        return f"correct on {len(cases)} shapes"

    return run_check("combine heads", body)


_COUNT_MISTAKES = {
    "the biases were left out": "With bias=True each of the 4 projections has d_model biases.",
    "the output projection W_o is missing": "There are four projections: W_q, W_k, W_v and W_o.",
    "everything was counted once per head": "The heads share the four d_model x d_model matrices; "
                                            "splitting into heads adds no parameters.",
    "only one head's share was counted": "Count the whole d_model x d_model matrices: the heads together use all of them.",
    "biases were counted although bias=False": "With bias=False there are only the weights.",
}


def check_parameter_count(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(d_model, num_heads, bias=True) -> int``: the number of parameters of a
    multi-head attention module (four d_model × d_model projections), a whole number (an int)."""

    def body() -> str:
        cases = [(512, 8, True), (512, 8, False), (64, 4, True), (12, 3, False), (8, 1, True)]
        for D, H, bias in cases:
            got = call(fn, D, H, bias=bias, what=f"your function (d_model={D}, num_heads={H}, bias={bias})")
            if got is None:
                raise fail("your function returned None", "End with: return count")
            if isinstance(got, Tensor) and got.numel() == 1 and not got.is_floating_point() and not got.is_complex():
                got = got.item()
            if isinstance(got, bool) or not isinstance(got, numbers.Real):
                raise fail(f"your function returned {got!r} (a {type(got).__name__}); expected a whole number, an int")
            if not isinstance(got, numbers.Integral):
                raise fail(f"your function returned {got!r}, a {type(got).__name__}; a count is a whole number, an int",
                           "In Python / always gives a float (and so does math.pow or **0.5): count with +, * and //, "
                           "or return int(...) of an exact result.")
            got = int(got)
            expected = 4 * D * D + (4 * D if bias else 0)
            if got != expected:
                named = {
                    4 * D * D: "the biases were left out",
                    3 * D * D + (3 * D if bias else 0): "the output projection W_o is missing",
                    H * expected: "everything was counted once per head",
                    4 * D * (D // H) + (4 * D // H if bias else 0): "only one head's share was counted",
                    4 * D * D + 4 * D: "biases were counted although bias=False",
                }
                name = named.get(got)
                raise fail(f"wrong count for d_model={D}, num_heads={H}, bias={bias}: got {got}"
                           + (f" ({name})" if name else ""),
                           _COUNT_MISTAKES.get(name or "", "Each of W_q, W_k, W_v, W_o is nn.Linear(d_model, d_model)."))
        return f"correct on {len(cases)} configurations"

    return run_check("parameter count", body)


# ------------------------------------------------------------------ exercise 3.5: which positions a split reads

PROBE_HINT = ("Tag every entry of a probe with its position: x = torch.arange(seq_len, dtype=torch.float64)"
              "[None, :, None].expand(1, seq_len, d_model), run out = split(x, num_heads)[0] (H, L, d_k), and "
              "read reads[h, i, j] = (out[h, i, :] == j).any() for every j (broadcast: out[..., None] == "
              "torch.arange(seq_len)).")


def _checked(x: Tensor, H: int) -> tuple[int, int, int]:
    if not isinstance(x, Tensor) or x.dim() != 3:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"split takes x of shape (B, L, d_model), got {shape}")
    B, L, D = x.shape
    if not isinstance(H, int) or isinstance(H, bool) or H < 1 or D % H:
        raise ValueError(f"split takes a num_heads that divides d_model={D}, got {H!r}")
    return B, L, D


def _split_right(x: Tensor, H: int) -> Tensor:
    B, L, D = _checked(x, H)
    return x.view(B, L, H, D // H).transpose(1, 2)


def _split_reshape(x: Tensor, H: int) -> Tensor:
    B, L, D = _checked(x, H)
    return x.reshape(B, H, L, D // H)


def _split_transposed(x: Tensor, H: int) -> Tensor:
    B, L, D = _checked(x, H)
    return x.transpose(1, 2).reshape(B, H, L, D // H)


def _split_interleaved(x: Tensor, H: int) -> Tensor:
    B, L, D = _checked(x, H)
    return x.reshape(B, L, D // H, H).permute(0, 3, 1, 2)


def _split_reversed(x: Tensor, H: int) -> Tensor:
    _checked(x, H)
    return _split_right(x.flip(1), H)


def _split_shifted(x: Tensor, H: int) -> Tensor:
    _checked(x, H)
    return _split_right(x.roll(1, dims=1), H)


_SPLITS = [  # (what it does, split); every one runs on any dtype and device
    ("a reshape without the transpose", _split_reshape),
    ("the right split (view, then transpose)", _split_right),
    ("a transpose of the whole (L, d_model) block, then a reshape", _split_transposed),
    ("heads made of every H-th feature", _split_interleaved),
    ("the right split of the reversed sequence", _split_reversed),
    ("the right split of the sequence shifted by one", _split_shifted),
]


def _reads(split: Callable[..., Tensor], L: int, D: int, H: int, *, tag: str = "position",
           first_only: bool = False) -> Tensor:
    """What a probe tagged by ``tag`` ("position" or "feature") reads back: bool (H, L, L)."""
    x = torch.arange(L if tag == "position" else D, dtype=torch.float64)
    x = x[None, :, None].expand(1, L, D) if tag == "position" else x[None, None, :].expand(1, L, D)
    out = split(x.contiguous(), H)[0]  # (H, L, d_k)
    if first_only:
        out = out[..., :1]
    return (out[..., None] == torch.arange(L, dtype=torch.float64)).any(dim=-2)  # (H, L, L)


def check_positions_read(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(split, seq_len, d_model, num_heads) -> reads``: bool ``(H, L, L)``, ``reads[h, i, j]``
    True when ``split(x, num_heads)[0, h, i]`` (for ``x`` of shape ``(1, L, d_model)``) holds a feature of
    input position j. The check hands over six splits, right and wrong, on three sizes."""

    def body() -> str:
        sizes = [(6, 8, 2), (5, 12, 3), (4, 8, 8)]
        count = 0
        for L, D, H in sizes:
            for name, split in _SPLITS:
                where = f"for {name}, seq_len={L}, d_model={D}, num_heads={H}"
                got = call(fn, split, L, D, H, what=f"your function ({where})",
                           forbidden=[mha_heads.split_heads])
                expected = _reads(split, L, D, H)
                if isinstance(got, Tensor) and got.shape == (H, L, L) and got.dtype != torch.bool:
                    if set(got.detach().cpu().flatten().tolist()) <= {0, 1}:
                        raise fail(f"the result {where} holds 0s and 1s of dtype {got.dtype}; expected torch.bool",
                                   "Return the comparison itself (a bool tensor), or convert with .bool().")
                got = expect_tensor(got, f"the result {where}", (H, L, L), dtype="any",
                                    explain=" (num_heads, seq_len, seq_len)")
                if got.dtype != torch.bool:
                    raise fail(f"the result {where} has dtype {got.dtype}; expected torch.bool "
                               "(True: head h at position i reads position j)")
                got = got.cpu()
                count += 1
                if torch.equal(got, expected):
                    continue
                eye = torch.eye(L, dtype=torch.bool).expand(H, L, L)
                mistakes = [
                    ("reads[h, j, i]: the positions read and the positions of the output are swapped",
                     expected.transpose(-2, -1),
                     "Index it as reads[h, i, j]: i is the position in the split's output, j the input position "
                     "it came from."),
                    ("it ignores the split: every head at position i reads position i only", eye,
                     "Call split on a probe whose entries tell their position, and read what comes out. "
                     + PROBE_HINT),
                    ("the probe was tagged with each feature's index, not its position",
                     _reads(split, L, D, H, tag="feature"),
                     "Tag each entry with the position it sits at (the same number along d_model), not with its "
                     "feature index. " + PROBE_HINT),
                    ("only the first feature of each head and position was read", _reads(split, L, D, H, first_only=True),
                     "A head's d_k features at one position may come from several positions: look at all of them "
                     "(.any() over the last axis). " + PROBE_HINT),
                ]
                for mistake, wrong, hint in mistakes:
                    if torch.equal(got, wrong):
                        raise fail(f"wrong result {where}: it looks like {mistake}", hint)
                heads = (got != expected).flatten(1).any(-1).nonzero().flatten().tolist()
                raise fail(f"wrong result {where}: head{'s' if len(heads) > 1 else ''} "
                           f"{', '.join(map(str, heads))} differ", PROBE_HINT)
        return f"correct on {count} cases ({len(_SPLITS)} splits, right and wrong, on {len(sizes)} sizes)"

    return run_check("which positions a split reads", body)
