"""Checks for chapter 02: self-attention from weight matrices, and one attention head as a module."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._core import (
    CheckResult,
    call,
    check_unchanged,
    cloned,
    close,
    describe_shapes,
    diagnose,
    expect_number,
    expect_tensor,
    fail,
    gen,
    randn,
    run_check,
    sqrt,
    unpack_pair,
)
from .reference import attend, flavours, linear, set_weights
from .attention import INVERTED_HINT, NO_SQRT_HINT
from .modules import forward_of, instantiate, linear_attr, mha_cases

PROJECTED_SCALE_HINT = ("Divide the scores by math.sqrt(d_k), the size of the projected queries and keys "
                        "(inside forward, query.size(-1) is the embedding size d_model, not d_k).")


def check_attention_head(cls: Any) -> CheckResult:
    """Check a class ``cls(d_model, d_k, d_v)`` with ``nn.Linear`` attributes ``W_q, W_k``
    ``(d_model → d_k)`` and ``W_v`` ``(d_model → d_v)``, and ``forward(query, key, value,
    mask=None)`` returning the output ``(B, Lq, d_v)`` (or ``(output, weights)``)."""

    def body() -> str:
        g = gen(6)
        D, d_k, d_v = 6, 4, 3
        model = instantiate(cls, (D, d_k, d_v), "your class")
        layers = {attr: linear_attr("your head", model, attr, D, size)
                  for attr, size in (("W_q", d_k), ("W_k", d_k), ("W_v", d_v))}
        no_bias = [attr for attr, layer in layers.items() if layer.bias is None]
        if no_bias:
            raise fail(f"your head's {', '.join(no_bias)} {'was' if len(no_bias) == 1 else 'were'} built with "
                       "bias=False, where the exercise asks for default layers (with a bias)",
                       "Create them as nn.Linear(d_model, d_k) and nn.Linear(d_model, d_v), without bias=False: "
                       "the check (and mha_lib.AttentionHead) expects the bias PyTorch adds by default.")
        w = set_weights(layers, g)
        cases = mha_cases(g, D)
        for case in cases:
            q, k, v, mask = case["query"], case["key"], case["value"], case["mask"]
            m = mask[:, 0] if mask is not None and mask.dim() == 4 else mask  # (B, 1, Lk) for 3-D scores
            out, weights = forward_of(model, q, k, v, m, "your forward", [])
            B, Lq = q.shape[:2]
            out = expect_tensor(out, "the output", (B, Lq, d_v), explain=" (B, Lq, d_v)")
            Q, K, V = linear(w["W_q"], q), linear(w["W_k"], k), linear(w["W_v"], v)
            if not close(out, attend(Q, K, V, m)[0]):
                def variant(m: Tensor | None = m, **kw: Any) -> Callable[[], list[Tensor]]:
                    return flavours(lambda **more: attend(Q, K, V, m, **kw, **more), 0)
                raise diagnose(out, [
                    ("the scores were not scaled", variant(scale=1.0), PROJECTED_SCALE_HINT),
                    ("the scores were divided by d_k instead of √d_k", variant(scale=float(d_k)), NO_SQRT_HINT),
                    ("the scores were scaled by √d_model instead of √d_k", variant(scale=sqrt(D)),
                     "Scale by the size of the projected queries and keys, d_k, not by the embedding size."),
                    ("the keys and values were computed from the query",
                     lambda: attend(Q, linear(w["W_k"], q), linear(w["W_v"], q), m)[0],
                     "Project the key and value arguments: self.W_k(key), self.W_v(value)."),
                    ("the softmax ran over the queries (dim=-2)", variant(softmax_dim=-2),
                     "Each query's weights are a distribution over the keys: softmax(scores, dim=-1)."),
                    ("the mask is inverted (it blocks the keys that may be attended)", variant(mask_mode="inverted"),
                     INVERTED_HINT),
                    ("the mask was ignored", variant(m=None), "Apply the mask to the scores."),
                ], f"wrong output for {case['label']}",
                    "queries = W_q(query), keys = W_k(key), values = W_v(value), then scaled dot-product attention.")
            if weights is not None:  # (output, weights) is fine too: then the weights must be right
                weights = expect_tensor(weights, "the weights (the second value you return)", (B, Lq, k.size(1)),
                                        explain=" (B, Lq, Lk)")
                if not close(weights, attend(Q, K, V, m)[1]):
                    raise fail(f"the output is right but the weights are wrong for {case['label']}",
                               "Return the weights the values were blended with: softmax(scores, dim=-1), masked "
                               "and scaled as for the output.")
        return f"correct on {len(cases)} cases (self- and cross-attention, masks)"

    return run_check("attention head", body)


def check_self_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, W_q, W_k, W_v) -> (output, weights)`` with x ``(B, L, d_model)`` and
    weight matrices ``(d_model, d_k)``, ``(d_model, d_k)``, ``(d_model, d_v)`` used as ``x @ W``."""

    def body() -> str:
        g = gen(7)
        cases = [(2, 5, 6, 4, 3), (1, 3, 8, 2, 5)]
        for B, L, D, d_k, d_v in cases:
            x, Wq, Wk, Wv = randn(g, B, L, D), randn(g, D, d_k), randn(g, D, d_k), randn(g, D, d_v)
            args = cloned(x, Wq, Wk, Wv)
            result = call(fn, *args, what="your function")
            check_unchanged(["x", "W_q", "W_k", "W_v"], [x, Wq, Wk, Wv], args, "your function")
            output, weights = unpack_pair(result, "your function", "output", "weights")
            where = describe_shapes(x=x, W_q=Wq, W_v=Wv)
            output = expect_tensor(output, "the output", (B, L, d_v), explain=" (B, L, d_v)")
            weights = expect_tensor(weights, "the weights", (B, L, L), explain=" (B, L, L)")
            Q, K, V = x @ Wq, x @ Wk, x @ Wv
            ref_out, ref_w = attend(Q, K, V)
            if not close(weights, ref_w):
                raise diagnose(weights, [
                    ("the scores were not scaled", lambda: attend(Q, K, V, scale=1.0)[1],
                     "Divide the scores by math.sqrt(d_k), d_k = W_q.size(1) (the projected size, not x.size(-1))."),
                    ("the scores were divided by d_k instead of √d_k", lambda: attend(Q, K, V, scale=float(d_k))[1],
                     NO_SQRT_HINT),
                    ("the scores were scaled by √d_model instead of √d_k", lambda: attend(Q, K, V, scale=sqrt(D))[1],
                     "Scale by the size of the projected queries and keys, d_k = W_q.size(1), not by the embedding size."),
                    ("the queries and keys were not projected", lambda: attend(x, x, V)[1],
                     "queries = x @ W_q and keys = x @ W_k; compare those, not the raw embeddings."),
                    ("the softmax ran over the queries (dim=-2)", lambda: attend(Q, K, V, softmax_dim=-2)[1],
                     "Each query's weights are a distribution over the keys: softmax(scores, dim=-1)."),
                ], f"the weights are wrong for {where}",
                    "weights = softmax((x @ W_q) @ (x @ W_k).transpose(-2, -1) / math.sqrt(d_k), dim=-1).")
            if not close(output, ref_out):
                raise fail(f"the weights are right but the output is wrong for {where}",
                           "The output blends the values: weights @ (x @ W_v).")
        return f"correct on {len(cases)} cases"

    return run_check("self-attention", body)


# ------------------------------------------------------------------ exercise 2.3: how sharp a head must be

SHARPNESS_HINT = ("Write the weight of the one key: w = e^s / (e^s + (L - 1)·e^0), and solve for s: "
                  "s = log(w · (L - 1) / (1 - w)), with the natural log (math.log).")
_SHARPNESS_CASES = [(5, 0.99), (2, 0.9), (50, 0.9), (1000, 0.5), (8, 0.125), (6, 0.1), (12, 0.999)]
_SHARPNESS_BAD = [(5, 1.0, "weight=1.0: no finite gap gives a weight of exactly 1"),
                  (5, 0.0, "weight=0.0: no finite gap gives a weight of exactly 0"),
                  (5, 1.5, "weight=1.5: a weight is a probability, below 1"),
                  (1, 0.5, "seq_len=1: a query over one key gives it weight 1 whatever the gap")]


def _sharpness_mistakes(L: int, w: float) -> list[tuple[str, float, str]]:
    right = math.log(w * (L - 1) / (1 - w))
    return [
        ("the gap for two keys, log(w / (1 - w)): the length was left out", math.log(w / (1 - w)),
         "The key competes with L - 1 others, each adding e^0 = 1 to the softmax's sum. " + SHARPNESS_HINT),
        ("L in place of L - 1: the key was counted among its own competitors", math.log(w * L / (1 - w)),
         "The sum has the key's own e^s and L - 1 others. " + SHARPNESS_HINT),
        ("log(w · (L - 1)): the key's own e^s was left out of the softmax's sum", math.log(w * (L - 1)),
         "The softmax divides by every key's e^score, the key's own e^s included. " + SHARPNESS_HINT),
        ("the ratio w · (L - 1) / (1 - w) itself, without the log", math.exp(right),
         "That ratio is e^s: take its natural log to get the gap s."),
        ("a log in base 10", right / math.log(10), "Softmax uses e: math.log (natural), not math.log10."),
        ("a log in base 2", right / math.log(2), "Softmax uses e: math.log (natural), not math.log2."),
        ("the gap divided by √L (a scale that belongs to the dot products, not to the gap)", right / math.sqrt(L),
         "The gap is between the scores the softmax sees; no √ scale enters here. " + SHARPNESS_HINT),
    ]


def check_sharpness_needed(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(seq_len, weight) -> s``: the score gap s for which one key, s above the other
    ``seq_len - 1`` (equal) scores, gets ``weight`` of the softmax (a Python float, within 1e-6), and a
    ValueError for arguments no gap can meet (``weight`` outside (0, 1), ``seq_len < 2``)."""

    def body() -> str:
        previous: float | None = None
        for L, w in _SHARPNESS_CASES:
            where = f"for seq_len={L}, weight={w}"
            value = expect_number(call(fn, L, w, what=f"your function (seq_len={L}, weight={w})"), f"the gap {where}")
            right = math.log(w * (L - 1) / (1 - w))
            if not (math.isfinite(value) and abs(value - right) <= 1e-6 * max(1.0, abs(right))):
                if previous is not None and value == previous:
                    raise fail(f"the gap is wrong {where}: it is the number your function gave for the previous "
                               "arguments", "Is a result cached? Compute it from the arguments of every call.")
                for name, candidate, hint in _sharpness_mistakes(L, w):
                    if math.isfinite(value) and abs(value - candidate) <= 1e-4 * max(1.0, abs(candidate)):
                        raise fail(f"the gap is wrong {where}: it looks like {name}", hint)
                got = torch.softmax(torch.tensor([value] + [0.0] * (L - 1), dtype=torch.float64), 0)[0].item() \
                    if math.isfinite(value) else float("nan")
                if math.isfinite(value) and abs(got - w) < 1e-3:
                    raise fail(f"the gap is close but not exact {where}: {value:.6g} gives the key a weight of "
                               f"{got:.6f}", "A search (bisection, a grid) stops near the exact value, not at it: solve "
                               "w = e^s / (e^s + L - 1) for s instead, or search until the gap is within 1e-9.")
                raise fail(f"the gap is wrong {where}: got {value:.4g}, which gives the key a weight of {got:.4g}",
                           SHARPNESS_HINT)
            previous = value
        for L, w, why in _SHARPNESS_BAD:
            try:
                result = fn(L, w)
            except ValueError:
                continue
            except Exception as error:  # noqa: BLE001 - the learner's code: a verdict, never a crash
                raise fail(f"for seq_len={L}, weight={w} your function raised {type(error).__name__} "
                           f"({str(error).splitlines()[0][:80] if str(error) else 'no message'}), not ValueError",
                           f"{why}: test the arguments first and raise ValueError with a message that names the one "
                           "that is wrong.") from None
            raise fail(f"for seq_len={L}, weight={w} your function returned {result!r} instead of raising ValueError",
                       f"{why}: test the arguments first and raise ValueError with a message that names the one "
                       "that is wrong.")
        return (f"correct on {len(_SHARPNESS_CASES)} cases (2 to 1000 keys, weights from 0.1 to 0.999, negative gaps "
                f"included), and {len(_SHARPNESS_BAD)} impossible requests refused with ValueError")

    return run_check("how sharp a head must be", body)
