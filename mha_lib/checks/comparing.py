"""Check for chapter 05's exercise 5.4: a tolerance per dtype and a gradient test, judged by what they
accept and reject.

The learner writes two testers, not attention: ``tolerance(dtype) -> (rtol, atol)`` for comparing an
attention's output with ``F.scaled_dot_product_attention``'s, and ``gradients_right(attention) -> bool``.
The check hands them correct attentions (written in other ways, with other rounding) and wrong ones
(a computation in a lower precision, a leaky mask, the values' size as the scale, hand-written
backward passes wrong for one input), and names the tester's mistake from what it let through.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import attention as mha_attention
from ..masks import padding_mask
from ._core import CheckResult, Verdict, call, fail, gen, randn, run_check

DTYPES = (torch.float64, torch.float32, torch.bfloat16)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ------------------------------------------------------------------ attentions, right and wrong


def _plain(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: float | None = None,
           fill: float = float("-inf"), compute: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    dtype = q.dtype
    if compute is not None:
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
    scores = q @ k.transpose(-2, -1) / (scale if scale is not None else math.sqrt(q.size(-1)))
    if mask is not None:
        scores = scores.masked_fill(~mask, fill)
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v).to(dtype), weights.to(dtype)


def _exp_normalised(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    e = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    weights = e / e.sum(dim=-1, keepdim=True)
    return weights @ v, weights


class _HandWritten(torch.autograd.Function):
    """Attention with a backward pass written by hand; ``bug`` names the one input it gets wrong."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, bug: str) -> tuple[Tensor, Tensor]:
        scale = 1 / math.sqrt(q.size(-1))
        scores = q @ k.transpose(-2, -1) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(q, k, v, weights)
        ctx.bug, ctx.has_mask = bug, mask is not None
        return weights @ v, weights

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor, grad_w: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, w = ctx.saved_tensors
        scale = 1 / math.sqrt(q.size(-1))
        if ctx.bug == "mask":  # recomputes the weights for the backward pass, and forgets the mask
            w = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
        grad_v = w.transpose(-2, -1) @ grad_out
        if ctx.bug == "value":
            grad_v = grad_v * scale  # the scale copied where it doesn't belong
        grad_weights = grad_out @ v.transpose(-2, -1) + grad_w
        grad_scores = w * (grad_weights - (grad_weights * w).sum(dim=-1, keepdim=True))
        grad_q = grad_scores @ k * (1.0 if ctx.bug == "query" else scale)
        grad_k = grad_scores.transpose(-2, -1) @ q * (1.0 if ctx.bug == "key" else scale)
        return grad_q, grad_k, grad_v, None, None


def _hand_written(bug: str) -> Callable[..., tuple[Tensor, Tensor]]:
    def attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return _HandWritten.apply(query, key, value, mask, bug)

    return attention


def _library(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return mha_attention.scaled_dot_product_attention(query, key, value, mask)


def _upcast(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _plain(query, key, value, mask, compute=torch.float64)


# ------------------------------------------------------------------ part 1: tolerances


def _cases() -> list[tuple[str, Tensor, Tensor, Tensor, Tensor | None]]:
    """Unit-variance inputs (B, H, L, d_k), values of another size d_v, no mask, causal, padding."""
    g = gen(54)
    out = []
    for (B, H, L, d_k, d_v), kind in [((1, 2, 64, 32, 40), "causal"), ((2, 2, 16, 8, 12), "none"),
                                      ((2, 1, 40, 16, 24), "padding")]:
        q, k, v = randn(g, B, H, L, d_k), randn(g, B, H, L, d_k), randn(g, B, H, L, d_v)
        mask = {"causal": torch.ones(L, L, dtype=torch.bool).tril(), "none": None,
                "padding": padding_mask([L, L // 2], max_len=L)}[kind]
        out.append((f"(B, H, L, d_k, d_v) = {(B, H, L, d_k, d_v)}, {'no' if kind == 'none' else 'a ' + kind} mask",
                    q, k, v, mask))
    return out


RIGHT = [("mha_lib.scaled_dot_product_attention", _library),
         ("attention normalised by hand, exp(s - max) / sum", _exp_normalised),
         ("attention computed in float64 and rounded to the inputs' dtype", _upcast)]
WRONG = {  # dtype -> the wrong attentions a tolerance for it must reject
    torch.float64: [("attention computed in float32 (then cast back to float64)",
                     lambda q, k, v, m=None: _plain(q, k, v, m, compute=torch.float32)),
                    ("a leaky mask (blocked scores set to -10, not -inf)",
                     lambda q, k, v, m=None: _plain(q, k, v, m, fill=-10.0)),
                    ("scores scaled by √d_v, the values' size", lambda q, k, v, m=None: _plain(q, k, v, m,
                                                                                             scale=math.sqrt(v.size(-1))))],
    torch.float32: [("attention computed in float16 (then cast back to float32)",
                     lambda q, k, v, m=None: _plain(q, k, v, m, compute=torch.float16)),
                    ("a leaky mask (blocked scores set to -10, not -inf)",
                     lambda q, k, v, m=None: _plain(q, k, v, m, fill=-10.0)),
                    ("scores scaled by √d_v, the values' size", lambda q, k, v, m=None: _plain(q, k, v, m,
                                                                                             scale=math.sqrt(v.size(-1))))],
    torch.bfloat16: [("scores scaled by √d_v, the values' size", lambda q, k, v, m=None: _plain(q, k, v, m,
                                                                                              scale=math.sqrt(v.size(-1))))],
}
TORCH_DEFAULTS = {torch.float64: (1e-7, 1e-7), torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}
MARGIN_HINT = ("Measure the largest difference between two correct results in that dtype, over inputs like the "
               "check's (unit-variance, up to (1, 2, 64, 32), outputs up to about 2 in size), and set the tolerance "
               "a few times above it, about a few machine epsilons (torch.finfo(dtype).eps) of the outputs' size.")


def _allowed(a: Tensor, b: Tensor, rtol: float, atol: float) -> tuple[bool, float, float]:
    """(all entries within atol + rtol·|b|, the worst |a - b|, what the tolerance allowed there)."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    diff, room = (a - b).abs(), atol + rtol * b.abs()
    worst = int((diff - room).flatten().argmax())
    return bool((diff <= room).all()), float(diff.flatten()[worst]), float(room.flatten()[worst])


def _tolerance_of(fn: Callable[..., Any], dtype: torch.dtype) -> tuple[float, float]:
    got = call(fn, dtype, what=f"your tolerance({_name(dtype)})")
    if got is None:
        raise Verdict("not implemented", f"not implemented yet (tolerance({_name(dtype)}) returned None)",
                      "End with: return rtol, atol")
    if isinstance(got, dict) and set(got) == {"rtol", "atol"}:
        got = (got["rtol"], got["atol"])
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise fail(f"tolerance({_name(dtype)}) returned {got!r:.60}; expected a pair (rtol, atol)",
                   "End with: return rtol, atol (two floats).")
    values = []
    for name, value in zip(("rtol", "atol"), got):
        if isinstance(value, Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise fail(f"tolerance({_name(dtype)}) gave {name}={value!r:.40}; expected a finite number >= 0")
        values.append(float(value))
    return values[0], values[1]


def _check_tolerances(fn: Callable[..., Any]) -> int:
    tolerances = {dtype: _tolerance_of(fn, dtype) for dtype in DTYPES}
    one_for_all = len(set(tolerances.values())) == 1
    cases = _cases()
    count = 0
    for dtype in DTYPES:
        rtol, atol = tolerances[dtype]
        told = f"your {_name(dtype)} tolerance (rtol={rtol:.2g}, atol={atol:.2g})"
        for label, q, k, v, mask in cases:
            q_, k_, v_ = q.to(dtype), k.to(dtype), v.to(dtype)
            fused = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask)
            for name, attention in RIGHT:
                ok, diff, room = _allowed(attention(q_, k_, v_, mask)[0], fused, rtol, atol)
                count += 1
                if ok:
                    continue
                message = (f"{told} rejects a correct result: {name} against F.scaled_dot_product_attention, "
                           f"{label}: a difference of {diff:.1e} where it allows {room:.1e}")
                if (rtol, atol) == TORCH_DEFAULTS[dtype] and dtype == torch.bfloat16:
                    raise fail(message + ": torch.testing's bfloat16 defaults (atol=1e-5)",
                               "Two correct bfloat16 results differ by a few thousandths of the outputs' size, far "
                               "above atol=1e-5 for the small entries: pass an atol that fits. " + MARGIN_HINT)
                if atol == 0:
                    raise fail(message + ": with atol=0, an output near 0 must match to a fraction of itself",
                               "Rounding errors are a fraction of the *largest* values, not of each one: give atol "
                               "room too. " + MARGIN_HINT)
                if one_for_all:
                    raise fail(message + ": one tolerance for every dtype", "Each dtype rounds at its own "
                               "epsilon (torch.finfo(dtype).eps): a tolerance per dtype. " + MARGIN_HINT)
                raise fail(message, "Too tight for this dtype's rounding. " + MARGIN_HINT)
        for name, attention in WRONG[dtype]:
            caught = False
            worst = 0.0
            for label, q, k, v, mask in cases:
                q_, k_, v_ = q.to(dtype), k.to(dtype), v.to(dtype)
                fused = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask)
                result = attention(q_, k_, v_, mask)[0]
                ok, diff, _ = _allowed(result, fused, rtol, atol)
                worst = max(worst, float((result.double() - fused.double()).abs().max()))
                count += 1
                if not ok:
                    caught = True
                    break
            if caught:
                continue
            message = (f"{told} accepts a wrong attention, {name}, on every case (differences up to {worst:.1e})")
            lower = {torch.float64: torch.float32, torch.float32: torch.bfloat16}.get(dtype)
            if lower is not None and (rtol, atol) == TORCH_DEFAULTS.get(lower):
                raise fail(message + f": it is torch.testing's default for {_name(lower)}",
                           f"A tolerance for {_name(dtype)} must catch what a {_name(lower)} tolerance can't: "
                           f"{_name(dtype)} rounds at {torch.finfo(dtype).eps:.0e}. " + MARGIN_HINT)
            if one_for_all:
                raise fail(message + ": one tolerance for every dtype", "The loosest dtype's tolerance hides bugs "
                           "that the precise dtypes would show: a tolerance per dtype. " + MARGIN_HINT)
            raise fail(message, "Too loose: a tolerance is a claim that anything closer is correct. " + MARGIN_HINT)
    return count


# ------------------------------------------------------------------ part 2: the gradient test


GRADIENT_ATTENTIONS = [  # (what it is, attention, right?, the tester's likely mistake if it answers wrongly)
    ("mha_lib.scaled_dot_product_attention", _library, True, ""),
    ("attention normalised by hand, exp(s - max) / sum", _exp_normalised, True, ""),
    ("attention with a correct hand-written backward", _hand_written(""), True, ""),
    ("a hand-written backward wrong for query (the 1/√d_k forgotten)", _hand_written("query"), False,
     "a gradcheck that misses query?"),
    ("a hand-written backward wrong for key (the 1/√d_k forgotten)", _hand_written("key"), False,
     "a gradcheck that covers query only? gradcheck checks only the inputs it is given, with requires_grad=True: "
     "pass (query, key, value), all three with requires_grad."),
    ("a hand-written backward wrong for value (a 1/√d_k where none belongs)", _hand_written("value"), False,
     "a gradcheck that leaves value out? Pass (query, key, value), all three with requires_grad=True."),
    ("a hand-written backward that forgets the mask", _hand_written("mask"), False,
     "a gradcheck without a mask? Call the attention with a mask that blocks some keys (never every key of a "
     "query), e.g. a causal one: the backward's mask handling is only tested where a key is blocked."),
]


def _check_gradients(fn: Callable[..., Any]) -> int:
    for name, attention, right, mistake in GRADIENT_ATTENTIONS:
        try:
            got = call(fn, attention, what=f"your gradients_right (given {name})")
        except Verdict as verdict:
            if "GradcheckError" in verdict.message:
                raise fail(f"your gradients_right raised GradcheckError for {name} instead of returning "
                           f"{right}", "gradcheck raises on a mismatch by default: pass raise_exception=False "
                           "to get True or False.") from None
            raise
        if got is None:
            raise Verdict("not implemented", "not implemented yet (gradients_right returned None)",
                          "End with: return the result of gradcheck (True or False)")
        if isinstance(got, Tensor) and got.numel() == 1 and got.dtype == torch.bool:
            got = bool(got)
        if not isinstance(got, bool):
            raise fail(f"your gradients_right returned {got!r:.40} for {name}; expected True or False")
        if got == right:
            continue
        if right:
            raise fail(f"your gradients_right says the gradients of {name} are wrong; they are right",
                       "gradcheck needs float64 inputs (in float32 its finite differences are mostly rounding "
                       "noise), inputs with requires_grad=True, and no fully blocked query (NaN): make tiny "
                       "float64 inputs, e.g. (1, 2, 3, 4), and a mask that leaves every query a key.")
        raise fail(f"your gradients_right accepts {name}: it looks like {mistake}",
                   "torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, mask)[0], (q, k, v), "
                   "raise_exception=False), with q, k, v tiny float64 tensors that require gradients.")
    return len(GRADIENT_ATTENTIONS)


def check_tolerances_and_gradients(tolerance: Callable[..., Any],
                                   gradients_right: Callable[..., Any] | None = None) -> CheckResult:
    """Check two testers of attention: ``tolerance(dtype) -> (rtol, atol)`` for comparing an attention's output
    with ``F.scaled_dot_product_attention``'s in float64, float32 and bfloat16 (it must accept three correct
    attentions and reject, per dtype, the wrong ones that dtype can show), and ``gradients_right(attention) ->
    bool`` (True for three attentions with right gradients, False for four hand-written backward passes that
    are each wrong for one input or for the mask)."""

    def body() -> str:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # hundreds of tiny operations: threads only add waiting (3x slower measured)
        try:
            return judge()
        finally:
            torch.set_num_threads(threads)

    def judge() -> str:
        compared = _check_tolerances(tolerance)
        if gradients_right is None:
            raise fail("only the tolerance was given: the check judges both of your tests",
                       "Call check_tolerances_and_gradients(tolerance, gradients_right).")
        judged = _check_gradients(gradients_right)
        return (f"correct on {compared} comparisons (3 dtypes, {len(_cases())} cases, 3 right attentions and the "
                f"wrong ones each dtype can show) and {judged} gradient tests (3 right, 4 wrong for one input or "
                "the mask)")

    return run_check("tolerances and gradient test", body)
