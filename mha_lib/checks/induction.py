"""Checks for chapter 08: the repeated-segment batch, previous-token and induction scores, and
the loss of a model with each head silenced in turn.

The references are :mod:`mha_lib.induction`'s own (``repeated_segments``'s definition of the
task, ``previous_token_score``, ``induction_score``, ``losses`` and ``silence_heads``), computed
in float64 where the learner's input allows it. The models of :func:`check_ablation_losses` are
small *untrained* ``AttentionOnlyTransformer`` s with seeded weights: the function's correctness
doesn't depend on training, and so the check is fast and the same on every machine.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..heads import silence_heads
from ..induction import data as _data
from ..induction import scores as _scores
from ..induction.data import RepeatBatch, repeated_segments
from ..induction.model import AttentionOnlyTransformer
from ..induction.train import losses
from ._core import (
    CheckResult,
    Mistake,
    call,
    check_unchanged,
    cloned,
    close,
    describe_error,
    diagnose,
    expect_tensor,
    fail,
    gen,
    randn,
    run_check,
    unpack_pair,
)

# ------------------------------------------------------------------ 8.1 the repeated-segment batch

BATCH_DEFINITION = ("Per row: n drawn in [segment[0], segment[1]] (both ends included), first and second with "
                    "second >= first + n (after the first copy ends) and second + n <= seq_len; "
                    "tokens[b, second:second + n] = tokens[b, first:first + n]; predictable is True at "
                    "second + 1 ... second + n - 1 and nowhere else.")
GENERATOR_HINT = ("Pass generator=generator to every torch.randint / torch.rand you call: then the same seed gives "
                  "the same batch, whatever else the notebook has drawn.")


def _runs(row: list[bool]) -> list[tuple[int, int]]:
    """The runs of True in a row: ``[(start, end), ...]``, ``end`` included."""
    runs, start = [], None
    for i, value in enumerate(row + [False]):
        if value and start is None:
            start = i
        elif not value and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs


def _copy_of(t: list[int], s: int, n: int, *, later: bool = False) -> tuple[int | None, bool]:
    """``(start, overlapping)`` of another occurrence of ``t[s:s + n]``: earlier (or ``later``) than ``s``,
    preferably one that doesn't overlap it; ``(None, False)`` if there is none."""
    if s < 0 or n < 1 or s + n > len(t):
        return None, False
    segment, overlapping = t[s:s + n], None
    starts = range(s + 1, len(t) - n + 1) if later else range(0, s)
    for f in starts:
        if t[f:f + n] == segment:
            if (f + n <= s) or (later and f >= s + n):
                return f, False
            overlapping = f if overlapping is None else overlapping
    if not later and overlapping is None:  # a copy made from the tokens before they were overwritten
        for p in range(1, n):  # the second copy's first p tokens repeat the p tokens before it
            if s - p >= 0 and t[s - p:s] == t[s:s + p]:
                overlapping = s - p
                break
    return overlapping, overlapping is not None


def _claim(t: list[int], mask: list[bool], claim: Callable[[int, int], tuple[int, int]] | str) -> tuple[int, int, int] | None:
    """``(first, second, n)`` if the row's mask, read by ``claim``, names a second copy with an earlier exact copy
    that doesn't overlap it; None otherwise. ``claim`` maps the marked run ``(a, b)`` to ``(second, n)``."""
    runs = _runs(mask)
    if claim == "first copy too":
        if len(runs) < 2:
            return None
        a, b = runs[-1]
        s, n = a - 1, b - a + 2
        f, overlapping = _copy_of(t, s, n)
        others = [i for run in runs[:-1] for i in range(run[0], run[1] + 1)]
        if f is None or overlapping or not all(f <= i < f + n for i in others):
            return None
        return f, s, n
    if len(runs) != 1:
        return None
    a, b = runs[0]
    if claim == "first instead":
        s, n = a - 1, b - a + 2
        later, overlapping = _copy_of(t, s, n, later=True)
        return None if later is None or overlapping else (s, later, n)
    s, n = claim(a, b)  # type: ignore[operator]
    f, overlapping = _copy_of(t, s, n)
    return None if f is None or overlapping else (f, s, n)


MASK_MISTAKES: list[tuple[str, Callable[[int, int], tuple[int, int]] | str, str]] = [
    ("it marks the positions just before the predictable tokens (second ... second + n - 2)",
     lambda a, b: (a, b - a + 2),
     "predictable marks the tokens that can be predicted, second + 1 ... second + n - 1. (The model reads them "
     "one position earlier, logits[:, t - 1] predicts token t, but the mask is about the tokens.)"),
    ("the copy's first token is marked too",
     lambda a, b: (a, b - a + 1),
     "The copy's first token follows a random token: nothing before it says that the copy begins, so it can't be "
     "predicted. predictable starts at second + 1."),
    ("it is off by one at the end: the token after the copy is marked",
     lambda a, b: (a - 1, b - a + 1),
     "The copy's last token is second + n - 1: mark the positions second < t < second + n (strictly less)."),
    ("the first copy is marked too", "first copy too",
     "Only the second copy is predictable: nothing before the first copy says what its tokens will be."),
    ("the first copy is marked instead of the second", "first instead",
     "The second copy is the predictable one: its tokens repeat the first copy's, which came earlier."),
]


def _describe_ids(tokens: Tensor) -> str:
    return f"ids from {tokens.min().item()} to {tokens.max().item()}"


def _batch_from(fn: Callable[..., Any], B: int, L: int, V: int, segment: tuple[int, int],
                g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Call the learner's function and check the two tensors' types, shapes and dtypes."""
    where = f"(batch_size={B}, seq_len={L}, vocab_size={V}, segment={segment})"
    result = call(fn, B, L, V, segment, generator=g, what=f"your function {where}", forbidden=[repeated_segments])
    if isinstance(result, RepeatBatch):
        result = (result.tokens, result.predictable)
    tokens, predictable = unpack_pair(result, "your function", "tokens", "predictable")
    if isinstance(tokens, Tensor) and tokens.dim() == 2 and tokens.shape == (L, B) and L != B:
        raise fail(f"tokens have shape {(L, B)} {where}, expected {(B, L)}: batch and positions swapped",
                   "One row per sequence: tokens are (batch_size, seq_len).")
    tokens = expect_tensor(tokens, f"the tokens {where}", (B, L), dtype="any", explain=" (batch_size, seq_len)")
    if tokens.dtype != torch.long:
        raise fail(f"the tokens {where} have dtype {tokens.dtype}; expected token ids as torch.long (int64)",
                   "Token ids index an embedding table and are cross-entropy's targets: both want torch.long, "
                   "which is what torch.randint gives unless told otherwise.")
    tokens = tokens.cpu()
    if tokens.min() < 0 or tokens.max() >= V:
        raise fail(f"the tokens {where} hold {_describe_ids(tokens)}, expected ids 0 ... {V - 1}",
                   "torch.randint(vocab_size, size) draws 0 ... vocab_size - 1: its upper end is exclusive.")
    if isinstance(predictable, Tensor) and predictable.dim() == 2 and predictable.shape[0] == B \
            and predictable.shape[1] in (L - 1, L + 1):
        raise fail(f"predictable has shape {tuple(predictable.shape)} {where}, expected {(B, L)}",
                   "One entry per token, like tokens: predictable[b, t] says whether token t can be predicted.")
    predictable = expect_tensor(predictable, f"predictable {where}", (B, L), dtype="any", explain=" (batch_size, seq_len)")
    if predictable.dtype != torch.bool:
        raise fail(f"predictable {where} has dtype {predictable.dtype}; expected a bool mask (torch.bool)",
                   "Build it from comparisons, e.g. (position > second[:, None]) & ..., which give torch.bool. "
                   "An int or float 0/1 tensor doesn't select: tokens[mask] with an int mask picks rows 0 and 1.")
    return tokens, predictable.cpu()


def _structure(tokens: Tensor, predictable: Tensor, segment: tuple[int, int], where: str) -> list[tuple[int, int, int]]:
    """``[(first, second, n)]`` per row, read from the mask; fail naming what is wrong with a row."""
    lo, hi = segment
    rows_t, rows_m = tokens.tolist(), predictable.tolist()
    empty = [b for b, m in enumerate(rows_m) if not any(m)]
    if empty:
        some = "no row" if len(empty) == len(rows_m) else f"row {empty[0]}"
        raise fail(f"{where}: {some} has a token marked predictable",
                   "predictable is True at the second copy's tokens except its first: second + 1 ... second + n - 1.")
    found = [_claim(t, m, lambda a, b: (a - 1, b - a + 2)) for t, m in zip(rows_t, rows_m)]
    if all(found):
        return _check_found(rows_t, found, segment, where)  # type: ignore[arg-type]
    overlaps = []
    for b, (t, m) in enumerate(zip(rows_t, rows_m)):
        runs = _runs(m)
        if found[b] is None and len(runs) == 1:
            a, e = runs[0]
            f, overlapping = _copy_of(t, a - 1, e - a + 2)
            if overlapping:
                overlaps.append((b, f, a - 1, e - a + 2))
    if overlaps and all(found[b] is not None or b in {o[0] for o in overlaps} for b in range(len(rows_t))):
        b, f, s, n = overlaps[0]
        raise fail(f"{where}: the two copies overlap in row {b} (the segment of {n} tokens starts at {f}, its copy "
                   f"at {s}, before the first one has ended)",
                   "Draw second after the first copy ends: second in [first + n, seq_len - n]. " + BATCH_DEFINITION)
    for name, claim, hint in MASK_MISTAKES:
        if all(_claim(t, m, claim) for t, m in zip(rows_t, rows_m)):
            raise fail(f"{where}: predictable is wrong: {name}", hint)
    b = next(i for i, x in enumerate(found) if x is None)
    runs = _runs(rows_m[b])
    if len(runs) > 1:
        raise fail(f"{where}: row {b} marks {len(runs)} separate runs of tokens predictable "
                   f"(positions {', '.join(f'{a}-{e}' if a != e else str(a) for a, e in runs)})",
                   "Only one run is predictable: the second copy after its first token. " + BATCH_DEFINITION)
    a, e = runs[0]
    raise fail(f"{where}: in row {b}, the tokens marked predictable (positions {a} to {e}) and the one before them "
               "are not a copy of an earlier segment",
               "Draw all the random tokens first, then copy: tokens[b, second:second + n] = tokens[b, first:first + n] "
               "(or torch.gather). " + BATCH_DEFINITION)


def _check_found(rows_t: list[list[int]], found: list[tuple[int, int, int]], segment: tuple[int, int],
                 where: str) -> list[tuple[int, int, int]]:
    lo, hi = segment
    L = len(rows_t[0])
    checkable = [(t, f, s, n) for t, (f, s, n) in zip(rows_t, found) if s + n < L]
    if len(checkable) >= 8 and all(t[s + n] == t[f + n] for t, f, s, n in checkable):
        raise fail(f"{where}: predictable is off by one at the end: in every row the copy goes on one token after "
                   "the marked ones (the copy's last token is not marked, or one token more than n was copied)",
                   "The copy is tokens second ... second + n - 1 (n tokens); mark second + 1 ... second + n - 1.")
    for b, (f, s, n) in enumerate(found):
        if not lo <= n <= hi:
            raise fail(f"{where}: row {b} repeats a segment of {n} tokens, outside segment=({lo}, {hi})",
                       "Draw each row's length between segment[0] and segment[1], both included: "
                       "segment[0] + torch.randint(segment[1] - segment[0] + 1, ...). " + BATCH_DEFINITION)
    return found


def check_repeated_segment_batch(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(batch_size, seq_len, vocab_size, segment, generator) -> (tokens, predictable)``:
    ``tokens (B, L)`` long ids in ``[0, V)`` in which a segment of random length in
    ``[segment[0], segment[1]]`` appears twice per row, the second copy after the first ends and
    at an offset that varies from row to row; ``predictable (B, L)`` bool, True exactly at the
    second copy's tokens except its first. Every number comes from ``generator``."""

    def body() -> str:
        cases = [(128, 32, 64, (6, 10), 0), (16, 20, 10, (2, 10), 1), (40, 24, 5, (3, 5), 2), (3, 9, 100, (4, 4), 3)]
        first_batch = None
        for B, L, V, segment, seed in cases:
            where = f"batch_size={B}, seq_len={L}, vocab_size={V}, segment={segment}"
            tokens, predictable = _batch_from(fn, B, L, V, segment, gen(seed))
            found = _structure(tokens, predictable, segment, where)
            if first_batch is None:
                first_batch = (tokens, predictable)
                lengths = {n for _, _, n in found}
                if max(lengths) < segment[1] or min(lengths) > segment[0]:
                    end = (f"the longest length, segment[1] = {segment[1]}" if max(lengths) < segment[1]
                           else f"the shortest length, segment[0] = {segment[0]}")
                    raise fail(f"{where}: in {B} rows, {end}, never occurs (lengths {min(lengths)} to {max(lengths)})",
                               "Both ends are included. torch.randint(low, high) never draws high: "
                               "segment[0] + torch.randint(segment[1] - segment[0] + 1, (batch_size,)).")
                offsets = {s - f for f, s, _ in found}
                if len(offsets) == 1:
                    raise fail(f"{where}: the second copy starts {offsets.pop()} tokens after the first in every row, "
                               "a fixed offset: one layer could solve it by position alone",
                               "Draw first and second per row, second anywhere in [first + n, seq_len - n], so that "
                               "only an earlier occurrence of the current token tells where the copy came from.")
                for name, index in (("first", 0), ("second", 1)):
                    starts = {x[index] for x in found}
                    if len(starts) == 1:
                        raise fail(f"{where}: the {name} copy starts at position {starts.pop()} in every row",
                                   "Draw the start positions per row (a tensor of batch_size values), so that the "
                                   "copies sit anywhere in the sequence.")
                ids = set(tokens.unique().tolist())
                for missing, why in ((V - 1, "the last id"), (0, "id 0")):
                    if missing not in ids:
                        raise fail(f"{where}: {why}, {missing}, never occurs in {B * L} tokens",
                                   "Draw ids over the whole vocabulary: torch.randint(vocab_size, size) gives "
                                   "0 ... vocab_size - 1.")
        B, L, V, segment, seed = cases[0]
        where = f"batch_size={B}, seq_len={L}, vocab_size={V}, segment={segment}"
        torch.manual_seed(1234)  # the global generator in another state: it must not matter
        g = gen(seed)
        again = _batch_from(fn, B, L, V, segment, g)
        if not all(torch.equal(a, b) for a, b in zip(again, first_batch)):
            raise fail(f"{where}: a generator with the same seed gave another batch: it looks like your function "
                       "draws (some of) its numbers from PyTorch's global generator instead of `generator`",
                       GENERATOR_HINT)
        following = _batch_from(fn, B, L, V, segment, g)  # the same generator, further on
        if any(torch.equal(a, b) for a, b in zip(following, first_batch)):
            raise fail(f"{where}: two calls with the same generator put the copies at the same places (or drew the "
                       "same tokens): your function reseeds it, or draws from a generator of its own",
                       "Use the generator you are given as it is; each call draws new numbers from it.")
        other = _batch_from(fn, B, L, V, segment, gen(seed + 100))
        if any(torch.equal(a, b) for a, b in zip(other, first_batch)):
            raise fail(f"{where}: generators with different seeds gave the same batch: your function ignores "
                       "`generator`", GENERATOR_HINT)
        return (f"a copy after the first, at varying offsets, and the right mask in {len(cases)} batch sizes; "
                "the same seed gives the same batch")

    return run_check("repeated-segment batch", body)


# ------------------------------------------------------------------ 8.2 scoring heads


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


def _check_score_dtype(out: Any, dtype: torch.dtype, what: str, of: str = "weights",
                       build: str = "Pick and average the weights with tensor operations (diagonal, gather, a mask, "
                                    "mean).") -> None:
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
    ]


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
        ]
        for w, label in cases:
            B, H, L, _ = w.shape
            (arg,) = cloned(w)
            out = call(fn, arg, what=f"your function ({label})", forbidden=[_scores.previous_token_score])
            check_unchanged(["weights"], [w], [arg], "your function")
            what = f"the scores for {label}"
            _score_shape(out, B, H, L, what)
            _check_score_dtype(out, w.dtype, what)
            out = expect_tensor(out, what, (H,), dtype=w.dtype, explain=" (H,), one score per head")
            w64 = w.double()
            expected = _scores.previous_token_score(w64)
            if not close(out, expected):
                shown = ", ".join(f"{v:.3f}" for v in out.double().tolist())
                raise diagnose(out, _previous_mistakes(w64), f"wrong scores for {label} (yours: {shown})",
                               PREVIOUS_DEFINITION)
        _score_gradient(fn, cases[0][0], _scores.previous_token_score)
        return f"right on {len(cases)} inputs (a perfect previous-token head and uniform attention included), dtype and gradient kept"

    return run_check("previous-token score", body)


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


def _copy_batch(batch: RepeatBatch) -> RepeatBatch:
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
        ]
        for w, batch, label in cases:
            B, H, L, _ = w.shape
            (arg,), given = cloned(w), _copy_batch(batch)
            out = call(fn, arg, given, what=f"your function ({label})",
                       forbidden=[_scores.induction_score])
            check_unchanged(["weights", "batch.tokens", "batch.predictable"], [w, batch.tokens, batch.predictable],
                            [arg, given.tokens, given.predictable], "your function")
            what = f"the scores for {label}"
            _score_shape(out, B, H, L, what)
            _check_score_dtype(out, w.dtype, what)
            out = expect_tensor(out, what, (H,), dtype=w.dtype, explain=" (H,), one score per head")
            w64 = w.double()
            if not close(out, _scores.induction_score(w64, batch)):
                shown = ", ".join(f"{v:.3f}" for v in out.double().tolist())
                raise diagnose(out, _induction_mistakes(w64, batch), f"wrong scores for {label} (yours: {shown})",
                               INDUCTION_DEFINITION)
        _score_gradient(fn, cases[0][0], lambda w: _scores.induction_score(w, b1), _copy_batch(b1))
        return (f"right on {len(cases)} inputs (a perfect induction head and uniform attention included), "
                "dtype and gradient kept")

    return run_check("induction score", body)


# ------------------------------------------------------------------ 8.3 which heads does the model need?


def _untrained_model(seed: int, V: int, D: int, H: int, layers: int, L: int, positions: str,
                     dtype: torch.dtype) -> AttentionOnlyTransformer:
    """A small attention-only model with seeded random weights, large enough that every head matters."""
    torch.manual_seed(seed)
    model = AttentionOnlyTransformer(V, d_model=D, num_heads=H, num_layers=layers, max_len=L, positions=positions)
    g = gen(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embedding" in name:
                p.copy_(randn(g, *p.shape))
            elif p.dim() > 1:
                p.copy_(randn(g, *p.shape, scale=(1.0 if name.startswith("unembed") else 1.5) * p.shape[1] ** -0.5))
            else:
                p.copy_(randn(g, *p.shape, scale=0.2))
    return model.to(dtype).eval()


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _predictable_loss(logits: Tensor, batch: RepeatBatch, shift: int = 1) -> Tensor:
    """Cross-entropy on the predictable tokens, position ``t - shift`` predicting token ``t``."""
    V = logits.size(-1)
    if shift == 1:
        return losses(logits, batch)[1]
    if shift == 0:
        return F.cross_entropy(logits[batch.predictable].reshape(-1, V), batch.tokens[batch.predictable])
    return F.cross_entropy(logits[:, 1:][batch.predictable[:, :-1]], batch.tokens[:, :-1][batch.predictable[:, :-1]])


def _ablated(model: AttentionOnlyTransformer, batch: RepeatBatch, silenced: Callable[[int, int], list[tuple[int, list[int]]]],
             loss: Callable[[Tensor], Tensor]) -> Tensor:
    """``(num_layers, H)``: ``loss(logits)`` with the heads that ``silenced(l, h)`` names switched off."""
    rows = []
    with torch.no_grad():
        for l in range(model.num_layers):
            row = []
            for h in range(model.num_heads):
                with ExitStack() as stack:
                    for layer, heads in silenced(l, h):
                        stack.enter_context(silence_heads(model.layers[layer], heads))
                    row.append(loss(model(batch.tokens)))
            rows.append(torch.stack(row))
    return torch.stack(rows)


ABLATION_DEFINITION = ("Entry [l, h] is the mean cross-entropy on the predictable tokens, "
                       "mha_lib.induction.losses(logits, batch)[1], of the model's logits computed inside "
                       "`with silence_heads(model.layers[l], [h]):`.")


def _call_leaving_model_alone(fn: Callable[..., Any], model: AttentionOnlyTransformer, batch: RepeatBatch,
                              what: str) -> Any:
    """Call ``fn(model, batch)``; fail if it left the model, the batch or the grad mode changed."""
    grad_mode, hooks = torch.is_grad_enabled(), _hooks(model)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    given = _copy_batch(batch)
    try:
        out = call(fn, model, given, what=what)
    finally:
        changed_grad = torch.is_grad_enabled() != grad_mode
        torch.set_grad_enabled(grad_mode)
    check_unchanged(["batch.tokens", "batch.predictable"], [batch.tokens, batch.predictable],
                    [given.tokens, given.predictable], "your function")
    if changed_grad:
        raise fail("your function left gradients switched off for everything that runs after it",
                   "Switch them off for a block only: `with torch.no_grad():` switches them back on when the block "
                   "ends (torch.set_grad_enabled(False) does not).")
    if _hooks(model) != hooks:
        raise fail("your function left a hook on the model: every later forward pass still silences a head",
                   "Silence inside `with silence_heads(model.layers[l], [h]):`; the hook is removed when the block "
                   "ends, also after an error.")
    if model.training:
        raise fail("your function left the model in training mode",
                   "It only evaluates the model: leave its mode alone (no model.train()), or put back the mode you "
                   "found: model.train(was_training).")
    if any(not torch.equal(p, params[n]) for n, p in model.named_parameters()):
        raise fail("your function changed the model's parameters",
                   "Silence a head on the way through (silence_heads adds a hook and removes it) instead of "
                   "zeroing weights.")
    if any(p.grad is not None for p in model.parameters()):
        raise fail("your function left gradients in the model's parameters (.grad)",
                   "Only evaluate: compute the losses under `with torch.no_grad():` and call no backward().")
    return out


def check_ablation_losses(fn: Callable[[AttentionOnlyTransformer, RepeatBatch], Any]) -> CheckResult:
    """Check ``fn(model, batch) -> (num_layers, H)``: entry ``[l, h]`` is the loss on the
    predictable tokens (``mha_lib.induction.losses(logits, batch)[1]``) with head ``h`` of layer
    ``l`` silenced (``silence_heads(model.layers[l], [h])``); the model is left as it was found
    (no hook, eval mode, same parameters, gradients on), and a second call gives the same."""

    def body() -> str:
        cases = [
            dict(seed=81, V=12, D=12, H=3, layers=2, L=16, B=8, segment=(3, 6), positions="learned", dtype=torch.float32),
            dict(seed=82, V=10, D=8, H=2, layers=2, L=12, B=6, segment=(2, 5), positions="rotary", dtype=torch.float64),
            dict(seed=83, V=9, D=8, H=2, layers=3, L=14, B=5, segment=(3, 7), positions="sinusoidal", dtype=torch.float32),
        ]
        for number, c in enumerate(cases):
            model = _untrained_model(c["seed"], c["V"], c["D"], c["H"], c["layers"], c["L"], c["positions"], c["dtype"])
            batch = repeated_segments(c["B"], c["L"], c["V"], c["segment"], generator=gen(c["seed"]))
            layers, H = c["layers"], c["H"]
            label = f"a {layers}-layer model with {H} heads per layer, {str(c['dtype']).replace('torch.', '')}"
            expected = _ablated(model, batch, lambda l, h: [(l, [h])], lambda z: losses(z, batch)[1])
            with torch.no_grad():
                intact = losses(model(batch.tokens), batch)[1]
            out = _call_leaving_model_alone(fn, model, batch, f"your function ({label})")
            what = f"the losses for {label}"
            if isinstance(out, Tensor) and tuple(out.shape) == (H, layers) and H != layers:
                raise fail(f"{what} have shape {(H, layers)}: transposed, expected (num_layers, H) = {(layers, H)}",
                           "One row per layer, one column per head: out[l, h].")
            if isinstance(out, Tensor) and tuple(out.shape) == (layers * H,):
                raise fail(f"{what} have shape {(layers * H,)}, expected (num_layers, H) = {(layers, H)}",
                           "One row per layer: torch.stack the rows, or .reshape(num_layers, H).")
            _check_score_dtype(out, c["dtype"], what, of="a model",
                               build="torch.stack the loss tensors into rows, and the rows into a table.")
            out = expect_tensor(out, what, (layers, H), dtype=c["dtype"], explain=" (num_layers, H)")
            if not close(out, expected):
                shown = "; ".join(", ".join(f"{v:.3f}" for v in row) for row in out.double().tolist())
                raise diagnose(out, _ablation_mistakes(model, batch, expected, intact),
                               f"wrong losses for {label} (yours: {shown})", ABLATION_DEFINITION)
            if number == 0:
                again = _call_leaving_model_alone(fn, model, batch, f"your function ({label}, called a second time)")
                if not isinstance(again, Tensor) or not close(again.detach(), out):
                    raise fail(f"a second call on the same model gave other losses ({label}): something your "
                               "function changes stays changed", "Leave the model as you found it.")
        return (f"right for {len(cases)} untrained models (2 and 3 layers, 2 and 3 heads, float32 and float64), "
                "twice on the same model; the model is left as it was")

    def on_one_thread() -> str:  # models this small run many times faster on one thread of a busy CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return body()
        finally:
            torch.set_num_threads(threads)

    return run_check("ablation losses", on_one_thread)


def _ablation_mistakes(model: AttentionOnlyTransformer, batch: RepeatBatch, expected: Tensor,
                       intact: Tensor) -> list[Mistake]:
    H = model.num_heads

    def each(silenced: Callable[[int, int], list[tuple[int, list[int]]]], shift: int = 1, which: int = 1):
        if which == 1:
            return lambda: _ablated(model, batch, silenced, lambda z: _predictable_loss(z, batch, shift))
        return lambda: _ablated(model, batch, silenced, lambda z: losses(z, batch)[which])

    one = lambda l, h: [(l, [h])]  # noqa: E731
    return [
        ("the increase over the intact model's loss, not the loss itself",
         lambda: [expected - intact, intact - expected],
         "Return the loss with the head silenced; compare it with the intact model's loss afterwards, in the "
         "notebook."),
        ("nothing was silenced (every entry is the intact model's loss)", lambda: intact.expand_as(expected),
         "Compute the logits *inside* `with silence_heads(model.layers[l], [h]):`."),
        ("each entry silences the whole layer", each(lambda l, h: [(l, list(range(H)))]),
         "Silence one head at a time: silence_heads(model.layers[l], [h]), a list holding only h."),
        ("every row silences the heads of layer 0 (model.layers[0] instead of model.layers[l])",
         each(lambda l, h: [(0, [h])]), "Row l silences the heads of model.layers[l]."),
        ("the loss over all tokens, not only the predictable ones", each(one, which=0),
         "Only the predictable tokens tell whether the model copies: losses(logits, batch)[1]."),
        ("the loss over the unpredictable tokens", each(one, which=2),
         "losses(logits, batch) returns (all, predictable, other): take [1]."),
        ("the logits at the wrong position: logits[:, t] scored against token t, not t + 1",
         lambda: [each(one, shift=0)(), each(one, shift=-1)()],
         "Position t predicts token t + 1: score logits[:, :-1] against tokens[:, 1:] (losses(logits, batch) does)."),
        ("the rows and columns are swapped (entry [h, l])", lambda: expected.T,
         "One row per layer, one column per head: out[l, h]."),
    ]
