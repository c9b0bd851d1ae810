"""Check for exercise 8.1 (chapter 08): the repeated-segment batch, random tokens in which a
segment of random length appears twice per row, and the mask of the tokens that can be predicted.

The reference is :func:`mha_lib.induction.repeated_segments`'s definition of the task. The check
reads each row's copies back from the learner's mask (``_structure``), so that a wrong mask is
named by what it marks: the copy's first token, the first copy, one token too many, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..induction.data import RepeatBatch, repeated_segments
from ._core import CheckResult, call, expect_tensor, fail, gen, run_check, unpack_pair

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
    if isinstance(tokens, Tensor) and isinstance(predictable, Tensor) and tokens.dtype == torch.bool \
            and not predictable.is_floating_point() and predictable.dtype != torch.bool:
        raise fail(f"your function {where} returned (predictable, tokens): the first tensor is a bool mask and the "
                   f"second holds {predictable.dtype} ids, the pair is swapped",
                   "Return them in the order of the exercise: return tokens, predictable.")
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
        some = "no row has a token" if len(empty) == len(rows_m) else f"row {empty[0]} has no token"
        raise fail(f"{where}: {some} marked predictable",
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
    short = [_claim(t, m, lambda a, b: (a - 1, b - a + 1)) for t, m in zip(rows_t, rows_m)]
    if all(short) and all(lo <= e - a + 2 <= hi for m in rows_m for a, e in _runs(m)):
        b = next(i for i, x in enumerate(found) if x is None)
        f, s, n = short[b]  # type: ignore[misc]
        raise fail(f"{where}: the copy is one token short: in row {b} the mask marks a segment of {n + 1} tokens "
                   f"(positions {s + 1} to {s + n}, after the copy's first token {s}), but only {n} tokens were "
                   f"copied (from {f}); position {s + n} is not a copy of {f + n}",
                   "Copy all n tokens: tokens[b, second:second + n] = tokens[b, first:first + n] (the end of a slice "
                   "is excluded, so second + n, not second + n - 1). " + BATCH_DEFINITION)
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
                if len(lengths) == 1 and segment[0] < segment[1]:
                    raise fail(f"{where}: every one of the {B} rows repeats a segment of {lengths.pop()} tokens: it "
                               "looks like one length n was drawn for the whole batch",
                               "Draw n per row (inside the loop over the rows, or a tensor of batch_size lengths: "
                               "segment[0] + torch.randint(segment[1] - segment[0] + 1, (batch_size,), "
                               "generator=generator)).")
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
                if B >= 64 and all(s == f + n for f, s, n in found):
                    raise fail(f"{where}: in every one of the {B} rows the second copy starts right where the first "
                               "ends (second = first + n): second is not drawn, so the offset is always the length",
                               "Draw second too, per row, anywhere in [first + n, seq_len - n] "
                               "(torch.randint(first + n, seq_len - n + 1, (), generator=generator)).")
                for name, index in (("first", 0), ("second", 1)):
                    starts = [x[index] for x in found]
                    if len(set(starts)) == 1:
                        raise fail(f"{where}: the {name} copy starts at position {starts[0]} in every row",
                                   "Draw the start positions per row (a tensor of batch_size values), so that the "
                                   "copies sit anywhere in the sequence.")
                    most = max(set(starts), key=starts.count)
                    if B >= 64 and starts.count(most) > B // 2:
                        raise fail(f"{where}: the {name} copy starts at position {most} in {starts.count(most)} of "
                                   f"the {B} rows: it looks like one position was drawn for the whole batch (and "
                                   "moved only where the row's length made it not fit)",
                                   "Draw first and second per row (inside the loop over the rows, or tensors of "
                                   "batch_size values), so that the copies sit anywhere in the sequence.")
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
