"""Checks for chapters 01 and 04: the scores and scaled dot-product attention."""

from __future__ import annotations

import math
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
    expect_number,
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


# ------------------------------------------------------------------ exercise 1.5: the scale, measured

MEASURE_HINT = ("Measure it on these inputs: raw = query @ key.transpose(-2, -1) (no scale), then return "
                "raw.std().item(), the spread of every score over all leading axes, queries and keys.")


def _scale_cases() -> list[dict[str, Any]]:
    g = gen(21)
    big_small = torch.tensor([4.0] * 4 + [0.5] * 28, dtype=torch.float64)  # 4 loud features, 28 quiet ones
    unit = dict(q=randn(g, 40, 16), k=randn(g, 50, 16), label="unit-variance entries, d_k = 16")
    cases = [
        dict(q=randn(g, 2, 30, 64, scale=3.0), k=randn(g, 2, 40, 64, scale=0.5),
             label="queries of std 3, keys of std 0.5, d_k = 64"),
        dict(q=randn(g, 2, 30, 64, scale=0.5), k=randn(g, 2, 40, 64, scale=2.0),
             label="the same shapes, queries of std 0.5, keys of std 2"),
        dict(q=(randn(g, 3, 2, 20, 32) * big_small).float(), k=(randn(g, 3, 2, 25, 32) * big_small).float(),
             label="float32, 4 of 32 features 8 times larger in both queries and keys (aligned)"),
        dict(q=randn(g, 2, 24, 32) * big_small, k=randn(g, 2, 36, 32) * big_small.flip(0),
             label="the loud features of the queries are the quiet ones of the keys (crossed)"),
        unit,
    ]
    return cases


def _scale_mistakes(q: Tensor, k: Tensor, right: float) -> list[tuple[str, float, str]]:
    d_k = q.size(-1)
    raw = q @ k.transpose(-2, -1)
    independent = "The features are not alike: measure the scores themselves, not the queries and keys apart. "
    return [
        ("√d_k, the chapter's rule, which holds only for entries of variance 1", sqrt(d_k),
         "√d_k assumes every entry of the queries and keys has variance 1; these don't. " + MEASURE_HINT),
        ("d_k (the variance of unit-variance scores), not a standard deviation", float(d_k), MEASURE_HINT),
        ("the variance of the scores, not their standard deviation", right ** 2,
         "Dividing by the variance gives variance 1 / variance: divide by its square root, the std. " + MEASURE_HINT),
        ("1 / the right scale: the factor to multiply by, not to divide by", 1 / right,
         "The statement asks for s in scores = query @ key.transpose(-2, -1) / s: the std itself."),
        ("the std of scores already divided by √d_k", right / sqrt(d_k),
         "Measure the raw dot products, before any scaling: query @ key.transpose(-2, -1)."),
        ("query.std() · key.std() · √d_k, a formula that holds on average for independent features of one size, "
         "not the spread of these scores",
         float(q.std() * k.std()) * sqrt(d_k), independent + MEASURE_HINT),
        ("query.std() · key.std(), without the √d_k of a sum of d_k products", float(q.std() * k.std()),
         independent + MEASURE_HINT),
        ("the mean absolute score, not the standard deviation", float(raw.abs().mean()), MEASURE_HINT),
        ("the spread of each query's row, averaged over the queries", float(raw.std(dim=-1).mean()),
         "Measure over all the scores at once (.std() with no dim), not row by row."),
    ]


def check_unit_variance_scale(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(query, key) -> s``: the number to divide the raw scores ``query @ keyᵀ`` by so that
    they have variance 1, measured over every score (a Python float; a 0-d tensor is accepted).
    query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, float64 and float32, and once on another device."""

    def body() -> str:
        cases = _scale_cases()
        previous: float | None = None
        for case in cases:
            q, k = case["q"], case["k"]
            where = f"for {describe_shapes(query=q, key=k)}, {case['label']}"
            args = cloned(q, k)
            got = call(fn, *args, what="your function", forbidden=[])
            check_unchanged(["query", "key"], [q, k], args, "your function")
            if isinstance(got, Tensor) and got.shape == q.shape[:-1] + k.shape[-2:-1]:
                raise fail(f"your function returned the scores {tuple(got.shape)} {where}; expected one number, "
                           "the scale s", MEASURE_HINT)
            value = expect_number(got, f"the scale {where}")
            qd, kd = q.double(), k.double()
            right = float((qd @ kd.transpose(-2, -1)).std())
            if not math.isfinite(value) or abs(value - right) > 5e-3 * right:
                if previous is not None and value == previous:
                    raise fail(f"the scale is wrong {where}: it is the number your function gave for the previous "
                               "inputs, of the same shapes", "Is a result cached (keyed on the shapes only)? "
                               "Measure the inputs you are given, every call.")
                for name, candidate, hint in _scale_mistakes(qd, kd, right):
                    if math.isfinite(value) and abs(value - candidate) <= 5e-3 * abs(candidate):
                        raise fail(f"the scale is wrong {where}: it looks like {name}", hint)
                raise fail(f"the scale is wrong {where}: got {value:.4g}, which leaves the scores with variance "
                           f"{(right / value) ** 2 if value else float('inf'):.3g}, not 1", MEASURE_HINT)
            previous = value
        case = cases[2]
        check_device_care(fn, on_meta(case["q"]), on_meta(case["k"]), what="your function",
                          hint="Make no tensor of your own on the CPU: measure query @ key.transpose(-2, -1) where "
                               "the inputs are.")
        return (f"correct on {len(cases)} cases (scaled, aligned, crossed and unit features; float64 and float32; "
                "leading axes), and on another device")

    return run_check("a scale measured for variance 1", body)
