"""Checks for chapter 06: rotary positions (RoPE) and one rotary attention step (ALiBi's check: ``alibi``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import positions as _positions
from ._core import (
    ERROR,
    CheckResult,
    Verdict,
    call,
    check_device_care,
    check_unchanged,
    cloned,
    close,
    describe_shapes,
    diagnose,
    expect_tensor,
    fail,
    gen,
    on_meta,
    randn,
    run_check,
)
from .reference import attend as reference_attend
from .reference import flavours

CONVENTION = ("The course pairs feature i with feature i + d_k/2 (half-split): a, b = x[..., :d_k//2], "
              "x[..., d_k//2:], then cat([a·cos - b·sin, a·sin + b·cos], dim=-1), with the angle "
              "position · θ_i and θ_i = base^(-2i/d_k).")


def rotate(x: Tensor, positions: Tensor, *, base: float = 10000.0, pairing: str = "half",
           exponent: float = 2.0, sign: float = 1.0, output: str = "half", float32: str = "",
           swapped: bool = False) -> Tensor:
    """RoPE with the knobs that common mistakes turn; the defaults are the course's convention.

    ``float32``: ``"theta"`` computes the frequencies in float32 (``torch.arange`` without a dtype),
    ``"angle"`` the angles too (integer positions times float32 frequencies); ``swapped``: the
    sine where the cosine belongs and the other way round."""
    d_k = x.size(-1)
    half = d_k // 2
    theta_dtype = torch.float32 if float32 else torch.float64
    theta = base ** (-exponent * torch.arange(half, dtype=theta_dtype) / d_k)  # (d_k/2,)
    if float32 == "angle":
        angle = (sign * positions.to(torch.float32)[:, None] * theta).to(torch.float64)  # (L, d_k/2)
    else:
        angle = sign * positions.to(torch.float64)[:, None] * theta.to(torch.float64)  # (L, d_k/2)
    cos, sin = (angle.sin(), angle.cos()) if swapped else (angle.cos(), angle.sin())
    x = x.to(torch.float64)
    a, b = (x[..., :half], x[..., half:]) if pairing == "half" else (x[..., 0::2], x[..., 1::2])
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    if output == "half":
        return torch.cat([a2, b2], dim=-1)
    return torch.stack([a2, b2], dim=-1).flatten(-2)  # neighbours


def _rotary_mistakes(x: Tensor, positions: Tensor) -> list[tuple[str, Callable[[], Tensor], str]]:
    L = x.size(-2)
    return [
        ("nothing was rotated", lambda: x,
         "Rotate every pair of features by the angle position · θ_i: " + CONVENTION),
        ("the positions were ignored: they were counted from 0 (arange(L)) instead of the ones given",
         lambda: rotate(x, torch.arange(L)),
         "Use the positions argument: a decoder passes arange(T, T + L) for tokens that come after T cached ones."),
        ("neighbouring features (2i, 2i + 1) were paired (interleaved, as in the RoFormer paper)",
         lambda: rotate(x, positions, pairing="interleaved", output="interleaved"),
         "Both pairings give the offset property, but the course (and Hugging Face's LLaMA) uses half-split. "
         + CONVENTION),
        ("the halves were paired correctly, but the rotated pairs were written back interleaved",
         lambda: rotate(x, positions, output="interleaved"),
         "Keep the layout: the rotated first halves go back to features [0, d_k/2), the second ones to [d_k/2, d_k): "
         "torch.cat([..., ...], dim=-1), not torch.stack(...).flatten(-2)."),
        ("neighbours were paired and the result written back as halves", lambda: rotate(x, positions, pairing="interleaved"),
         CONVENTION),
        ("the rotation goes the wrong way (the sine has the wrong sign)", lambda: rotate(x, positions, sign=-1.0),
         "Rotating (a, b) by the angle φ gives (a·cos φ - b·sin φ, a·sin φ + b·cos φ)."),
        ("cos and sin are swapped (the sine multiplies the pair's own feature)",
         lambda: rotate(x, positions, swapped=True),
         "Rotating (a, b) by the angle φ gives (a·cos φ - b·sin φ, a·sin φ + b·cos φ): at position 0 "
         "(φ = 0) nothing may change."),
        ("the frequencies were built with base 1000 or 100000 instead of 10000",
         lambda: [rotate(x, positions, base=1000.0), rotate(x, positions, base=100000.0)],
         "θ_i = 10000 ** (-2 * i / d_k): the base is 10000, as in the sinusoidal table and RoFormer."),
        ("the frequencies are θ_i = base^(-i/d_k) (the factor 2 is missing)",
         lambda: rotate(x, positions, exponent=1.0),
         "θ_i = base ** (-2 * i / d_k) for i = 0 .. d_k/2 - 1, as in the sinusoidal table."),
        ("the frequencies use i = 0, 2, 4, ... and a factor 2 (θ_i = base^(-4i/d_k))",
         lambda: rotate(x, positions, exponent=4.0),
         "Either i = 0 .. d_k/2 - 1 with base ** (-2i/d_k), or torch.arange(0, d_k, 2) / d_k without the 2."),
        ("the positions are off by one (the first position is 1, not 0)",
         lambda: [rotate(x, positions + 1), rotate(x, positions - 1)],
         "Use the positions exactly as given: the first token of a sequence sits at position 0."),
        (f"the rotation is right, but the angles were computed in float32 while x is {x.dtype}, "
         "so they are off by float32's rounding",
         lambda: [rotate(x, positions, float32="theta"), rotate(x, positions, float32="angle")],
         "torch.arange(d_k // 2) without a dtype makes θ float32: build it as "
         "torch.arange(d_k // 2, dtype=x.dtype), and positions.to(x.dtype), so that the angles have x's precision."),
    ]


def check_apply_rotary(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, positions) -> rotated``: ``x (..., L, d_k)`` with even ``d_k``, ``positions``
    an integer tensor ``(L,)``; each pair ``(i, i + d_k/2)`` turned by ``positions · θ_i``."""

    def body() -> str:
        g = gen(81)
        cases = [
            (randn(g, 2, 3, 5, 8), torch.arange(5), "positions 0..4"),
            (randn(g, 1, 2, 4, 6), torch.arange(7, 11), "positions 7..10 (a chunk after 7 cached tokens)"),
            (randn(g, 3, 4, 16), torch.tensor([0, 2, 5, 9]), "3-D input and positions 0, 2, 5, 9"),
        ]
        for x, positions, label in cases:
            where = f"for {describe_shapes(x=x)} and {label}"
            args = cloned(x, positions)
            out = call(fn, *args, what=f"your function ({label})", forbidden=[_positions.apply_rotary])
            check_unchanged(["x", "positions"], [x, positions], args, "your function")
            out = expect_tensor(out, f"the result {where}", x.shape, dtype=x.dtype, explain=" (the same shape as x)")
            expected = rotate(x, positions)
            if not close(out, expected):
                raise diagnose(out, _rotary_mistakes(x, positions), f"the rotation is wrong {where}", CONVENTION,
                               expected=expected)
        x, positions, _ = cases[1]
        check_device_care(fn, on_meta(x), on_meta(positions), what="your function",
                          hint="Make the frequencies on x's device: torch.arange(half, dtype=x.dtype, device=x.device), "
                               "and move positions there: positions.to(x.device, x.dtype).")
        return f"correct on {len(cases)} cases (batch and head axes, offset positions, d_k = 6, 8, 16, another device)"

    return run_check("apply_rotary", body)


MASK_HINT = ("Pass the mask on as it is given (True = may attend): scaled_dot_product_attention(q, k, value, mask). "
             "It may be a padding mask or any other pattern, not only a causal one.")


def _rotary_cases(g: torch.Generator) -> tuple[list[tuple[Tensor | None, str]], list[tuple[Tensor | None, str]]]:
    """(the cases the verdict counts, the further masks every answer must also honour)."""
    B, L = 2, 5
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    padding = (torch.arange(L)[None, :] < torch.tensor([5, 3])[:, None])[:, None, None, :]  # (B, 1, 1, L)
    random = torch.rand(B, 1, L, L, generator=g) > 0.5
    random |= torch.eye(L, dtype=torch.bool)  # no query without a key
    return ([(None, "no mask"), (causal, "a causal mask (L, L)")],
            [(padding, "a padding mask (B, 1, 1, L)"), (random, "a random mask (B, 1, L, L)")])


def _positions_axis_probe(fn: Callable[..., Any], error: Verdict) -> None:
    """``fn`` raised on (B, H, L, d_k) = (2, 2, 5, 8): does it work once L equals another axis?"""
    for (B, H, L, d_k), axis in (((2, 2, 8, 8), "the head dimension, query.size(-1)"),
                                 ((2, 5, 5, 8), "the number of heads, query.size(1)")):
        g = gen(83)
        q, k, v = randn(g, B, H, L, d_k), randn(g, B, H, L, d_k), randn(g, B, H, L, d_k)
        try:
            with torch.no_grad():
                out = fn(q.clone(), k.clone(), v.clone())
        except Exception:  # noqa: BLE001 - still failing: not this cause
            continue
        if isinstance(out, (tuple, list)) and len(out) == 2:
            out = out[0]
        pos = torch.arange(L)
        if isinstance(out, Tensor) and close(out.detach(), reference_attend(rotate(q, pos), rotate(k, pos), v)[0]):
            raise fail(f"{error.message}; it works only when the sequence length equals {axis}: it looks like the "
                       f"positions were taken from {axis} instead of the sequence length",
                       "The positions are 0 .. L-1 with L = query.size(-2), the axis of the tokens: "
                       "torch.arange(query.size(-2)).") from None


def check_rotary_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key, value, mask=None) -> output`` (or ``(output, weights)``): one
    self-attention step of per-head tensors ``(B, H, L, d_k)`` with RoPE at positions ``0 .. L-1``;
    the mask (causal, padding, any pattern; True = may attend) is honoured as given."""

    def body() -> str:
        g = gen(82)
        B, H, L, d_k = 2, 2, 5, 8
        cases, further = _rotary_cases(gen(84))
        for mask, label in cases + further:
            q, k, v = randn(g, B, H, L, d_k), randn(g, B, H, L, d_k), randn(g, B, H, L, d_k)
            where = f"for {describe_shapes(query=q, key=k, value=v)} and {label}"
            args = cloned(q, k, v)
            kwargs = {} if mask is None else {"mask": mask.clone()}
            try:
                out = call(fn, *args, **kwargs, what=f"your function ({label})")
            except Verdict as verdict:
                if verdict.status == ERROR:
                    _positions_axis_probe(fn, verdict)
                raise
            check_unchanged(["query", "key", "value"], [q, k, v], args, "your function")
            if isinstance(out, (tuple, list)) and len(out) == 2:
                out = out[0]
            out = expect_tensor(out, f"the output {where}", (B, H, L, d_k), dtype=q.dtype, explain=" (B, H, L, d_k)")
            pos = torch.arange(L)

            def attend(q_: Tensor, k_: Tensor, v_: Tensor, m: Tensor | None = mask, **knobs: Any) -> list[Tensor]:
                return flavours(lambda **more: reference_attend(q_, k_, v_, m, **knobs, **more), 0)()

            rq, rk = rotate(q, pos), rotate(k, pos)
            expected = reference_attend(rq, rk, v, mask)[0]
            if close(out, expected):
                continue
            causal = torch.ones(L, L, dtype=torch.bool).tril()
            mistakes = [
                ("the values were rotated too", lambda: attend(rq, rk, rotate(v, pos)),
                 "Rotate the queries and the keys only: positions decide where to look (the scores); the values "
                 "are what gets handed over and stay as they are."),
                ("only the queries were rotated", lambda: attend(rq, k, v),
                 "Rotate both the queries and the keys: the offset i - j appears only when both are turned."),
                ("only the keys were rotated", lambda: attend(q, rk, v),
                 "Rotate both the queries and the keys: the offset i - j appears only when both are turned."),
                ("nothing was rotated", lambda: attend(q, k, v),
                 "Rotate the queries and keys with apply_rotary before computing the scores."),
                ("neighbouring features were paired (interleaved)",
                 lambda: attend(rotate(q, pos, pairing="interleaved", output="interleaved"),
                                rotate(k, pos, pairing="interleaved", output="interleaved"), v), CONVENTION),
            ]
            if mask is not None:
                mistakes += [
                    ("the mask was ignored", lambda: attend(rq, rk, v, None), MASK_HINT),
                    ("a causal mask was used instead of the mask given (is_causal=True whenever there is a mask?)",
                     lambda: attend(rq, rk, v, causal), MASK_HINT),
                    ("the mask is inverted (it blocks the keys that may be attended)",
                     lambda: attend(rq, rk, v, mask_mode="inverted"),
                     "True means *may attend*: block where the mask is False, masked_fill(~mask, float('-inf')); "
                     "F.scaled_dot_product_attention also reads a bool attn_mask as True = may attend."),
                    ("the mask was applied after the softmax (weights zeroed without renormalising)",
                     lambda: attend(rq, rk, v, mask_mode="after"),
                     "Mask the scores before the softmax (with -inf), so that each row of weights still sums to 1."),
                ]
            mistakes += [
                ("the rotation is right, but the scores were not divided by √d_k", lambda: attend(rq, rk, v, scale=1.0),
                 "Attend with scaled_dot_product_attention(q, k, value, mask): it divides the scores by √d_k."),
                ("the rotation is right, but the scores were divided by d_k instead of √d_k",
                 lambda: attend(rq, rk, v, scale=float(d_k)), "Divide by math.sqrt(d_k), not d_k."),
                ("the rotation is right, but the scores were multiplied by √d_k instead of divided",
                 lambda: attend(rq, rk, v, scale=d_k ** -0.5), "Divide the scores by math.sqrt(d_k)."),
                ("the softmax ran over the queries (dim=-2)", lambda: attend(rq, rk, v, softmax_dim=-2),
                 "Each query's weights are a distribution over the keys: softmax(scores, dim=-1)."),
                ("the positions are off by one (the first position is 1, not 0) for the queries only",
                 lambda: attend(rotate(q, pos + 1), rk, v),
                 "Rotate the queries and the keys with the same positions, torch.arange(L)."),
            ]
            raise diagnose(out, mistakes, f"the output is wrong {where}",
                           "Rotate query and key with apply_rotary (positions 0 .. L-1), leave value alone, then "
                           "attend with the mask as given.", expected=expected, axis="query position")
        check_device_care(fn, *(on_meta(randn(g, B, H, L, d_k)) for _ in range(3)), what="your function",
                          hint="Make the positions on the query's device: torch.arange(L, device=query.device).")
        return (f"correct on {len(cases) + len(further)} cases (no mask, a causal, a padding and a random mask), "
                "and on another device")

    return run_check("rotary attention", body)
