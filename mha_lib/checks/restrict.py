"""Checks for chapter 12: restrict head 0 to the first half of the sequence, head 1 to the second."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..multi_head import MultiHeadAttention
from ._core import (
    CheckResult,
    call,
    check_device_care,
    check_unchanged,
    cloned,
    close,
    diagnose,
    expect_tensor,
    fail,
    gen,
    on_meta,
    randn,
    run_check,
    unpack_pair,
)
from .reference import multi_head, projections

DEFINITION = ("For every query, head 0 may attend to the keys at positions [0, L//2) and head 1 to "
              "[L//2, L): mask[0, :, :L//2] = True and mask[1, :, L//2:] = True.")


def halves(L: int, split: int | None = None) -> Tensor:
    """The reference mask ``(2, L, L)``: head 0 sees keys ``[0, split)``, head 1 ``[split, L)``."""
    split = L // 2 if split is None else split
    first = torch.arange(L) < split  # (Lk,)
    return torch.stack([first, ~first])[:, None, :].expand(2, L, L)  # (2, Lq, Lk)


SWAPPED_OR_INVERTED = ("head 0 sees the second half and head 1 the first: the heads are swapped, or the mask is "
                       "inverted (the two are the same mask)")
SWAPPED_OR_INVERTED_HINT = ("True means *may attend*, and head 0 (mask[0]) gets the first half, keys [0, L//2); "
                            "head 1 the rest.")


def _first_wrong(mask: Tensor, expected: Tensor) -> str:
    """``"head 0, query 2 may attend to keys 0, 1, 2, expected keys 0, 1"``: the first row that differs."""
    wrong = (mask != expected).any(-1).nonzero().tolist()
    if not wrong:
        return ""
    h, i = wrong[0]

    def keys(row: Tensor) -> str:
        found = row.nonzero().flatten().tolist()
        return "no key" if not found else "key" + ("s " if len(found) > 1 else " ") + ", ".join(map(str, found))

    more = f" ({len(wrong)} rows differ)" if len(wrong) > 1 else ""
    return f"head {h}, query {i} may attend to {keys(mask[h, i])}, expected {keys(expected[h, i])}{more}"


def check_halves_mask(fn: Callable[[int], Any]) -> CheckResult:
    """Check ``fn(seq_len) -> mask``: bool ``(2, L, L)``, True = may attend; head 0 may attend
    to keys ``[0, L//2)`` and head 1 to keys ``[L//2, L)``, for every query."""

    def body() -> str:
        lengths = [4, 8, 5, 7, 2]
        for L in lengths:
            mask = call(fn, L, what=f"your function (seq_len={L})")
            if isinstance(mask, Tensor) and tuple(mask.shape) == (L, L):
                raise fail(f"the mask for seq_len={L} has shape {(L, L)}, expected {(2, L, L)}",
                           "One (L, L) mask per head, stacked: shape (2, L, L), head first.")
            if isinstance(mask, Tensor) and tuple(mask.shape) == (2, L) and L != 2:
                raise fail(f"the mask for seq_len={L} has shape {(2, L)}, expected {(2, L, L)}",
                           "Give every query its row: expand to (2, L, L), e.g. keys[:, None, :].expand(2, L, L).")
            mask = expect_tensor(mask, f"the mask for seq_len={L}", (2, L, L), dtype="bool").cpu()
            expected = halves(L)
            if torch.equal(mask, expected):
                continue
            h = L // 2
            mistakes = [
                (SWAPPED_OR_INVERTED, halves(L)[[1, 0]], SWAPPED_OR_INVERTED_HINT),
                ("the queries are restricted instead of the keys", halves(L).transpose(-2, -1),
                 "Restrict the keys (the last axis, columns): every query of head 0 may look at the first half "
                 "of the sequence. mask[0, :, :L//2] = True, not mask[0, :L//2, :]."),
                ("the queries are restricted instead of the keys, and the mask is inverted",
                 ~halves(L).transpose(-2, -1), "True means *may attend*; restrict the keys (the last axis)."),
                ("both the queries and the keys are restricted (each head sees a block on the diagonal)",
                 halves(L) & halves(L).transpose(-2, -1),
                 "Restrict only the keys: every query, in either half, may attend to its head's half of the keys."),
                ("the boundary is off by one (the middle key goes to head 0)", halves(L, h + 1),
                 f"Positions 0 .. L//2 - 1 belong to head 0: for L={L} that is keys 0 .. {h - 1}. " + DEFINITION),
                ("the boundary is off by one (head 0 misses its last key)", halves(L, h - 1),
                 f"Head 0's keys are [0, L//2): for L={L} that is keys 0 .. {h - 1}. " + DEFINITION),
            ]
            if L % 2:
                mistakes.insert(0, (f"odd lengths are split at (L+1)//2 = {(L + 1) // 2} instead of L//2 = {h}",
                                    halves(L, (L + 1) // 2),
                                    "With odd L the halves can't be equal: the course gives the middle key to head 1, "
                                    "splitting at L//2 (floor division)."))
            for name, wrong, hint in mistakes:
                if torch.equal(mask, wrong):
                    raise fail(f"wrong mask for seq_len={L}: {name}", hint)
            raise fail(f"wrong mask for seq_len={L}: {_first_wrong(mask, expected)}", DEFINITION)
        return "correct for seq_len = " + ", ".join(map(str, lengths)) + " (odd lengths included)"

    return run_check("halves mask", body)


def check_restricted_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(mha, x) -> (output, weights)``: self-attention of ``x (B, L, d_model)``
    through a 2-head ``mha_lib.MultiHeadAttention`` in which head 0 may attend only to the
    first half of the sequence and head 1 only to the second half; output ``(B, L, d_model)``,
    weights ``(B, 2, L, L)``."""

    def body() -> str:
        g = gen(31)
        D, H = 8, 2
        mha = MultiHeadAttention(D, H).double().eval()
        w = projections(mha, g)
        cases = [randn(g, 2, 4, D), randn(g, 3, 7, D), randn(g, 2, 6, D)]  # B=2 = H on purpose
        for x in cases:
            B, L, _ = x.shape
            (arg,) = cloned(x)
            with torch.no_grad():
                result = call(fn, mha, arg, what=f"your function (x {tuple(x.shape)})")
            check_unchanged(["x"], [x], [arg], "your function")
            if isinstance(result, Tensor):
                raise fail(f"your function returned only the output {tuple(result.shape)}; the exercise says "
                           "Return (output, weights)",
                           "Ask the module for its weights too: mha(x, x, x, mask=..., return_weights=True) "
                           "returns (output, weights).")
            out, weights = unpack_pair(result, "your function", "output", "weights")
            if weights is None:
                raise fail("your function returned (output, None); the exercise says Return (output, weights)",
                           "mha(x, x, x, mask=..., return_weights=True) returns (output, weights).")
            out = expect_tensor(out, f"the output for x {tuple(x.shape)}", (B, L, D), explain=" (B, L, d_model)")
            expected, expected_w = multi_head(w, x, x, x, halves(L), H)
            if not close(out, expected):
                raise diagnose(out, [
                    ("unrestricted attention (no mask)", lambda: multi_head(w, x, x, x, None, H)[0],
                     "Pass the per-head mask: mha(x, x, x, mask=halves_mask(L))."),
                    (SWAPPED_OR_INVERTED, lambda: multi_head(w, x, x, x, halves(L)[[1, 0]], H)[0],
                     SWAPPED_OR_INVERTED_HINT),
                    ("the mask was applied after the softmax (weights zeroed without renormalising)",
                     lambda: multi_head(w, x, x, x, halves(L), H, mask_mode="after")[0],
                     "Block the keys before the softmax (with -inf, or pass the bool mask to the module), so that "
                     "each head's weights still sum to 1 over its half."),
                    ("both the queries and the keys were restricted",
                     lambda: multi_head(w, x, x, x, halves(L) & halves(L).transpose(-2, -1), H)[0],
                     "Restrict only the keys (the last axis of the mask), for every query."),
                    ("the queries were restricted instead of the keys",
                     lambda: multi_head(w, x, x, x, halves(L).transpose(-2, -1), H)[0],
                     "Restrict the keys (the last axis of the mask), for every query."),
                    ("the mask was applied per sequence instead of per head",
                     lambda: multi_head(w, x, x, x, halves(L)[:, None], H)[0],
                     "A (2, 1, L, L) mask lines up with the batch axis. A per-head mask is (H, L, L) "
                     "(or (1, H, L, L)): it broadcasts over the batch."),
                ], f"wrong output for x {tuple(x.shape)}",
                    "Self-attention through the given module, with a (2, L, L) mask: " + DEFINITION,
                    expected=expected, axis="position")
            if isinstance(weights, Tensor) and tuple(weights.shape) == (B, L, L) and close(weights.detach(),
                                                                                           expected_w.mean(1)):
                raise fail(f"the weights for x {tuple(x.shape)} are averaged over the heads, shape {(B, L, L)}",
                           "Return each head's weights, (B, 2, L, L), as the module gives them with return_weights=True.")
            weights = expect_tensor(weights, f"the weights for x {tuple(x.shape)}", (B, H, L, L),
                                    explain=" (B, 2, L, L)")
            if not close(weights, expected_w):
                raise fail(f"the output is right but the weights for x {tuple(x.shape)} are not the ones it was "
                           "computed with",
                           "Return the weights of the same call that gave the output: "
                           "mha(x, x, x, mask=..., return_weights=True).")
        check_device_care(fn, on_meta(mha), on_meta(randn(gen(32), 2, 4, D)), what="your function",
                          hint="Put the mask on the input's device: halves_mask(L).to(x.device). On a GPU, a mask "
                               "left on the CPU is refused the same way.")
        return f"correct on {len(cases)} inputs (even and odd lengths), and on another device"

    return run_check("restricted multi-head attention", body)
