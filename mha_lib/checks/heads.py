"""Checks for chapters 02–04: one head, splitting into heads, the multi-head module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .. import heads as _heads
from .. import multi_head as _multi_head
from ..masks import causal_mask, padding_mask
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
from .attention import SCALE_HINT, _attend

TRANSPOSE_HINT = ("A plain reshape to (B, H, L, d_k) mixes positions into heads. Cut the features with "
                  ".view(B, L, H, d_k), then .transpose(1, 2) to bring the head axis before the sequence axis.")
COMBINE_HINT = ("Undo the split in reverse order: .transpose(1, 2) back to (B, L, H, d_k), then "
                ".reshape(B, L, H * d_k) (or .contiguous().view(...)).")
INTERLEAVE_HINT = ("Head h owns one contiguous chunk of features, [h*d_k, (h+1)*d_k): view the last axis as "
                   "(H, d_k), not (d_k, H).")


# ------------------------------------------------------------------ split / combine

def check_split_heads(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x, num_heads)``: ``(B, L, D) -> (B, H, L, D // H)``, head h holding
    features ``[h·D/H, (h+1)·D/H)``."""

    def body() -> str:
        g = gen(3)
        cases = [((2, 5, 12), 3), ((1, 4, 8), 2), ((3, 2, 6), 6), ((2, 3, 8), 1)]
        for (B, L, D), H in cases:
            x = randn(g, B, L, D)
            (arg,) = cloned(x)
            out = call(fn, arg, H, what=f"your function (x {tuple(x.shape)}, num_heads={H})",
                       forbidden=[_heads.split_heads])
            check_unchanged(["x"], [x], [arg], "your function")
            d_k = D // H
            if isinstance(out, Tensor) and tuple(out.shape) == (B, L, H, d_k) and L != H:
                raise fail(f"the result has shape {(B, L, H, d_k)} (B, L, H, d_k), expected {(B, H, L, d_k)}",
                           "You stopped after the view: .transpose(1, 2) brings the head axis before the sequence axis.")
            out = expect_tensor(out, f"the result for x {tuple(x.shape)} and num_heads={H}", (B, H, L, d_k),
                                explain=" (B, H, L, d_k)")
            expected = x.view(B, L, H, d_k).transpose(1, 2)
            if not close(out, expected):
                raise diagnose(out, [
                    ("a reshape without the transpose", lambda: x.reshape(B, H, L, d_k), TRANSPOSE_HINT),
                    ("heads built from every H-th feature", lambda: x.view(B, L, d_k, H).permute(0, 3, 1, 2),
                     INTERLEAVE_HINT),
                ], f"wrong values for x {tuple(x.shape)} and num_heads={H}",
                    "out[b, h, i] must be x[b, i, h*d_k:(h+1)*d_k].")
        return f"correct on {len(cases)} shapes"

    return run_check("split_heads", body)


def check_combine_heads(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(x)``: ``(B, H, L, d_k) -> (B, L, H·d_k)``, the inverse of split_heads."""

    def body() -> str:
        g = gen(4)
        cases = [(2, 3, 5, 4), (1, 2, 4, 4), (3, 6, 2, 1), (2, 1, 3, 8)]
        for B, H, L, d_k in cases:
            x = randn(g, B, H, L, d_k)
            (arg,) = cloned(x)
            out = call(fn, arg, what=f"your function (x {tuple(x.shape)})", forbidden=[_heads.combine_heads])
            check_unchanged(["x"], [x], [arg], "your function")
            out = expect_tensor(out, f"the result for x {tuple(x.shape)}", (B, L, H * d_k), explain=" (B, L, H * d_k)")
            expected = x.transpose(1, 2).reshape(B, L, H * d_k)
            if not close(out, expected):
                raise diagnose(out, [
                    ("a reshape without the transpose", lambda: x.reshape(B, L, H * d_k), COMBINE_HINT),
                    ("features interleaved across heads", lambda: x.permute(0, 2, 3, 1).reshape(B, L, H * d_k),
                     "Put the heads side by side: features [h*d_k, (h+1)*d_k) come from head h. " + COMBINE_HINT),
                ], f"wrong values for x {tuple(x.shape)}", "out[b, i, h*d_k:(h+1)*d_k] must be x[b, h, i].")
        return f"correct on {len(cases)} shapes"

    return run_check("combine_heads", body)


# ------------------------------------------------------------------ projections and modules

def _linear(name: str, module: Any, attr: str, in_features: int, out_features: int) -> nn.Linear:
    layer = getattr(module, attr, None)
    if layer is None:
        raise fail(f"{name} has no attribute {attr}",
                   f"Create it in __init__: self.{attr} = nn.Linear({in_features}, {out_features}).")
    if not isinstance(layer, nn.Linear):
        raise fail(f"{name}.{attr} is a {type(layer).__name__}, expected nn.Linear({in_features}, {out_features})")
    if (layer.in_features, layer.out_features) != (in_features, out_features):
        raise fail(f"{name}.{attr} is nn.Linear({layer.in_features}, {layer.out_features}), "
                   f"expected nn.Linear({in_features}, {out_features})")
    return layer


def _set_weights(layers: dict[str, nn.Linear], g: torch.Generator) -> dict[str, tuple[Tensor, Tensor]]:
    """Give the learner's layers known weights; return them (bias 0 where there is none)."""
    weights = {}
    with torch.no_grad():
        for attr, layer in layers.items():
            w = randn(g, layer.out_features, layer.in_features, scale=layer.in_features ** -0.5)
            b = randn(g, layer.out_features, scale=0.1) if layer.bias is not None else torch.zeros(layer.out_features, dtype=torch.float64)
            layer.weight.copy_(w)
            if layer.bias is not None:
                layer.bias.copy_(b)
            weights[attr] = (w, b)
    return weights


def _apply(wb: tuple[Tensor, Tensor], x: Tensor) -> Tensor:
    return x @ wb[0].T + wb[1]


def _instantiate(cls: Any, args: tuple[int, ...], name: str) -> nn.Module:
    model = call(cls, *args, what=f"{name}{args}")
    if model is None:
        raise fail(f"{name}{args} returned None")
    if not isinstance(model, nn.Module):
        raise fail(f"{name}{args} is a {type(model).__name__}, not an nn.Module",
                   "Subclass nn.Module and call super().__init__() first in __init__.")
    return model.double().eval()


def _forward(model: nn.Module, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, what: str,
             forbidden: list[Callable[..., Any]]) -> Any:
    args = cloned(q, k, v)
    kwargs = {} if mask is None else {"mask": mask.clone()}
    with torch.no_grad():
        out = call(model, *args, **kwargs, what=what, forbidden=forbidden)
    check_unchanged(["query", "key", "value"], [q, k, v], args, what)
    if isinstance(out, (tuple, list)) and len(out) == 2:
        out = out[0]  # (output, weights) is welcome too
    return out


def mha_reference(w: dict[str, tuple[Tensor, Tensor]], query: Tensor, key: Tensor, value: Tensor,
                  mask: Tensor | None, H: int, *, scale: str = "d_k", split: str = "transpose",
                  combine: str = "transpose", out_proj: bool = True, kv_from_query: bool = False,
                  softmax_dim: int = -1, mask_mode: str = "before") -> Tensor:
    """Multi-head attention with the knobs that common mistakes turn; the defaults are right."""
    if kv_from_query:
        key = value = query
    B, Lq, D = query.shape
    d_k = D // H
    q, k, v = (_apply(w[n], x) for n, x in (("W_q", query), ("W_k", key), ("W_v", value)))
    if split == "none":  # one big head
        heads = _attend(q, k, v, mask, scale=sqrt(D))[0]
        return _apply(w["W_o"], heads) if out_proj else heads

    def cut(x: Tensor) -> Tensor:
        L = x.size(1)
        return x.view(B, L, H, d_k).transpose(1, 2) if split == "transpose" else x.reshape(B, H, L, d_k)

    s = {"d_k": sqrt(d_k), "d_model": sqrt(D), "none": 1.0}[scale]
    heads = _attend(cut(q), cut(k), cut(v), mask, scale=s, softmax_dim=softmax_dim, mask_mode=mask_mode)[0]
    concat = heads.transpose(1, 2).reshape(B, Lq, D) if combine == "transpose" else heads.reshape(B, Lq, D)
    return _apply(w["W_o"], concat) if out_proj else concat


def _mha_cases(g: torch.Generator, D: int) -> list[dict[str, Any]]:
    B = 2
    x = randn(g, B, 5, D)
    tgt, src = randn(g, B, 3, D), randn(g, B, 6, D)
    return [
        dict(query=x, key=x, value=x, mask=None, label="self-attention"),
        dict(query=tgt, key=src, value=src, mask=None, label="cross-attention (Lq=3, Lk=6)"),
        dict(query=x, key=x, value=x, mask=causal_mask(5), label="self-attention with a causal mask (L, L)"),
        dict(query=tgt, key=src, value=src, mask=padding_mask([6, 4], max_len=6),
             label="cross-attention with a padding mask (B, 1, 1, Lk)"),
    ]


def check_multi_head_attention(cls: Any) -> CheckResult:
    """Check a class ``cls(d_model, num_heads)`` with ``nn.Linear`` attributes
    ``W_q, W_k, W_v, W_o`` and ``forward(query, key, value, mask=None)`` returning the
    output ``(B, Lq, d_model)`` (or ``(output, weights)``)."""

    def body() -> str:
        g = gen(5)
        n_cases = 0
        for D, H in [(12, 3), (16, 4), (8, 1)]:
            model = _instantiate(cls, (D, H), "your class")
            layers = {a: _linear("your module", model, a, D, D) for a in ("W_q", "W_k", "W_v", "W_o")}
            w = _set_weights(layers, g)
            for case in _mha_cases(g, D):
                n_cases += 1
                q, k, v, mask = case["query"], case["key"], case["value"], case["mask"]
                where = f"for d_model={D}, num_heads={H}, {case['label']}"
                out = _forward(model, q, k, v, mask, "your forward", [_multi_head.MultiHeadAttention.forward])
                B, Lq = q.shape[:2]
                out = expect_tensor(out, "the output", (B, Lq, D), explain=" (B, Lq, d_model)")
                expected = mha_reference(w, q, k, v, mask, H)
                if not close(out, expected):
                    def variant(**kw: Any) -> Callable[[], Tensor]:
                        return lambda: mha_reference(w, q, k, v, mask, H, **kw)
                    raise diagnose(out, [
                        ("the output projection W_o is missing", variant(out_proj=False),
                         "After combining the heads, mix them with the output projection: self.W_o(concat)."),
                        ("the scores were scaled by √d_model instead of √d_k", variant(scale="d_model"),
                         "Each head's dot products have d_k = d_model // num_heads terms: divide by math.sqrt(d_k)."),
                        ("the scores were not scaled", variant(scale="none"), SCALE_HINT),
                        ("the heads were split without the transpose", variant(split="reshape", combine="reshape"),
                         TRANSPOSE_HINT),
                        ("the heads were split without the transpose", variant(split="reshape"), TRANSPOSE_HINT),
                        ("the heads were combined without the transpose", variant(combine="reshape"), COMBINE_HINT),
                        ("one big head over all d_model features", variant(split="none"),
                         "Split Q, K and V into num_heads heads of d_k features each before attending."),
                        ("the keys and values were computed from the query", variant(kv_from_query=True),
                         "Project the key and value arguments: self.W_k(key), self.W_v(value)."),
                        ("the softmax ran over the queries (dim=-2)", variant(softmax_dim=-2),
                         "Each query's weights are a distribution over the keys: softmax(scores, dim=-1)."),
                        ("the mask is inverted", variant(mask_mode="inverted"),
                         "True means *may attend*: block where the mask is False (masked_fill(~mask, -inf))."),
                        ("the mask was applied after the softmax", variant(mask_mode="after"),
                         "Mask the scores before the softmax."),
                        ("the mask was ignored", variant(mask_mode="ignored"),
                         "Pass the mask on to the attention of every head."),
                    ], f"wrong output {where}",
                        "Follow the five steps: project (W_q, W_k, W_v), split into heads, attend, combine, W_o.")
        return f"correct on {n_cases} cases (self- and cross-attention, masks, 1 to 4 heads)"

    return run_check("MultiHeadAttention", body)


def check_attention_head(cls: Any) -> CheckResult:
    """Check a class ``cls(d_model, d_k, d_v)`` with ``nn.Linear`` attributes ``W_q, W_k``
    ``(d_model → d_k)`` and ``W_v`` ``(d_model → d_v)``, and ``forward(query, key, value,
    mask=None)`` returning the output ``(B, Lq, d_v)`` (or ``(output, weights)``)."""

    def body() -> str:
        g = gen(6)
        D, d_k, d_v = 6, 4, 3
        model = _instantiate(cls, (D, d_k, d_v), "your class")
        layers = {"W_q": _linear("your head", model, "W_q", D, d_k), "W_k": _linear("your head", model, "W_k", D, d_k),
                  "W_v": _linear("your head", model, "W_v", D, d_v)}
        w = _set_weights(layers, g)
        cases = _mha_cases(g, D)
        for case in cases:
            q, k, v, mask = case["query"], case["key"], case["value"], case["mask"]
            m = mask[:, 0] if mask is not None and mask.dim() == 4 else mask  # (B, 1, Lk) for 3-D scores
            out = _forward(model, q, k, v, m, "your forward", [])
            B, Lq = q.shape[:2]
            out = expect_tensor(out, "the output", (B, Lq, d_v), explain=" (B, Lq, d_v)")
            Q, K, V = _apply(w["W_q"], q), _apply(w["W_k"], k), _apply(w["W_v"], v)
            if not close(out, _attend(Q, K, V, m)[0]):
                raise diagnose(out, [
                    ("the scores were not scaled", lambda: _attend(Q, K, V, m, scale=1.0)[0], SCALE_HINT),
                    ("the scores were scaled by √d_model instead of √d_k", lambda: _attend(Q, K, V, m, scale=sqrt(D))[0],
                     "Scale by the size of the projected queries and keys, d_k, not by the embedding size."),
                    ("the keys and values were computed from the query",
                     lambda: _attend(Q, _apply(w["W_k"], q), _apply(w["W_v"], q), m)[0],
                     "Project the key and value arguments: self.W_k(key), self.W_v(value)."),
                    ("the softmax ran over the queries (dim=-2)", lambda: _attend(Q, K, V, m, softmax_dim=-2)[0],
                     "Each query's weights are a distribution over the keys: softmax(scores, dim=-1)."),
                    ("the mask is inverted", lambda: _attend(Q, K, V, m, mask_mode="inverted")[0],
                     "True means *may attend*: block where the mask is False."),
                    ("the mask was ignored", lambda: _attend(Q, K, V, None)[0], "Apply the mask to the scores."),
                ], f"wrong output for {case['label']}",
                    "queries = W_q(query), keys = W_k(key), values = W_v(value), then scaled dot-product attention.")
        return f"correct on {len(cases)} cases (self- and cross-attention, masks)"

    return run_check("AttentionHead", body)


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
            ref_out, ref_w = _attend(Q, K, V)
            if not close(weights, ref_w):
                raise diagnose(weights, [
                    ("the scores were not scaled", lambda: _attend(Q, K, V, scale=1.0)[1], SCALE_HINT),
                    ("the scores were scaled by √d_model instead of √d_k", lambda: _attend(Q, K, V, scale=sqrt(D))[1],
                     "Scale by the size of the projected queries and keys, d_k = W_q.size(1), not by the embedding size."),
                    ("the queries and keys were not projected", lambda: _attend(x, x, V)[1],
                     "queries = x @ W_q and keys = x @ W_k; compare those, not the raw embeddings."),
                    ("the softmax ran over the queries (dim=-2)", lambda: _attend(Q, K, V, softmax_dim=-2)[1],
                     "Each query's weights are a distribution over the keys: softmax(scores, dim=-1)."),
                ], f"the weights are wrong for {where}",
                    "weights = softmax((x @ W_q) @ (x @ W_k).transpose(-2, -1) / math.sqrt(d_k), dim=-1).")
            if not close(output, ref_out):
                raise fail(f"the weights are right but the output is wrong for {where}",
                           "The output blends the values: weights @ (x @ W_v).")
        return f"correct on {len(cases)} cases"

    return run_check("self-attention", body)


def check_parameter_count(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(d_model, num_heads, bias=True) -> int``: the number of parameters of a
    multi-head attention module (four d_model × d_model projections)."""

    def body() -> str:
        cases = [(512, 8, True), (512, 8, False), (64, 4, True), (12, 3, False), (8, 1, True)]
        for D, H, bias in cases:
            got = call(fn, D, H, bias=bias, what=f"your function (d_model={D}, num_heads={H}, bias={bias})")
            if got is None:
                raise fail("your function returned None", "End with: return count")
            if isinstance(got, Tensor):
                got = got.item() if got.numel() == 1 else got
            if not isinstance(got, (int, float)) or isinstance(got, bool) or got != int(got):
                raise fail(f"your function returned {got!r}; expected a whole number")
            expected = 4 * D * D + (4 * D if bias else 0)
            if got != expected:
                named = {
                    4 * D * D: "the biases were left out",
                    3 * D * D + (3 * D if bias else 0): "the output projection W_o is missing",
                    H * expected: "everything was counted once per head",
                    4 * D * (D // H) + (4 * D // H if bias else 0): "only one head's share was counted",
                    4 * D * D + 4 * D: "biases were counted although bias=False",
                }
                name = named.get(int(got))
                hints = {
                    "the biases were left out": "With bias=True each of the 4 projections has d_model biases.",
                    "the output projection W_o is missing": "There are four projections: W_q, W_k, W_v and W_o.",
                    "everything was counted once per head": "The heads share the four d_model x d_model matrices; "
                                                            "splitting into heads adds no parameters.",
                    "only one head's share was counted": "Count the whole d_model x d_model matrices: the heads "
                                                         "together use all of them.",
                    "biases were counted although bias=False": "With bias=False there are only the weights.",
                }
                raise fail(f"wrong count for d_model={D}, num_heads={H}, bias={bias}: got {int(got)}"
                           + (f" ({name})" if name else ""),
                           hints.get(name or "", "Each of W_q, W_k, W_v, W_o is nn.Linear(d_model, d_model)."))
        return f"correct on {len(cases)} configurations"

    return run_check("parameter count", body)


def check_cross_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(mha, target, source, source_lengths) -> output``: multi-head
    cross-attention from ``target (B, Lt, D)`` to a padded ``source (B, Ls, D)``,
    ignoring the source's padding; output ``(B, Lt, D)``."""

    def body() -> str:
        g = gen(8)
        D, H = 8, 2
        mha = _multi_head.MultiHeadAttention(D, H).double().eval()
        w = _set_weights({a: getattr(mha, a) for a in ("W_q", "W_k", "W_v", "W_o")}, g)
        cases = [(randn(g, 2, 3, D), randn(g, 2, 5, D), [5, 2]), (randn(g, 3, 4, D), randn(g, 3, 2, D), [1, 2, 2])]
        for tgt, src, lengths in cases:
            args = cloned(tgt, src)
            with torch.no_grad():
                out = call(fn, mha, *args, list(lengths), what="your function")
            check_unchanged(["target", "source"], [tgt, src], args, "your function")
            if isinstance(out, (tuple, list)) and len(out) == 2:
                out = out[0]
            B, Lt = tgt.shape[:2]
            if isinstance(out, Tensor) and out.shape == src.shape != tgt.shape:
                raise fail(f"the output has the source's shape {tuple(src.shape)}, expected {(B, Lt, D)}",
                           "The queries come from the target: mha(target, source, source, mask=...).")
            out = expect_tensor(out, "the output", (B, Lt, D), explain=" (B, Lt, d_model)")
            keep = padding_mask(lengths, max_len=src.size(1))
            if not close(out, mha_reference(w, tgt, src, src, keep, H)):
                raise diagnose(out, [
                    ("the source's padding was not masked", lambda: mha_reference(w, tgt, src, src, None, H),
                     "Pass mask=padding_mask(source_lengths, max_len=source.size(1)) so no query attends to padding."),
                    ("the mask is inverted", lambda: mha_reference(w, tgt, src, src, ~keep, H),
                     "True means *may attend*: padding_mask gives True for the real tokens."),
                    ("the target attended to itself", lambda: mha_reference(w, tgt, tgt, tgt, None, H),
                     "Keys and values come from the source: mha(target, source, source, mask=...)."),
                ], f"wrong output for target {tuple(tgt.shape)}, source {tuple(src.shape)}, lengths {lengths}",
                    "Queries from the target, keys and values from the source, and a padding mask for the source.")
        return f"correct on {len(cases)} batches"

    return run_check("cross-attention", body)
