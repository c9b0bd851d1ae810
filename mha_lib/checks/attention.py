"""Checks for chapters 01 and 04: the scores and scaled dot-product attention."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import attention as mha_attention
from .. import masks as mha_masks
from ._core import (
    CheckResult,
    Mistake,
    call,
    check_device_care,
    check_unchanged,
    cloned,
    close,
    describe_error,
    describe_shapes,
    diagnose,
    expect_tensor,
    fail,
    gen,
    on_meta,
    randn,
    run_check,
    sqrt,
    unpack_pair,
)
from .reference import attend, flavours

SCALE_HINT = "Divide the scores by math.sqrt(d_k), where d_k = query.size(-1), before the softmax."
NO_SQRT_HINT = "Divide by the square root: math.sqrt(d_k), not d_k."
INVERTED_HINT = "True means *may attend*: block where the mask is False, with masked_fill(~mask, float('-inf'))."
DETACH_HINT = (".detach(), .data and torch.no_grad() cut the computation out of autograd, so no gradient reaches "
               "the queries and keys and training can't learn them: compute the weights and the output with plain "
               "tensor operations.")


def weight_mistakes(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> list[Mistake]:
    """The common ways to get attention weights wrong, for the inputs of one case."""
    d_k, d_v, Lk = q.size(-1), v.size(-1), k.size(-2)

    def weights(m: Tensor | None = mask, **kw: Any) -> Callable[[], list[Tensor]]:
        return flavours(lambda **more: attend(q, k, v, m, **kw, **more), 1)

    mistakes = [
        ("the scores were not scaled", weights(scale=1.0), SCALE_HINT),
        ("the scores were divided by d_k instead of √d_k", weights(scale=d_k), NO_SQRT_HINT),
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
             INVERTED_HINT),
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
        ("a padding mask (B, 1, 1, Lk)", mha_masks.padding_mask([6, 3], max_len=Lk)),
    ]:
        cases.append(dict(q=randn(g, B, H, Lq, d_k), k=randn(g, B, H, Lk, d_k), v=randn(g, B, H, Lk, d_v),
                          mask=mask, label=label))
    random_mask = torch.rand(3, 5, 5, generator=g) > 0.5
    random_mask |= torch.eye(5, dtype=torch.bool)
    cases.append(dict(q=randn(g, 3, 5, 4), k=randn(g, 3, 5, 4), v=randn(g, 3, 5, 4), mask=random_mask,
                      label="3-D inputs and a random mask (B, L, L)"))
    f32 = torch.float32
    cases.append(dict(q=randn(g, 2, 2, 3, 4, dtype=f32), k=randn(g, 2, 2, 5, 4, dtype=f32),
                      v=randn(g, 2, 2, 5, 3, dtype=f32), mask=mha_masks.padding_mask([5, 2], max_len=5),
                      label="float32 inputs and a padding mask"))
    if fully_masked:
        mask = torch.ones(B, 1, Lq, Lk, dtype=torch.bool)
        mask[0, 0, 1] = False  # query 1 of sequence 0 may attend to nothing
        mask[1, 0, 3] = False
        cases.append(dict(q=randn(g, B, H, Lq, d_k), k=randn(g, B, H, Lk, d_k), v=randn(g, B, H, Lk, d_v),
                          mask=mask, label="a mask that blocks every key of some queries"))
    return cases


def _check_case(fn: Callable[..., Any], case: dict[str, Any], fully_masked: bool) -> None:
    q, k, v, mask = case["q"], case["k"], case["v"], case["mask"]
    where = f"with {describe_shapes(query=q, key=k, value=v)} and {case['label']}"
    args = cloned(q, k, v)
    kwargs = {} if mask is None else {"mask": mask.clone()}
    result = call(fn, *args, **kwargs, what="your function", forbidden=[mha_attention.scaled_dot_product_attention])
    check_unchanged(["query", "key", "value", "mask"], [q, k, v, mask], [*args, kwargs.get("mask")], "your function")
    output, weights = unpack_pair(result, "your function", "output", "weights")
    q, k, v = q.double(), k.double(), v.double()  # the reference, in float64
    expected_out, expected_w = attend(q, k, v, mask)

    if isinstance(output, Tensor) and output.shape == expected_w.shape != expected_out.shape:
        raise fail(f"the output has the weights' shape {tuple(output.shape)} {where}",
                   "The values were never multiplied in: output = weights @ value, shape (..., Lq, d_v).")
    if isinstance(output, Tensor) and output.shape != expected_out.shape and close(output, expected_w @ k):
        raise fail(f"the output has shape {tuple(output.shape)}, expected {tuple(expected_out.shape)} {where}: "
                   "it looks like the weights were multiplied with the keys",
                   "The output blends the values: output = weights @ value.")
    dtype = case["q"].dtype
    output = expect_tensor(output, "the output", expected_out.shape, dtype=dtype, explain=" (..., Lq, d_v)")
    weights = expect_tensor(weights, "the weights", expected_w.shape, dtype=dtype, explain=" (..., Lq, Lk)")

    if not close(weights, expected_w):
        mistakes = weight_mistakes(q, k, v, mask)
        if fully_masked and mask is not None:
            mistakes.append((
                "-1e9 was used: a fully blocked query attends uniformly to the blocked keys",
                lambda: attend(q, k, v, mask, fill=-1e9, safe=False)[1],
                "Find the queries with no allowed key (~mask).all(-1) and set their weights to zero."))
        raise diagnose(weights, mistakes, f"the weights are wrong {where}",
                       "Compare your weights with softmax(query @ key.transpose(-2, -1) / math.sqrt(d_k)) "
                       "on a small example; each row must sum to 1 over the allowed keys.")
    if not close(output, expected_out):
        raise diagnose(output, [
            ("the weights were multiplied with the keys, not the values",
             lambda: attend(q, k, v, mask, values="key")[0],
             "The output blends the values: output = weights @ value."),
        ], f"the weights are right but the output is wrong {where}",
            "The output is the weighted sum of the values: output = weights @ value.")


OVERFLOW_HINT = ("exp(score) overflows float32 for scores above about 88 (exp(100) = inf, and inf / inf = NaN): "
                 "subtract each row's maximum before exp, or use torch.softmax, which does.")


def _check_large_scores(fn: Callable[..., Any], fully_masked: bool) -> None:
    """Float32 scores near ±100, where a softmax written as exp(s) / sum(exp(s)) overflows."""
    g = gen(11)
    f32 = torch.float32
    q, k, v = randn(g, 2, 2, 3, 4, scale=10.0, dtype=f32), randn(g, 2, 2, 5, 4, scale=10.0, dtype=f32), \
        randn(g, 2, 2, 5, 3, dtype=f32)
    mask = mha_masks.padding_mask([5, 3], max_len=5).expand(2, 1, 3, 5).clone()
    if fully_masked:
        mask[1, 0, 2] = False
    where = f"with float32 scores as large as ±100 ({describe_shapes(query=q, key=k, value=v)}, a padding mask)"
    args = cloned(q, k, v)
    result = call(fn, *args, mask=mask.clone(), what="your function (large scores)")
    output, weights = unpack_pair(result, "your function", "output", "weights")
    expected_out, expected_w = attend(q.double(), k.double(), v.double(), mask)
    output = expect_tensor(output, "the output", expected_out.shape, dtype=f32, explain=" (..., Lq, d_v)")
    weights = expect_tensor(weights, "the weights", expected_w.shape, dtype=f32, explain=" (..., Lq, Lk)")
    for got, expected, what in ((weights, expected_w, "weights"), (output, expected_out, "output")):
        if close(got, expected):
            continue
        if not bool(torch.isfinite(got).all()) and bool(torch.isfinite(expected).all()):
            raise fail(f"the {what} contain inf or NaN {where}, although every case with small scores was right: "
                       "it looks like the softmax was computed as exp(scores) / sum(exp(scores)) without "
                       "subtracting the maximum", OVERFLOW_HINT)
        raise diagnose(got, [], f"the {what} are wrong {where}, although every case with small scores was right",
                       "Compute in the inputs' dtype with torch.softmax(scores, dim=-1), which subtracts each "
                       "row's maximum first.", expected=expected, axis="query")


def _check_attention(fn: Callable[..., Any], name: str, fully_masked: bool) -> CheckResult:
    def body() -> str:
        cases = _attention_cases(fully_masked)
        for case in cases:
            _check_case(fn, case, fully_masked)
        _check_large_scores(fn, fully_masked)
        _check_gradients(fn, cases[-1] if fully_masked else cases[1])
        case = cases[-1]
        check_device_care(fn, *(on_meta(case[n]) for n in "qkv"), mask=on_meta(case["mask"]), what="your function",
                          hint="Make any tensor you create on the inputs' device, e.g. "
                               "torch.full_like(scores, float('-inf')) or torch.zeros(..., device=query.device); "
                               "masked_fill(~mask, float('-inf')) needs none.")
        covered = "batch and head axes, Lq ≠ Lk, d_v ≠ d_k, masks, float32 kept, another device"
        if fully_masked:
            return f"correct on {len(cases)} cases ({covered}), gradients right and finite"
        return f"correct on {len(cases)} cases ({covered}), gradients right"

    return run_check(name, body)


def _check_gradients(fn: Callable[..., Any], case: dict[str, Any]) -> None:
    """Backpropagate through the learner's attention and through the reference: the
    gradients must reach query, key and value, be finite, and agree."""
    names = ("query", "key", "value")
    ours = [case[n].clone().requires_grad_(True) for n in "qkv"]
    theirs = [case[n].clone().requires_grad_(True) for n in "qkv"]
    with torch.enable_grad():
        result = call(fn, *ours, mask=case["mask"].clone(), what="your function (with gradients on)")
        output, _ = unpack_pair(result, "your function", "output", "weights")
        if not isinstance(output, Tensor) or not output.requires_grad:
            raise fail("the output doesn't depend on query, key and value through autograd", DETACH_HINT)
        direction = randn(gen(9), *output.shape)  # a random projection of the output, so no gradient is 0 by chance
        try:
            (output.double() * direction).sum().backward()
        except Exception as error:  # the learner's graph failed in the backward pass
            raise describe_error(error, "the backward pass through your function") from None
        (attend(*theirs, case["mask"])[0] * direction).sum().backward()
    missing = [n for n, t in zip(names, ours) if t.grad is None]
    if missing:
        raise fail(f"the outputs are right, but no gradient reaches {', '.join(missing)}: part of the computation "
                   "was cut out of autograd", DETACH_HINT)
    bad = [n for n, t in zip(names, ours) if not torch.isfinite(t.grad).all()]
    if bad:
        raise fail(f"the outputs are right, but the gradients of {', '.join(bad)} contain NaN",
                   "A softmax over a row of -inf is NaN even if you replace its output afterwards: the "
                   "backward pass still goes through 0/0. Give fully blocked rows finite scores before "
                   "the softmax, then zero their weights.")
    wrong = [n for n, a, b in zip(names, ours, theirs) if not close(a.grad, b.grad)]
    if wrong:
        raise fail(f"the outputs are right, but the gradients of {', '.join(wrong)} are not",
                   "Part of the computation bypasses autograd (.detach(), .data, an in-place write or a value "
                   "taken with .item()): " + DETACH_HINT)


def check_scaled_dot_product_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key, value, mask=None) -> (output, weights)``.

    query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, value ``(..., Lk, d_v)``; a bool
    mask broadcastable to ``(..., Lq, Lk)`` with True = may attend. The outputs keep the
    inputs' dtype, and gradients flow back to query, key and value.
    """
    return _check_attention(fn, "scaled dot-product attention", fully_masked=False)


def check_masked_attention(fn: Callable[..., Any]) -> CheckResult:
    """Like :func:`check_scaled_dot_product_attention`, plus queries whose keys are all
    blocked: they must get zero weights and a zero output, not NaN."""
    return _check_attention(fn, "attention with fully masked rows", fully_masked=True)


def check_attention_scores(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key) -> scores``: query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``
    → scaled scores ``(..., Lq, Lk)``, in the inputs' dtype."""

    def body() -> str:
        g = gen(2)
        cases = [(randn(g, 4, 8), randn(g, 6, 8)), (randn(g, 2, 3, 5, 16), randn(g, 2, 3, 7, 16)),
                 (randn(g, 2, 3, 4, dtype=torch.float32), randn(g, 2, 5, 4, dtype=torch.float32))]
        for q, k in cases:
            args = cloned(q, k)
            scores = call(fn, *args, what="your function")
            check_unchanged(["query", "key"], [q, k], args, "your function")
            dtype, q, k = q.dtype, q.double(), k.double()
            raw = q @ k.transpose(-2, -1)
            expected = raw / sqrt(q.size(-1))
            if isinstance(scores, Tensor) and scores.shape == expected.transpose(-2, -1).shape != expected.shape:
                raise fail(f"the scores have shape {tuple(scores.shape)}, expected {tuple(expected.shape)} (..., Lq, Lk)",
                           "Rows are queries and columns are keys: query @ key.transpose(-2, -1).")
            scores = expect_tensor(scores, "the scores", expected.shape, dtype=dtype, explain=" (..., Lq, Lk)")
            if not close(scores, expected):
                d_k = q.size(-1)
                raise diagnose(scores, [
                    ("the scores were not scaled", lambda: raw, SCALE_HINT),
                    ("the scores were divided by d_k instead of √d_k", lambda: raw / d_k, NO_SQRT_HINT),
                    ("the scores were multiplied by √d_k", lambda: raw * sqrt(d_k), SCALE_HINT),
                    ("the scores were scaled by √Lk (the number of keys)", lambda: raw / sqrt(k.size(-2)),
                     "Scale by the feature size d_k = query.size(-1), not by a sequence length."),
                ], f"the scores are wrong for {describe_shapes(query=q, key=k)}",
                    "scores = query @ key.transpose(-2, -1) / math.sqrt(d_k).")
        return f"correct on {len(cases)} cases"

    return run_check("attention scores", body)
