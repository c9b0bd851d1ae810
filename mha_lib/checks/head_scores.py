"""Checks for exercise 8.2 (chapter 08): the previous-token and the induction score of a head.

The references are :mod:`mha_lib.induction.scores`' own (``previous_token_score``,
``induction_score``), computed in float64 where the learner's input allows it, on random causal
weights, on a perfect head (which scores 1) and on uniform attention (which scores the
baseline). A score must keep the weights' dtype and their gradient. ``expect_score_dtype`` and
``copy_batch`` serve exercise 8.3's check too (:mod:`.ablation_losses`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from ..induction import data as _data
from ..induction import scores as _scores
from ..induction.data import RepeatBatch
from ._core import (
    CheckResult,
    Mistake,
    call,
    check_device_care,
    check_unchanged,
    cloned,
    close,
    describe_error,
    diagnose,
    expect_tensor,
    fail,
    gen,
    on_meta,
    randn,
    run_check,
)


def _causal_weights(g: torch.Generator, B: int, H: int, L: int, scale: float = 2.0) -> Tensor:
    """Random causal attention weights ``(B, H, L, L)`` in float64: each row sums to 1 over keys ``<= t``."""
    scores = randn(g, B, H, L, L, scale=scale)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


def _uniform_weights(B: int, H: int, L: int) -> Tensor:
    tril = torch.ones(L, L, dtype=torch.float64).tril()
    return (tril / tril.sum(-1, keepdim=True)).expand(B, H, L, L).clone()


def _perfect_previous(B: int, H: int, L: int) -> Tensor:
    w = torch.zeros(B, H, L, L, dtype=torch.float64)
    w[..., 0, 0] = 1.0  # query 0 can only see itself
    t = torch.arange(1, L)
    w[..., t, t - 1] = 1.0
    return w


SCORE_DETACH_HINT = (".item(), torch.tensor([...]) of numbers, .detach() and torch.no_grad() cut the score out of "
                     "autograd; pick and average the weights with tensor operations (diagonal, gather, a mask, "
                     "mean) instead.")


def _score_shape(out: Any, B: int, H: int, L: int, what: str) -> None:
    """Name the shapes that show which axes were averaged."""
    if not isinstance(out, Tensor):
        return
    shape = tuple(out.shape)
    if shape == (B,) and B != H:
        raise fail(f"{what} have shape {shape}: one per sequence (batch_size,), expected one per head ({H},)",
                   "Average over the batch and the queries, keep the head axis: .mean(dim=(0, 2)) on (B, H, L).")
    if shape == ():
        raise fail(f"{what} are one number for all heads, expected one per head ({H},)",
                   "Average over the batch and the queries only, not over the heads: .mean(dim=(0, 2)) on (B, H, L).")
    if shape == (B, H):
        raise fail(f"{what} have shape {shape}: one per sequence and head, expected one per head ({H},)",
                   "Average over the batch too.")


def expect_score_dtype(out: Any, dtype: torch.dtype, what: str, of: str = "weights",
                       build: str = "Pick and average the weights with tensor operations (diagonal, gather, a mask, "
                                    "mean).") -> None:
    """Fail when a floating-point result doesn't keep the ``dtype`` of what it was computed from."""
    if isinstance(out, Tensor) and out.is_floating_point() and out.dtype != dtype:
        raise fail(f"{what} have dtype {out.dtype} for {of} of dtype {dtype}",
                   f"Keep that dtype: .double() and .float() change it, and so does torch.tensor([...]) of "
                   f"Python numbers (float32). {build}")


def _score_gradient(fn: Callable[..., Any], weights: Tensor, reference: Callable[[Tensor], Tensor],
                    *more: Any) -> None:
    """The learner's score must stay in autograd and give the reference's gradient."""
    ours, theirs = weights.clone().requires_grad_(True), weights.clone().requires_grad_(True)
    with torch.enable_grad():
        out = call(fn, ours, *more, what="your function (with gradients on)")
        if not isinstance(out, Tensor) or not out.requires_grad:
            raise fail("the scores are right but don't depend on the weights through autograd", SCORE_DETACH_HINT)
        direction = randn(gen(7), *out.shape)
        try:
            (out.double() * direction).sum().backward()
        except Exception as error:
            raise describe_error(error, "the backward pass through your function") from None
        (reference(theirs) * direction).sum().backward()
    if ours.grad is None or not close(ours.grad, theirs.grad):
        raise fail("the scores are right but their gradient with respect to the weights is not", SCORE_DETACH_HINT)


PREVIOUS_DEFINITION = ("previous_token_score(weights)[h] is the mean of weights[b, h, t, t - 1] over the queries "
                       "t = 1 ... L - 1 and the batch: weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)).")


def _previous_mistakes(w: Tensor) -> list[Mistake]:
    B, H, L, _ = w.shape
    d = w.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, H, L - 1)
    d0 = w.diagonal(dim1=-2, dim2=-1)  # (B, H, L)
    total = d.sum(dim=(0, 2))
    return [
        ("query 0 is counted too (it has no previous token)",
         lambda: [total / (B * L), (total + w[:, :, 0, 0].sum(0)) / (B * L)],
         "Query 0 has no token before it: average over t = 1 ... L - 1 only, L - 1 queries per sequence."),
        ("the wrong diagonal: query t -> key t (itself)", lambda: [d0[..., 1:].mean(dim=(0, 2)), d0.mean(dim=(0, 2))],
         "The previous token of query t is key t - 1: the diagonal *below* the main one, offset=-1."),
        ("the wrong diagonal: query t -> key t + 1, a future key that a causal head never sees",
         lambda: [w.diagonal(offset=1, dim1=-2, dim2=-1).mean(dim=(0, 2)), torch.zeros(H, dtype=w.dtype)],
         "Rows are queries, columns keys: key t - 1 of query t is the diagonal offset=-1 (below the main one)."),
        ("the weights were averaged over the keys too",
         lambda: [total / (B * L * L), total / (B * (L - 1) * L), total / (B * (L - 1) * (L - 1)),
                  w[:, :, 1:, :-1].mean(dim=(0, 2, 3))],
         "Each query contributes one number, its weight on key t - 1; average those over the queries and the batch, "
         "not over the whole L x L map."),
        ("a sum instead of a mean", lambda: [total, d.sum(2).mean(0), d.mean(2).sum(0)],
         "Average over the batch and the queries (.mean), so that a perfect previous-token head scores 1."),
        ("one score per sequence (averaged over the heads) instead of per head", lambda: d.mean(dim=(1, 2)),
         "Keep the head axis (dim 1): average over dims 0 (batch) and 2 (queries)."),
        ("the queries were counted with a number typed in, not L - 1 read from the weights",
         lambda: [total / (B * c) for c in range(1, 4 * L + 64) if c not in (L - 1, L)],
         f"Read the length from the weights, L = weights.size(-1) (here {L}), and divide by L - 1 queries per "
         "sequence; or let .mean() count them."),
    ]


def _stale(earlier: list[Tensor]) -> Mistake:
    return ("an earlier call's scores came back (a result kept from call to call, e.g. keyed on the shape)",
            lambda: list(earlier), "Keep nothing from one call to the next: compute from this call's weights, every "
                                   "time.")


def check_previous_token_score(fn: Callable[[Tensor], Any]) -> CheckResult:
    """Check ``fn(weights) -> (H,)``: for attention weights ``(B, H, L, L)``, each head's mean
    weight from query ``t`` to key ``t - 1``, over ``t = 1 ... L - 1`` and the batch; the
    weights' dtype kept, differentiable."""

    def body() -> str:
        g = gen(71)
        cases = [
            (_causal_weights(g, 3, 2, 6), "random causal weights (3, 2, 6, 6)"),
            (_causal_weights(g, 4, 4, 9).float(), "random causal weights (4, 4, 9, 9), float32"),
            (_causal_weights(g, 2, 3, 2), "random causal weights (2, 3, 2, 2)"),
            (_perfect_previous(2, 3, 7), "a perfect previous-token head (weight 1 on key t - 1), which scores 1"),
            (_uniform_weights(3, 2, 8), "uniform causal attention, which scores the uniform baseline "
                                        f"{_scores.uniform_previous_token_score(8):.4f}"),
            (_causal_weights(g, 3, 2, 6), "other random causal weights of the first input's shape (3, 2, 6, 6)"),
        ]
        earlier: list[Tensor] = []
        for w, label in cases:
            B, H, L, _ = w.shape
            (arg,) = cloned(w)
            out = call(fn, arg, what=f"your function ({label})", forbidden=[_scores.previous_token_score])
            check_unchanged(["weights"], [w], [arg], "your function")
            what = f"the scores for {label}"
            _score_shape(out, B, H, L, what)
            expect_score_dtype(out, w.dtype, what)
            out = expect_tensor(out, what, (H,), dtype=w.dtype, explain=" (H,), one score per head")
            w64 = w.double()
            expected = _scores.previous_token_score(w64)
            if not close(out, expected):
                shown = ", ".join(f"{v:.3f}" for v in out.double().tolist())
                raise diagnose(out, _previous_mistakes(w64) + [_stale(earlier)], f"wrong scores for {label} (yours: "
                               f"{shown})", PREVIOUS_DEFINITION, expected=expected, dim=0, axis="head")
            earlier.append(out)
        _score_gradient(fn, cases[0][0], _scores.previous_token_score)
        check_device_care(fn, on_meta(cases[0][0]), what="your function", hint=DEVICE_HINT)
        return (f"right on {len(cases)} inputs (a perfect previous-token head and uniform attention included), "
                "dtype and gradient kept, and on another device")

    return run_check("previous-token score", body)


DEVICE_HINT = ("Make any tensor you create on the weights' device, e.g. torch.arange(L, device=weights.device): "
               "the notebook calls this on the model's device.")
INDUCTION_DEFINITION = ("induction_score(weights, batch)[h] is the mean of weights[b, h, second + i, first + i + 1] "
                        "over i = 0 ... length - 2 (the queries whose next token the earlier copy tells) and over the "
                        "batch, all these queries pooled: sum over them / their number.")


def _picked(w: Tensor, queries: Tensor, keys: Tensor) -> tuple[Tensor, Tensor]:
    """``(w[b, h, t, keys[b, t]] * queries (B, H, L), queries (B, L) as w's dtype)``; keys outside [0, L) -> 0."""
    B, H, L, _ = w.shape
    ok = queries & (keys >= 0) & (keys < L)
    idx = torch.where(ok, keys, torch.zeros_like(keys))
    picked = w.gather(-1, idx[:, None, :, None].expand(B, H, L, 1)).squeeze(-1)  # (B, H, L)
    return picked * ok[:, None], ok.to(w.dtype)


def _pooled(w: Tensor, queries: Tensor, keys: Tensor) -> Tensor:
    picked, q = _picked(w, queries, keys)
    return picked.sum(dim=(0, 2)) / q.sum()


def _induction_mistakes(w: Tensor, batch: RepeatBatch) -> list[Mistake]:
    B, H, L, _ = w.shape
    t = torch.arange(L)[None, :]  # (1, L)
    f, s, n = batch.first[:, None], batch.second[:, None], batch.length[:, None]
    queries, keys = _scores.induction_queries(batch)
    picked, q = _picked(w, queries, keys)
    offset_keys = t - (s - f) + 1  # the offset diagonal, for every query
    return [
        ("the key is the current token's earlier occurrence (first + i), a duplicate-token head",
         lambda: _scores.duplicate_token_score(w, batch),
         "An induction head looks at the token *after* the earlier occurrence: key first + i + 1 for query second + i."),
        ("the copy's last query (second + n - 1) is counted too",
         lambda: _pooled(w, (t >= s) & (t <= s + n - 1), t - s + f + 1),
         "The copy's last token is followed by a random token, which no earlier copy tells: the queries are "
         "second + i for i = 0 ... n - 2."),
        ("the queries are the predictable tokens (second + 1 ... second + n - 1), one position late",
         lambda: [_pooled(w, batch.predictable, t - s + f + 1), _pooled(w, batch.predictable, t - s + f)],
         "batch.predictable marks the tokens that are *predicted*; the queries that predict them sit one position "
         "earlier: second + i for i = 0 ... n - 2."),
        ("the key is one position off: first + i + 2 or first + i - 1 instead of first + i + 1",
         lambda: [_pooled(w, queries, keys + 1), _pooled(w, queries, keys - 2)],
         "Query second + i holds the same token as first + i; the induction head looks at the token after it, "
         "key first + i + 1."),
        ("the copy's length was taken as one number for every row (a length typed in), not batch.length",
         lambda: [_pooled(w, (t >= s) & (t <= s + c - 2) & (t + (f - s) + 1 < L), t - s + f + 1)
                  for c in range(2, L + 1)],
         "Each row has its own length: use batch.length (with batch.first and batch.second), row by row."),
        ("every query on the offset diagonal, not only the second copy's",
         lambda: _pooled(w, (offset_keys >= 0) & (offset_keys <= t), offset_keys),
         "Only the second copy's queries have an earlier occurrence to look at: average over second + i, "
         "i = 0 ... n - 2, not over every position."),
        ("the mean over every position, with zeros outside the copy",
         lambda: [picked.sum(dim=(0, 2)) / (B * L), picked.sum(dim=(0, 2)) / (B * (L - 1))],
         "Divide by the number of scored queries (queries.sum()), not by B * L."),
        ("a sum instead of a mean",
         lambda: [picked.sum(dim=(0, 2)), picked.sum(2).mean(0), (picked.sum(2) / q.sum(1, keepdim=True)).sum(0)],
         "Average over the scored queries, so that a perfect induction head scores 1."),
        ("each sequence's queries were averaged first, then the sequences",
         lambda: (picked.sum(2) / q.sum(1, keepdim=True)).mean(0),
         "Pool every scored query of the batch: sum their weights and divide by their number; a per-row mean "
         "weighs short copies as much as long ones."),
        ("one score per sequence (averaged over the heads) instead of per head",
         lambda: picked.sum(dim=(1, 2)) / (H * q.sum(1)),
         "Keep the head axis (dim 1) and average over the batch and the queries."),
    ]


def _perfect_induction(batch: RepeatBatch, H: int) -> Tensor:
    B, L = batch.tokens.shape
    w = _uniform_weights(B, H, L)
    queries, keys = _scores.induction_queries(batch)
    b, t = queries.nonzero(as_tuple=True)
    w[b, :, t, :] = 0.0
    w[b, :, t, keys[b, t]] = 1.0
    return w


def copy_batch(batch: RepeatBatch) -> RepeatBatch:
    """A copy of the batch with its own tensors, to hand to the learner's function."""
    return replace(batch, **{name: getattr(batch, name).clone() for name in ("tokens", "predictable", "first",
                                                                             "second", "length")})


def check_induction_score(fn: Callable[[Tensor, RepeatBatch], Any]) -> CheckResult:
    """Check ``fn(weights, batch) -> (H,)``: for one layer's weights ``(B, H, L, L)`` on a
    :class:`~mha_lib.induction.RepeatBatch`, each head's mean weight from query ``second + i``
    to key ``first + i + 1``, over ``i = 0 ... length - 2`` and the batch (pooled); the weights'
    dtype kept, differentiable."""

    def body() -> str:
        g = gen(72)
        b1 = _data.repeated_segments(6, 16, 8, (3, 6), generator=gen(73))
        b2 = _data.repeated_segments(4, 20, 6, (2, 8), generator=gen(74))
        b3 = _data.repeated_segments(5, 12, 5, (2, 6), generator=gen(75))
        cases = [
            (_causal_weights(g, 6, 3, 16), b1, "random causal weights (6, 3, 16, 16)"),
            (_causal_weights(g, 4, 4, 20).float(), b2, "random causal weights (4, 4, 20, 20), float32"),
            (_perfect_induction(b3, 2), b3, "a perfect induction head (weight 1 on key first + i + 1), which scores 1"),
            (_uniform_weights(6, 2, 16), b1, "uniform causal attention, which scores the uniform baseline "
                                             f"{_scores.uniform_induction_score(b1):.4f}"),
            (_causal_weights(g, 6, 3, 16), b1, "other random causal weights of the first input's shape (6, 3, 16, 16)"),
        ]
        earlier: list[Tensor] = []
        for w, batch, label in cases:
            B, H, L, _ = w.shape
            (arg,), given = cloned(w), copy_batch(batch)
            out = call(fn, arg, given, what=f"your function ({label})",
                       forbidden=[_scores.induction_score])
            check_unchanged(["weights", "batch.tokens", "batch.predictable"], [w, batch.tokens, batch.predictable],
                            [arg, given.tokens, given.predictable], "your function")
            what = f"the scores for {label}"
            _score_shape(out, B, H, L, what)
            expect_score_dtype(out, w.dtype, what)
            out = expect_tensor(out, what, (H,), dtype=w.dtype, explain=" (H,), one score per head")
            w64 = w.double()
            expected = _scores.induction_score(w64, batch)
            if not close(out, expected):
                shown = ", ".join(f"{v:.3f}" for v in out.double().tolist())
                raise diagnose(out, _induction_mistakes(w64, batch) + [_stale(earlier)], f"wrong scores for {label} "
                               f"(yours: {shown})", INDUCTION_DEFINITION, expected=expected, dim=0, axis="head")
            earlier.append(out)
        _score_gradient(fn, cases[0][0], lambda w: _scores.induction_score(w, b1), copy_batch(b1))
        check_device_care(fn, on_meta(cases[0][0]), on_meta(b1), what="your function",
                          hint=DEVICE_HINT + " Move the batch's positions there too: batch.first.to(weights.device).")
        return (f"right on {len(cases)} inputs (a perfect induction head and uniform attention included), "
                "dtype and gradient kept, and on another device")

    return run_check("induction score", body)
