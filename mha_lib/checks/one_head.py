"""Checks for chapter 02: self-attention from weight matrices, and one attention head as a module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

from ._core import (
    CheckResult,
    call,
    check_unchanged,
    cloned,
    close,
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
