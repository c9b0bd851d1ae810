"""Checks for chapter 03's pieces: the parameter count, splitting into heads, combining them."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

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
