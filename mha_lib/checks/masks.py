"""Checks for chapters 01 and 04: the causal mask, the padding mask, and both at once."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import masks as mha_masks
from ._core import ERROR, CheckResult, Verdict, call, check_device_care, expect_tensor, fail, on_meta, run_check

FUTURE_HINT = "Rows are queries, columns are keys: query i may see keys j <= i, the lower triangle (torch.tril)."


def _causal(L: int) -> Tensor:
    return torch.ones(L, L, dtype=torch.bool).tril()


def _keep(lengths: list[int], L: int) -> Tensor:
    return torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)


def _causal_mistakes(L: int) -> list[tuple[str, Tensor, str]]:
    ref = _causal(L)
    return [
        ("the mask is inverted (True where attention is blocked)", ~ref,
         "Use True for *may attend*: query i may attend to keys 0..i, the lower triangle with the diagonal."),
        ("it hides each token from itself (the diagonal is False)", ref.tril(-1),
         "A token may attend to itself: keep the diagonal (torch.tril with diagonal=0)."),
        ("it lets tokens see the future instead of the past (upper triangle)", ref.T, FUTURE_HINT),
        ("it lets tokens see only the future, without themselves", ~ref.T, FUTURE_HINT),
        ("nothing is blocked, so every token may see the future", torch.ones(L, L, dtype=torch.bool),
         "Block the keys after each query: keep only the lower triangle, torch.tril."),
    ]


def check_causal_mask(fn: Callable[[int], Any]) -> CheckResult:
    """Check ``fn(seq_len) -> mask``: bool ``(L, L)``, True = may attend, query i sees keys 0..i."""

    def body() -> str:
        lengths = [4, 7, 1, 16]
        for L in lengths:
            mask = call(fn, L, what=f"your function (seq_len={L})", forbidden=[mha_masks.causal_mask])
            if isinstance(mask, Tensor) and mask.shape == (L, L) and mask.dtype != torch.bool:
                values = sorted({float(x) for x in mask.detach().flatten().tolist()})
                hint = ("Your mask holds 0s and 1s: convert it with .bool()" if set(values) <= {0.0, 1.0}
                        else "A float mask holds 0 and -inf; this exercise wants a boolean mask.")
                raise fail(f"the mask for seq_len={L} has dtype {mask.dtype}, expected torch.bool (True = may attend)", hint)
            mask = expect_tensor(mask, f"the mask for seq_len={L}", (L, L), dtype="bool").cpu()
            if not torch.equal(mask, _causal(L)):
                for name, wrong, hint in _causal_mistakes(L):
                    if torch.equal(mask, wrong):
                        raise fail(f"wrong mask for seq_len={L}: {name}", hint)
                raise fail(f"wrong mask for seq_len={L}", "Query i (row) may attend to keys j <= i (columns): torch.tril.")
        return "correct for seq_len = " + ", ".join(map(str, lengths))

    return run_check("causal mask", body)


def _max_len_is_optional(fn: Callable[..., Any]) -> bool:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) < 2 or positional[1].default is not inspect.Parameter.empty


def check_padding_mask(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(lengths, max_len=None) -> mask``: bool ``(B, 1, 1, max_len)``, True for
    the real tokens (``j < lengths[b]``), False for the padding; without ``max_len``, the
    mask is as long as the longest sequence (as ``mha_lib.padding_mask``)."""

    def body() -> str:
        cases = [([3, 1, 4], 4), ([2, 5], 7), ([1], 1), ([2, 3], None)]
        for lengths, max_len in cases:
            if max_len is None and not _max_len_is_optional(fn):
                raise fail("max_len must be optional: your function can't be called as padding_mask(lengths)",
                           "Give it a default, def padding_mask(lengths, max_len=None), and pad to the longest "
                           "sequence when it is None, as mha_lib.padding_mask(lengths) does.")
            args = [list(lengths)] + ([] if max_len is None else [max_len])
            L = max(lengths) if max_len is None else max_len
            mask = call(fn, *args, what=f"your function (lengths={lengths}, max_len={max_len})",
                        forbidden=[mha_masks.padding_mask])
            B = len(lengths)
            if isinstance(mask, Tensor) and mask.shape == (B, L) != (B, 1, 1, L):
                raise fail(f"the mask has shape {tuple(mask.shape)}, expected {(B, 1, 1, L)}",
                           "Add axes for the heads and the queries, mask[:, None, None, :], so that it "
                           "broadcasts against scores (B, H, Lq, Lk).")
            if isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[-1] == max(lengths) != L:
                raise fail(f"the mask for lengths={lengths}, max_len={max_len} has shape {tuple(mask.shape)}: "
                           "max_len was ignored (the mask is only as long as the longest sequence)",
                           "The batch may be padded beyond its longest sequence: compare the positions "
                           "torch.arange(max_len) with the lengths.")
            if max_len is None and isinstance(mask, Tensor) and mask.dim() == 4 and mask.shape[-1] != L:
                raise fail(f"without max_len, the mask for lengths={lengths} has shape {tuple(mask.shape)}, "
                           f"expected {(B, 1, 1, L)}", "With max_len=None, pad to the longest sequence: max(lengths).")
            mask = expect_tensor(mask, "the mask", (B, 1, 1, L), dtype="bool")
            got, expected = mask[:, 0, 0].cpu(), _keep(lengths, L)
            if not torch.equal(got, expected):
                if torch.equal(got, ~expected):
                    raise fail(f"the mask is inverted for lengths={lengths}",
                               "True means *may attend*: True for the real tokens, False for the padding.")
                if torch.equal(got, torch.arange(L)[None, :] <= torch.tensor(lengths)[:, None]):
                    raise fail(f"off by one for lengths={lengths}: the first padding position is still allowed",
                               "Positions 0 .. length-1 are real: use position < length, not <=.")
                raise fail(f"wrong mask for lengths={lengths}, max_len={max_len}",
                           "mask[b, 0, 0, j] is True exactly when j < lengths[b].")
        return f"correct on {len(cases)} batches (padded beyond the longest sequence, and without max_len)"

    return run_check("padding mask", body)


SEQ_LEN_HINT = ("The batch may be padded beyond its longest sequence: build the padding part for seq_len "
                "positions, padding_mask(lengths, max_len=seq_len), not padding_mask(lengths).")


def check_causal_padding_mask(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(lengths, seq_len) -> mask``: bool ``(B, 1, L, L)``; query i of sequence b
    may attend to key j when ``j <= i`` and ``j < lengths[b]``. ``seq_len`` may exceed
    the longest length (a batch padded further)."""

    def body() -> str:
        cases = [([4, 2, 3], 4), ([5, 1], 5), ([3, 1], 5)]
        for lengths, L in cases:
            beyond = max(lengths) < L
            try:
                mask = call(fn, list(lengths), L, what=f"your function (lengths={lengths}, seq_len={L})")
            except Verdict as verdict:
                if verdict.status == ERROR and beyond:
                    raise fail(f"your function fails when seq_len={L} is longer than the longest sequence "
                               f"({max(lengths)}): it looks like seq_len was not used for the padding mask "
                               f"({verdict.message})", SEQ_LEN_HINT) from None
                raise
            B = len(lengths)
            causal = _causal(L)
            padding = _keep(lengths, L)[:, None, None, :]
            expected = causal & padding
            if isinstance(mask, Tensor) and tuple(mask.shape) == (B, L, L):
                raise fail(f"the mask has shape {(B, L, L)}, expected {(B, 1, L, L)}",
                           "Keep an axis of size 1 for the heads, so that it broadcasts against (B, H, L, L).")
            if isinstance(mask, Tensor) and beyond and max(lengths) in tuple(mask.shape)[-2:]:
                raise fail(f"the mask for lengths={lengths}, seq_len={L} has shape {tuple(mask.shape)}, expected "
                           f"{(B, 1, L, L)}: seq_len was ignored", SEQ_LEN_HINT)
            mask = expect_tensor(mask, "the mask", (B, 1, L, L), dtype="bool").cpu()
            if not torch.equal(mask, expected):
                for name, wrong, hint in [
                    ("only the causal part", causal.expand(B, 1, L, L), "Combine both masks with &: causal & padding."),
                    ("only the padding part", padding.expand(B, 1, L, L), "Combine both masks with &: causal & padding."),
                    ("the two masks combined with | (or)", causal | padding,
                     "A key is allowed only if both masks allow it: use & (and), not | (or)."),
                    ("the inverted mask", ~expected, "True means *may attend*."),
                ]:
                    if torch.equal(mask, wrong):
                        raise fail(f"wrong mask for lengths={lengths}: it is {name}", hint)
                raise fail(f"wrong mask for lengths={lengths}, seq_len={L}",
                           "Query i may attend to key j when j <= i and j < length.")
        return f"correct on {len(cases)} batches (one padded beyond its longest sequence)"

    return run_check("causal and padding mask", body)


# ------------------------------------------------------------------ exercise 4.4: left padding, no empty row

LEFT_HINT = ("With padding at the start, sequence b's real tokens are the last lengths[b] positions: key j is real "
             "when j >= seq_len - lengths[b]. A real query i may see key j when j <= i and j is real.")
EMPTY_ROW_HINT = ("A leading padding query has no real key at or before it, so causal & padding leaves its row all "
                  "False, and textbook attention (masked_fill(-inf), softmax) gives it NaN, which W_o and the next "
                  "layer spread. Its output is thrown away anyway: let it see something, e.g. itself "
                  "(mask | torch.eye(seq_len, dtype=torch.bool)); real queries must stay as they were.")


def _left_keep(lengths: list[int], L: int) -> Tensor:
    return torch.arange(L)[None, :] >= L - torch.tensor(lengths)[:, None]  # (B, L)


def check_left_padded_causal_mask(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(lengths, seq_len) -> mask``: bool ``(B, 1, L, L)`` for a batch padded at the start. A real
    query i of sequence b (``i >= L - lengths[b]``) may attend to key j exactly when ``j <= i`` and j is real;
    every padding query's row allows at least one key (which ones is the learner's choice: their outputs are
    thrown away), so that no row is fully masked. The mask is on ``lengths``' device (the CPU for a list)."""

    def body() -> str:
        cases = [([3, 5, 1], 5), ([2, 4], 6), ([4, 0, 2], 4), ([1, 3], 3)]
        for n, (lengths, L) in enumerate(cases):
            B = len(lengths)
            arg: Any = torch.tensor(lengths) if n == len(cases) - 1 else list(lengths)
            what = f"lengths={lengths}{' (a tensor)' if isinstance(arg, Tensor) else ''}, seq_len={L}"
            mask = call(fn, arg, L, what=f"your function ({what})")
            if isinstance(mask, Tensor) and tuple(mask.shape) == (B, L, L):
                raise fail(f"the mask for {what} has shape {(B, L, L)}, expected {(B, 1, L, L)}",
                           "Keep an axis of size 1 for the heads, so that it broadcasts against (B, H, L, L).")
            mask = expect_tensor(mask, f"the mask for {what}", (B, 1, L, L), dtype="bool").cpu()[:, 0]
            keep = _left_keep(lengths, L)  # (B, L)
            real_q = keep[:, :, None].expand(B, L, L)  # the rows that are checked entry by entry
            expected = _causal(L) & keep[:, None, :]
            if not torch.equal(mask[real_q], expected[real_q]):
                right_keep = _keep(lengths, L)
                candidates = [
                    ("padding at the end (right padding): the real tokens were taken to be the first ones",
                     _causal(L) & right_keep[:, None, :], LEFT_HINT),
                    ("the padding keys are not blocked (only the causal mask, or the padding mask on the queries' axis)",
                     _causal(L).expand(B, L, L), "Block the padding *keys*: & keep[:, None, None, :] on the last axis."),
                    ("the future is visible: the causal part is missing", keep[:, None, :].expand(B, L, L),
                     "Combine both: a real query i may see key j when j <= i (torch.tril) and j is real."),
                    ("the padding part is inverted: the real keys are blocked and the padding allowed",
                     _causal(L) & ~keep[:, None, :], "True means *may attend*: True for the real keys."),
                    ("off by one: the first real token is blocked",
                     _causal(L) & (torch.arange(L)[None, :] > L - torch.tensor(lengths)[:, None])[:, None, :], LEFT_HINT),
                    ("off by one: the last padding position is allowed",
                     _causal(L) & (torch.arange(L)[None, :] >= L - 1 - torch.tensor(lengths)[:, None])[:, None, :],
                     LEFT_HINT),
                    ("the causal triangle flipped: queries see later keys", _causal(L).T & keep[:, None, :],
                     "Rows are queries, columns keys: query i sees keys j <= i, the lower triangle."),
                ]
                eye = torch.eye(L, dtype=torch.bool)
                for name, wrong, hint in candidates:
                    if torch.equal(mask[real_q], wrong[real_q]) or torch.equal(mask[real_q], (wrong | eye)[real_q]):
                        raise fail(f"wrong mask for {what}: {name}", hint)
                bad = (mask != expected) & real_q
                rows = sorted({(b, i) for b, i in bad.any(-1).nonzero().tolist()})
                shown = ", ".join(f"sequence {b} query {i}" for b, i in rows[:4]) + (", ..." if len(rows) > 4 else "")
                raise fail(f"wrong mask for {what}: the rows of real queries differ ({shown})", LEFT_HINT)
            empty = (~mask).all(-1) & ~keep  # padding queries with nothing to look at
            if empty.any():
                b, i = empty.nonzero()[0].tolist()
                raise fail(f"the mask for {what} leaves {int(empty.sum())} padding "
                           f"quer{'ies' if int(empty.sum()) > 1 else 'y'} with no key at all (sequence {b}, query {i}"
                           f"{', ...' if int(empty.sum()) > 1 else ''}): the real rows are right, but attention there "
                           "is 0/0", EMPTY_ROW_HINT)
        device_hint = ("Make the mask on lengths' device: torch.arange(seq_len, device=lengths.device) "
                       "(torch.as_tensor(lengths) keeps a tensor where it is).")
        check_device_care(fn, on_meta(torch.tensor([2, 4])), 5, what="your function (lengths a tensor)",
                          hint=device_hint)
        try:
            elsewhere = fn(on_meta(torch.tensor([2, 4])), 5)
        except Exception:  # noqa: BLE001 - the meta device can't do everything (.tolist()); the CPU run was right
            elsewhere = None
        if isinstance(elsewhere, Tensor) and elsewhere.device.type != "meta":
            raise fail(f"for lengths on device 'meta' (a stand-in for a GPU) the mask comes back on "
                       f"'{elsewhere.device.type}'", device_hint)
        return (f"correct on {len(cases)} batches (padded beyond the longest sequence, an empty sequence, lengths as "
                "a tensor; no row left empty), and with lengths on another device")

    return run_check("left-padded causal mask", body)
