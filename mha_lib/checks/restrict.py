"""Checks for chapter 12: restrict head 0 to the first half of the sequence, head 1 to the second."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..multi_head import MultiHeadAttention
from ._circuits import call_leaving_model_alone
from ._core import (
    ERROR,
    CheckResult,
    Verdict,
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
    where_differs,
)
from .reference import linear, multi_head, projections

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
        for number, L in enumerate(lengths):
            mask = call(fn, L, what=f"your function (seq_len={L})")
            if isinstance(mask, Tensor) and mask.dim() == 3 and mask.size(0) == 2 and mask.size(1) == mask.size(2) \
                    and mask.size(1) != L:
                n = mask.size(1)
                if n in lengths[:number]:
                    raise fail(f"the mask for seq_len={L} has shape {tuple(mask.shape)}, the shape of an earlier call's "
                               f"(seq_len={n}): it looks like a result kept from an earlier call",
                               "Keep nothing from one call to the next (no cache, no global variable): build the mask "
                               "for this call's seq_len, every time.")
                raise fail(f"the mask for seq_len={L} has shape {tuple(mask.shape)}, a mask for seq_len={n}: it looks "
                           "like a length typed in, not the argument seq_len",
                           "Build every size from the argument: torch.arange(seq_len), (2, seq_len, seq_len).")
            if isinstance(mask, Tensor) and tuple(mask.shape) == (L, L):
                raise fail(f"the mask for seq_len={L} has shape {(L, L)}, expected {(2, L, L)}",
                           "One (L, L) mask per head, stacked: shape (2, L, L), head first.")
            if isinstance(mask, Tensor) and tuple(mask.shape) == (L, L, 2) and L != 2:
                raise fail(f"the mask for seq_len={L} has shape {(L, L, 2)}, expected {(2, L, L)}: the head axis comes "
                           "last", "Put the heads first, (2, L, L): torch.stack([...]) on dim 0 (the default), or "
                                   ".permute(2, 0, 1).")
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
                ("a causal mask was combined with the halves (keys after the query are blocked too)",
                 halves(L) & torch.ones(L, L, dtype=torch.bool).tril(),
                 "The halves mask restricts the keys by half only, for every query: no causal mask (a model that "
                 "needs one combines it later, mask & causal)."),
                ("both heads have the same mask", halves(L)[[0, 0]], "Head 1 (mask[1]) gets the other half, keys "
                 "[L//2, L): stack the first half's keys and their complement, torch.stack([first, ~first])."),
                ("both heads have the same mask", halves(L)[[1, 1]], "Head 0 (mask[0]) gets the first half, keys "
                 "[0, L//2): stack the first half's keys and their complement, torch.stack([first, ~first])."),
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
            for k in range(L + 1):
                if torch.equal(mask, halves(L, k)):
                    raise fail(f"wrong mask for seq_len={L}: the halves are split at key {k}, not at L//2 = {h}",
                               "Split at seq_len // 2, read from the argument (no length typed in). " + DEFINITION)
            raise fail(f"wrong mask for seq_len={L}: {_first_wrong(mask, expected)}", DEFINITION)
        return "correct for seq_len = " + ", ".join(map(str, lengths)) + " (odd lengths included)"

    return run_check("halves mask", body)


def _causal(L: int) -> Tensor:
    return torch.ones(L, L, dtype=torch.bool).tril()


def _heads_concat(w: Any, x: Tensor, mask: Tensor, H: int) -> Tensor:
    """The heads' outputs before ``W_o``, concatenated ``(B, L, D)``, head ``h`` in features ``[h·d_k, (h+1)·d_k)``."""
    return multi_head(w, x, x, x, mask, H, out_proj=False)[0]


def _where_heads_differ(weights: Any, expected_w: Tensor) -> str:
    """``"; head 1's weights differ at queries 0, 1"``: which head and queries, when the weights tell it."""
    if not isinstance(weights, Tensor) or weights.shape != expected_w.shape:
        return ""
    parts = []
    for h in range(expected_w.size(1)):
        where = where_differs(weights[:, h].detach(), expected_w[:, h], dim=-2, axis="query")
        if where:
            parts.append(f"head {h}: {where}")
    return ("; in the weights you returned, " + "; ".join(parts)) if parts else \
        "; the weights you returned are right, so it is what happens after them (the values, W_o) that differs"


def check_restricted_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(mha, x) -> (output, weights)``: self-attention of ``x (B, L, d_model)``
    through a 2-head ``mha_lib.MultiHeadAttention`` in which head 0 may attend only to the
    first half of the sequence and head 1 only to the second half; output ``(B, L, d_model)``,
    weights ``(B, 2, L, L)``. The module is handed over in training mode with gradients on and a hook
    of its own, its weights change between calls, and it must come back as it was."""

    def body() -> str:
        g = gen(31)
        D, H = 8, 2
        torch.manual_seed(31)
        mha = MultiHeadAttention(D, H).double().train()
        witness = mha.register_forward_pre_hook(lambda module, args: None)  # a hook of its own
        cases = [randn(g, 2, 4, D), randn(g, 3, 7, D), randn(g, 2, 6, D)]  # B=2 = H on purpose
        try:
            for number, x in enumerate(cases):
                w = projections(mha, g)  # new weights before every call: nothing may be kept from the last one
                if number == 2:
                    mha.eval()  # and once in evaluation mode: the mode must come back as it was, whichever
                B, L, _ = x.shape
                (arg,) = cloned(x)
                label = f"x {tuple(x.shape)}, the module in {'training' if mha.training else 'evaluation'} mode"
                try:
                    result = call_leaving_model_alone(fn, mha, arg, what=f"your function ({label})")
                except Verdict as verdict:
                    if number and verdict.status == ERROR and "in mha_lib" in verdict.message:
                        before = cases[number - 1].size(1)
                        raise Verdict(ERROR, f"{verdict.message} (the call before, with L = {before}, passed)",
                                      f"{verdict.hint} A mask that fits one length and not the next: is it kept from "
                                      "an earlier call, or built for a length typed in? Build it from x.size(1), "
                                      "every call.") from None
                    raise
                check_unchanged(["x"], [x], [arg], "your function")
                _judge(result, w, x, H, D, B, L, label)
        finally:
            witness.remove()
        check_device_care(fn, on_meta(mha), on_meta(randn(gen(32), 2, 4, D)), what="your function",
                          hint="Put the mask on the input's device: halves_mask(L).to(x.device). On a GPU, a mask "
                               "left on the CPU is refused the same way.")
        return (f"correct on {len(cases)} inputs (even and odd lengths, new weights each time, training and "
                "evaluation mode), and on another device; the module is left as it was")

    return run_check("restricted multi-head attention", body)


def _judge(result: Any, w: Any, x: Tensor, H: int, D: int, B: int, L: int, label: str) -> None:
    if isinstance(result, Tensor):
        raise fail(f"your function returned only the output {tuple(result.shape)}; the exercise says "
                   "Return (output, weights)",
                   "Ask the module for its weights too: mha(x, x, x, mask=..., return_weights=True) "
                   "returns (output, weights).")
    out, weights = unpack_pair(result, "your function", "output", "weights")
    if isinstance(out, Tensor) and isinstance(weights, Tensor) and tuple(out.shape) == (B, H, L, L) \
            and tuple(weights.shape) == (B, L, D):
        raise fail(f"your function returned (weights, output) for {label}: the pair is swapped",
                   "Return them in the order the module gives them: output, weights = mha(x, x, x, mask=..., "
                   "return_weights=True); return output, weights.")
    if weights is None:
        raise fail("your function returned (output, None); the exercise says Return (output, weights)",
                   "mha(x, x, x, mask=..., return_weights=True) returns (output, weights).")
    out = expect_tensor(out, f"the output for {label}", (B, L, D), explain=" (B, L, d_model)")
    expected, expected_w = multi_head(w, x, x, x, halves(L), H)
    if not close(out, expected):
        d_k = D // H
        concat = _heads_concat(w, x, halves(L), H)
        swapped_concat = torch.cat([concat[..., d_k:], concat[..., :d_k]], dim=-1)
        causal = halves(L) & _causal(L)
        verdict = diagnose(out, [
            ("unrestricted attention (no mask)", lambda: multi_head(w, x, x, x, None, H)[0],
             "Pass the per-head mask: mha(x, x, x, mask=halves_mask(L))."),
            (SWAPPED_OR_INVERTED, lambda: multi_head(w, x, x, x, halves(L)[[1, 0]], H)[0],
             SWAPPED_OR_INVERTED_HINT),
            ("W_o is missing: the output is the heads' outputs concatenated, before the output projection",
             lambda: concat,
             "Run the whole module, mha(x, x, x, mask=..., return_weights=True): its forward ends with W_o. "
             "Attending by hand with the heads' weights and stopping at the concatenation leaves W_o out."),
            ("the two heads' outputs were swapped before W_o (head 1's output in head 0's features)",
             lambda: linear(w["W_o"], swapped_concat),
             "Keep each head's output in its own features, head h in [h·d_k, (h+1)·d_k): the module does that; "
             "let it, with the (2, L, L) mask, instead of rearranging the heads."),
            ("a causal mask was added to the halves (each head also misses the keys after the query)",
             lambda: [multi_head(w, x, x, x, causal, H)[0],
                      multi_head(w, x, x, x, causal, H, safe=False)[0].nan_to_num(0.0)],
             "The exercise restricts the keys to each head's half only, for every query, without a causal mask: "
             "mask = halves_mask(L), nothing combined with it."),
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
            ("the scores were not scaled by 1/sqrt(d_k)",
             lambda: [multi_head(w, x, x, x, halves(L), H, scale="none")[0],
                      multi_head(w, x, x, x, halves(L), H, scale="d_k")[0]],
             "Divide the scores by sqrt(d_k) before the softmax, or let the module attend: mha(x, x, x, mask=...)."),
            ("the halves were split at another key than L // 2 (a length other than x.size(1)?)",
             lambda: [multi_head(w, x, x, x, halves(L, k), H)[0] for k in range(L + 1) if k != L // 2],
             "Build the mask for this input's length, halves_mask(x.size(1)): head 0 gets keys [0, L//2)."),
            ("the mask was applied per sequence instead of per head",
             lambda: multi_head(w, x, x, x, halves(L)[:, None], H)[0],
             "A (2, 1, L, L) mask lines up with the batch axis. A per-head mask is (H, L, L) "
             "(or (1, H, L, L)): it broadcasts over the batch."),
        ], f"wrong output for {label}",
            "Self-attention through the given module, with a (2, L, L) mask: " + DEFINITION,
            expected=expected, axis="position")
        if "it looks like" not in verdict.message:
            verdict.message += _where_heads_differ(weights, expected_w)
        raise verdict
    if isinstance(weights, Tensor) and tuple(weights.shape) == (B, L, L) and close(weights.detach(),
                                                                                   expected_w.mean(1)):
        raise fail(f"the weights for {label} are averaged over the heads, shape {(B, L, L)}",
                   "Return each head's weights, (B, 2, L, L), as the module gives them with return_weights=True.")
    weights = expect_tensor(weights, f"the weights for {label}", (B, H, L, L), explain=" (B, 2, L, L)")
    if not close(weights, expected_w):
        if close(weights, expected_w[:, [1, 0]]):
            raise fail(f"the output is right but the weights for {label} have the two heads swapped (head 0's "
                       "map at index 1)", "Return the weights as the module gives them, head h at weights[:, h]: "
                       "mha(x, x, x, mask=..., return_weights=True).")
        raise fail(f"the output is right but the weights for {label} are not the ones it was "
                   "computed with" + _where_heads_differ(weights, expected_w),
                   "Return the weights of the same call that gave the output: "
                   "mha(x, x, x, mask=..., return_weights=True).")
