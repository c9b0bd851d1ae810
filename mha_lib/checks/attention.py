"""Checks for chapters 01 and 04: scores, attention, masks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import attention as _attention
from .. import masks as _masks
from ._core import (
    CheckResult,
    Mistake,
    call,
    check_unchanged,
    cloned,
    close,
    describe_error,
    describe_shapes,
    diagnose,
    expect_tensor,
    fail,
    gen,
    randn,
    run_check,
    sqrt,
    unpack_pair,
)

SCALE_HINT = "Divide the scores by math.sqrt(d_k), where d_k = query.size(-1), before the softmax."


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: float | None = None,
            softmax_dim: int = -1, mask_mode: str = "before", fill: float = float("-inf"),
            values: str = "value", safe: bool = True) -> tuple[Tensor, Tensor]:
    """Attention with the knobs that common mistakes turn; the defaults are right."""
    scale = sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1) / scale
    if mask is not None and mask_mode == "before":
        scores = scores.masked_fill(~mask, fill)
    elif mask is not None and mask_mode == "inverted":
        scores = scores.masked_fill(mask, fill)
    blocked = torch.isneginf(scores).all(dim=-1, keepdim=True) if safe else torch.zeros_like(scores[..., :1], dtype=torch.bool)
    weights = torch.softmax(scores.masked_fill(blocked, 0.0), dim=softmax_dim).masked_fill(blocked, 0.0)
    if mask is not None and mask_mode == "after":
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ (v if values == "value" else k), weights


def flavours(compute: Callable[..., tuple[Tensor, Tensor]], index: int) -> Callable[[], list[Tensor]]:
    """What a mistake gives with each way of blocking: NaN-free, naive ``-inf`` (NaN for a
    fully blocked row) and ``-1e9`` (a uniform row)."""
    return lambda: [compute()[index], compute(safe=False)[index], compute(fill=-1e9, safe=False)[index]]


def _weight_mistakes(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> list[Mistake]:
    d_k, d_v, Lk = q.size(-1), v.size(-1), k.size(-2)

    def weights(m: Tensor | None = mask, **kw: Any) -> Callable[[], list[Tensor]]:
        return flavours(lambda **more: _attend(q, k, v, m, **kw, **more), 1)

    mistakes = [
        ("the scores were not scaled", weights(scale=1.0), SCALE_HINT),
        ("the scores were divided by d_k instead of √d_k", weights(scale=d_k),
         "Divide by the square root: math.sqrt(d_k), not d_k."),
        ("the scores were multiplied by √d_k instead of divided", weights(scale=1 / sqrt(d_k)), SCALE_HINT),
        ("the scores were scaled by √d_v (the values' size)", weights(scale=sqrt(d_v)),
         "Scale by the size of the vectors in the dot product, d_k = query.size(-1), not value.size(-1)."),
        ("the scores were scaled by √Lk (the number of keys)", weights(scale=sqrt(Lk)),
         "Scale by the feature size d_k = query.size(-1) (the last axis), not by a sequence length."),
        ("the softmax ran over the queries (dim=-2)", weights(softmax_dim=-2),
         "Each query's weights are a distribution over the keys: softmax(scores, dim=-1), so each row sums to 1."),
    ]
    if mask is not None:
        mistakes += [
            ("the mask is inverted (it blocks the keys that may be attended)", weights(mask_mode="inverted"),
             "True means *may attend*: block where the mask is False, with masked_fill(~mask, float('-inf'))."),
            ("the mask was applied after the softmax", weights(mask_mode="after"),
             "Mask the scores before the softmax (with -inf), so the remaining weights still sum to 1."),
            ("the mask was ignored", weights(m=None),
             "Apply the mask to the scores: scores.masked_fill(~mask, float('-inf')) when mask is not None."),
        ]
    return mistakes


def _attention_cases(fully_masked: bool) -> list[dict[str, Any]]:
    g = gen(1)
    B, H, Lq, Lk, d_k, d_v = 2, 3, 4, 6, 8, 5
    cases = [dict(q=randn(g, B, H, Lq, d_k), k=randn(g, B, H, Lk, d_k), v=randn(g, B, H, Lk, d_v), mask=None,
                  label="no mask")]
    for label, mask in [
        ("a causal-style mask (Lq, Lk)", torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)),
        ("a padding mask (B, 1, 1, Lk)", _masks.padding_mask([6, 3], max_len=Lk)),
    ]:
        cases.append(dict(q=randn(g, B, H, Lq, d_k), k=randn(g, B, H, Lk, d_k), v=randn(g, B, H, Lk, d_v),
                          mask=mask, label=label))
    random_mask = torch.rand(3, 5, 5, generator=g) > 0.5
    random_mask |= torch.eye(5, dtype=torch.bool)
    cases.append(dict(q=randn(g, 3, 5, 4), k=randn(g, 3, 5, 4), v=randn(g, 3, 5, 4), mask=random_mask,
                      label="3-D inputs and a random mask (B, L, L)"))
    if fully_masked:
        mask = torch.ones(B, 1, Lq, Lk, dtype=torch.bool)
        mask[0, 0, 1] = False  # query 1 of sequence 0 may attend to nothing
        mask[1, 0, 3] = False
        cases.append(dict(q=randn(g, B, H, Lq, d_k), k=randn(g, B, H, Lk, d_k), v=randn(g, B, H, Lk, d_v),
                          mask=mask, label="a mask that blocks every key of some queries"))
    return cases


def _check_attention(fn: Callable[..., Any], name: str, fully_masked: bool) -> CheckResult:
    def body() -> str:
        cases = _attention_cases(fully_masked)
        for case in cases:
            q, k, v, mask = case["q"], case["k"], case["v"], case["mask"]
            where = f"with {describe_shapes(query=q, key=k, value=v)} and {case['label']}"
            args = cloned(q, k, v)
            kwargs = {} if mask is None else {"mask": mask.clone()}
            result = call(fn, *args, **kwargs, what="your function",
                          forbidden=[_attention.scaled_dot_product_attention])
            check_unchanged(["query", "key", "value", "mask"], [q, k, v, mask], [*args, kwargs.get("mask")],
                            "your function")
            output, weights = unpack_pair(result, "your function", "output", "weights")
            expected_out, expected_w = _attend(q, k, v, mask)

            if isinstance(output, Tensor) and output.shape == expected_w.shape != expected_out.shape:
                raise fail(f"the output has the weights' shape {tuple(output.shape)} {where}",
                           "The values were never multiplied in: output = weights @ value, shape (..., Lq, d_v).")
            if isinstance(output, Tensor) and output.shape != expected_out.shape and close(output, expected_w @ k):
                raise fail(f"the output has shape {tuple(output.shape)}, expected {tuple(expected_out.shape)} {where}: "
                           "it looks like the weights were multiplied with the keys",
                           "The output blends the values: output = weights @ value.")
            output = expect_tensor(output, "the output", expected_out.shape, explain=" (..., Lq, d_v)")
            weights = expect_tensor(weights, "the weights", expected_w.shape, explain=" (..., Lq, Lk)")

            if not close(weights, expected_w):
                mistakes = _weight_mistakes(q, k, v, mask)
                if fully_masked and mask is not None:
                    mistakes.append((
                        "-1e9 was used: a fully blocked query attends uniformly to the blocked keys",
                        lambda: _attend(q, k, v, mask, fill=-1e9, safe=False)[1],
                        "Find the queries with no allowed key (~mask).all(-1) and set their weights to zero."))
                raise diagnose(weights, mistakes, f"the weights are wrong {where}",
                               "Compare your weights with softmax(query @ key.transpose(-2, -1) / math.sqrt(d_k)) "
                               "on a small example; each row must sum to 1 over the allowed keys.")
            if not close(output, expected_out):
                raise diagnose(output, [
                    ("the weights were multiplied with the keys, not the values",
                     lambda: _attend(q, k, v, mask, values="key")[0],
                     "The output blends the values: output = weights @ value."),
                ], f"the weights are right but the output is wrong {where}",
                    "The output is the weighted sum of the values: output = weights @ value.")
        if fully_masked:
            _check_finite_gradients(fn, cases[-1])
            return f"correct on {len(cases)} cases, gradients finite (batch and head axes, Lq ≠ Lk, d_v ≠ d_k, masks)"
        return f"correct on {len(cases)} cases (batch and head axes, Lq ≠ Lk, d_v ≠ d_k, masks)"

    return run_check(name, body)


def _check_finite_gradients(fn: Callable[..., Any], case: dict[str, Any]) -> None:
    """Backpropagate through the learner's attention on a case with fully masked rows."""
    q, k, v = (t.clone().requires_grad_(True) for t in (case["q"], case["k"], case["v"]))
    with torch.enable_grad():
        result = call(fn, q, k, v, mask=case["mask"].clone(), what="your function (with gradients on)")
        output, _ = unpack_pair(result, "your function", "output", "weights")
        if not isinstance(output, Tensor) or not output.requires_grad:
            raise fail("the output doesn't depend on query, key and value through autograd",
                       "Don't detach tensors or build the output from .item() / NumPy values.")
        try:
            output.sum().backward()
        except Exception as error:  # the learner's graph failed in the backward pass
            raise describe_error(error, "the backward pass through your function") from None
    bad = [name for name, t in (("query", q), ("key", k), ("value", v)) if t.grad is not None
           and not torch.isfinite(t.grad).all()]
    if bad:
        raise fail(f"the outputs are right, but the gradients of {', '.join(bad)} contain NaN",
                   "A softmax over a row of -inf is NaN even if you replace its output afterwards: the "
                   "backward pass still goes through 0/0. Give fully blocked rows finite scores before "
                   "the softmax, then zero their weights.")


def check_scaled_dot_product_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key, value, mask=None) -> (output, weights)``.

    query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, value ``(..., Lk, d_v)``; a bool
    mask broadcastable to ``(..., Lq, Lk)`` with True = may attend.
    """
    return _check_attention(fn, "scaled_dot_product_attention", fully_masked=False)


def check_masked_attention(fn: Callable[..., Any]) -> CheckResult:
    """Like :func:`check_scaled_dot_product_attention`, plus queries whose keys are all
    blocked: they must get zero weights and a zero output, not NaN."""
    return _check_attention(fn, "attention with fully masked rows", fully_masked=True)


def check_attention_scores(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key) -> scores``: query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``
    → scaled scores ``(..., Lq, Lk)``."""

    def body() -> str:
        g = gen(2)
        cases = [(randn(g, 4, 8), randn(g, 6, 8)), (randn(g, 2, 3, 5, 16), randn(g, 2, 3, 7, 16))]
        for q, k in cases:
            args = cloned(q, k)
            scores = call(fn, *args, what="your function")
            check_unchanged(["query", "key"], [q, k], args, "your function")
            expected = q @ k.transpose(-2, -1) / sqrt(q.size(-1))
            if isinstance(scores, Tensor) and scores.shape == expected.transpose(-2, -1).shape != expected.shape:
                raise fail(f"the scores have shape {tuple(scores.shape)}, expected {tuple(expected.shape)} (..., Lq, Lk)",
                           "Rows are queries and columns are keys: query @ key.transpose(-2, -1).")
            scores = expect_tensor(scores, "the scores", expected.shape, explain=" (..., Lq, Lk)")
            if not close(scores, expected):
                d_k = q.size(-1)
                raise diagnose(scores, [
                    ("the scores were not scaled", lambda: q @ k.transpose(-2, -1), SCALE_HINT),
                    ("the scores were divided by d_k instead of √d_k", lambda: q @ k.transpose(-2, -1) / d_k,
                     "Divide by the square root: math.sqrt(d_k), not d_k."),
                    ("the scores were multiplied by √d_k", lambda: q @ k.transpose(-2, -1) * sqrt(d_k), SCALE_HINT),
                    ("the scores were scaled by √Lk (the number of keys)",
                     lambda: q @ k.transpose(-2, -1) / sqrt(k.size(-2)),
                     "Scale by the feature size d_k = query.size(-1), not by a sequence length."),
                ], f"the scores are wrong for {describe_shapes(query=q, key=k)}",
                    "scores = query @ key.transpose(-2, -1) / math.sqrt(d_k).")
        return f"correct on {len(cases)} cases"

    return run_check("attention scores", body)


def _causal_mistakes(L: int) -> list[tuple[str, Callable[[], Tensor], str]]:
    ref = torch.ones(L, L, dtype=torch.bool).tril()
    return [
        ("the mask is inverted (True where attention is blocked)", lambda: ~ref,
         "Use True for *may attend*: query i may attend to keys 0..i, the lower triangle with the diagonal."),
        ("it hides each token from itself (the diagonal is False)", lambda: ref.tril(-1),
         "A token may attend to itself: keep the diagonal (torch.tril with diagonal=0)."),
        ("it lets tokens see the future instead of the past (upper triangle)", lambda: ref.T,
         "Rows are queries, columns are keys: query i may see keys j <= i, the lower triangle (torch.tril)."),
        ("it lets tokens see only the future, without themselves", lambda: ~ref.T,
         "Rows are queries, columns are keys: query i may see keys j <= i, the lower triangle (torch.tril)."),
        ("nothing is blocked", lambda: torch.ones(L, L, dtype=torch.bool),
         "Block the keys after each query: keep only the lower triangle, torch.tril."),
    ]


def check_causal_mask(fn: Callable[[int], Any]) -> CheckResult:
    """Check ``fn(seq_len) -> mask``: bool ``(L, L)``, True = may attend, query i sees keys 0..i."""

    def body() -> str:
        lengths = [4, 7, 1, 16]
        for L in lengths:
            mask = call(fn, L, what=f"your function (seq_len={L})", forbidden=[_masks.causal_mask])
            if isinstance(mask, Tensor) and mask.shape == (L, L) and mask.dtype != torch.bool:
                values = sorted({float(x) for x in mask.detach().flatten().tolist()})
                hint = ("Your mask holds 0s and 1s: convert it with .bool()" if set(values) <= {0.0, 1.0}
                        else "A float mask holds 0 and -inf; this exercise wants a boolean mask.")
                raise fail(f"the mask for seq_len={L} has dtype {mask.dtype}, expected torch.bool (True = may attend)", hint)
            mask = expect_tensor(mask, f"the mask for seq_len={L}", (L, L), dtype="bool")
            expected = torch.ones(L, L, dtype=torch.bool).tril()
            if not torch.equal(mask.cpu(), expected):
                mistakes = _causal_mistakes(L)
                for name, compute, hint in mistakes:
                    if torch.equal(mask.cpu(), compute()):
                        raise fail(f"wrong mask for seq_len={L}: {name}", hint)
                raise fail(f"wrong mask for seq_len={L}", "Query i (row) may attend to keys j <= i (columns): torch.tril.")
        return "correct for seq_len = " + ", ".join(map(str, lengths))

    return run_check("causal mask", body)


def check_padding_mask(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(lengths, max_len) -> mask``: bool ``(B, 1, 1, max_len)``, True for
    the real tokens (``j < lengths[b]``), False for the padding."""

    def body() -> str:
        cases = [([3, 1, 4], 4), ([2, 5], 6), ([1], 1)]
        for lengths, max_len in cases:
            mask = call(fn, list(lengths), max_len, what=f"your function (lengths={lengths}, max_len={max_len})",
                        forbidden=[_masks.padding_mask])
            B = len(lengths)
            expected = torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None]  # (B, Lk)
            if isinstance(mask, Tensor) and mask.shape == (B, max_len) != (B, 1, 1, max_len):
                raise fail(f"the mask has shape {tuple(mask.shape)}, expected {(B, 1, 1, max_len)}",
                           "Add axes for the heads and the queries, mask[:, None, None, :], so that it "
                           "broadcasts against scores (B, H, Lq, Lk).")
            mask = expect_tensor(mask, "the mask", (B, 1, 1, max_len), dtype="bool")
            got = mask[:, 0, 0].cpu()
            if not torch.equal(got, expected):
                if torch.equal(got, ~expected):
                    raise fail(f"the mask is inverted for lengths={lengths}",
                               "True means *may attend*: True for the real tokens, False for the padding.")
                if torch.equal(got, torch.arange(max_len)[None, :] <= torch.tensor(lengths)[:, None]):
                    raise fail(f"off by one for lengths={lengths}: the first padding position is still allowed",
                               "Positions 0 .. length-1 are real: use position < length, not <=.")
                raise fail(f"wrong mask for lengths={lengths}, max_len={max_len}",
                           "mask[b, 0, 0, j] is True exactly when j < lengths[b].")
        return f"correct on {len(cases)} batches"

    return run_check("padding mask", body)


def check_causal_padding_mask(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(lengths, seq_len) -> mask``: bool ``(B, 1, L, L)``; query i of sequence b
    may attend to key j when ``j <= i`` and ``j < lengths[b]``."""

    def body() -> str:
        cases = [([4, 2, 3], 4), ([5, 1], 5)]
        for lengths, L in cases:
            mask = call(fn, list(lengths), L, what=f"your function (lengths={lengths}, seq_len={L})")
            B = len(lengths)
            causal = torch.ones(L, L, dtype=torch.bool).tril()
            padding = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
            expected = causal & padding
            if isinstance(mask, Tensor) and tuple(mask.shape) == (B, L, L):
                raise fail(f"the mask has shape {(B, L, L)}, expected {(B, 1, L, L)}",
                           "Keep an axis of size 1 for the heads, so that it broadcasts against (B, H, L, L).")
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
        return f"correct on {len(cases)} batches"

    return run_check("causal and padding mask", body)
