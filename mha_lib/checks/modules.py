"""Checks for chapters 03 and 04: the multi-head attention module and cross-attention over a
padded source, with the helpers that the modules' checks share (known weights, calls of forward)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .. import multi_head as mha_multi_head
from ..masks import causal_mask, padding_mask
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
    sqrt,
)
from .reference import Weights, flavours, linear, multi_head, projections, set_weights
from .attention import INVERTED_HINT, NO_SQRT_HINT
from .heads import COMBINE_HINT, TRANSPOSE_HINT

MODULE_SCALE_HINT = ("Divide each head's scores by math.sqrt(d_k), with d_k = d_model // num_heads (inside "
                     "forward, query.size(-1) is d_model, not d_k).")



def linear_attr(name: str, module: Any, attr: str, in_features: int, out_features: int) -> nn.Linear:
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


def instantiate(cls: Any, args: tuple[int, ...], name: str) -> nn.Module:
    model = call(cls, *args, what=f"{name}{args}")
    if model is None:
        raise fail(f"{name}{args} returned None")
    if not isinstance(model, nn.Module):
        raise fail(f"{name}{args} is a {type(model).__name__}, not an nn.Module",
                   "Subclass nn.Module and call super().__init__() first in __init__.")
    return model.double().eval()


def forward_of(model: nn.Module, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, what: str,
             forbidden: list[Callable[..., Any]]) -> tuple[Any, Any]:
    """The module's ``(output, weights)``; weights is None when it returns the output alone."""
    args = cloned(q, k, v)
    kwargs = {} if mask is None else {"mask": mask.clone()}
    with torch.no_grad():
        out = call(model, *args, **kwargs, what=what, forbidden=forbidden)
    check_unchanged(["query", "key", "value"], [q, k, v], args, what)
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return out[0], out[1]  # (output, None) reads as the output alone
    return out, None


def mha_cases(g: torch.Generator, D: int) -> list[dict[str, Any]]:
    B = 2
    x = randn(g, B, 5, D)
    tgt, src = randn(g, B, 3, D), randn(g, B, 6, D)
    val = randn(g, B, 6, D)  # values unlike the keys, so that a value taken from the key shows
    return [
        dict(query=x, key=x, value=x, mask=None, label="self-attention"),
        dict(query=tgt, key=src, value=val, mask=None, label="cross-attention (Lq=3, Lk=6)"),
        dict(query=x, key=x, value=x, mask=causal_mask(5), label="self-attention with a causal mask (L, L)"),
        dict(query=tgt, key=src, value=val, mask=padding_mask([6, 4], max_len=6),
             label="cross-attention with a padding mask (B, 1, 1, Lk)"),
    ]


def _head_scores(w: Weights, query: Tensor, key: Tensor, mask: Tensor | None, H: int, fill: float | None) -> Tensor:
    """Each head's scaled scores ``(B, H, Lq, Lk)``, masked with ``fill`` (None: not masked)."""
    B, D = query.size(0), query.size(-1)
    q, k = (linear(w[n], x).view(B, x.size(1), H, D // H).transpose(1, 2) for n, x in (("W_q", query), ("W_k", key)))
    scores = q @ k.transpose(-2, -1) / sqrt(D // H)
    return scores if mask is None or fill is None else scores.masked_fill(~mask, fill)


def _check_weights(weights: Any, w: Weights, case: dict[str, Any], H: int, where: str) -> None:
    """The second value of a returned pair: each head's weights ``(B, H, Lq, Lk)``."""
    q, k, mask = case["query"], case["key"], case["mask"]
    B, Lq, Lk = q.size(0), q.size(1), k.size(1)
    expected = multi_head(w, q, k, case["value"], mask, H)[1]
    if isinstance(weights, Tensor) and tuple(weights.shape) == (B, Lq, Lk) and H > 1 and \
            close(weights.detach(), expected.mean(1)):
        raise fail(f"the weights {where} are averaged over the heads, shape {(B, Lq, Lk)}",
                   "Return every head's weights, (B, H, Lq, Lk), as they come out of the softmax "
                   "(nn.MultiheadAttention averages them by default; this exercise doesn't).")
    weights = expect_tensor(weights, "the weights (the second value you return)", (B, H, Lq, Lk),
                            explain=" (B, H, Lq, Lk)")
    if not close(weights, expected):
        raise diagnose(weights, [
            ("the scores before the softmax were returned",
             lambda: [_head_scores(w, q, k, mask, H, f) for f in (float("-inf"), -1e9, None)],
             "Return the weights, softmax(scores, dim=-1): the numbers the values were blended with."),
            ("the weights were computed before the mask was applied", lambda: multi_head(w, q, k, q, None, H)[1],
             "Return the weights of the masked scores, the ones the values were multiplied with."),
            ("the weights of the unscaled scores were returned",
             lambda: multi_head(w, q, k, q, mask, H, scale="none")[1],
             "Return the weights that were applied to the values: softmax of the scaled scores."),
        ], f"the output is right but the weights are wrong {where}",
            "Return the weights the values were multiplied with: (output, weights), weights (B, H, Lq, Lk).")


def _check_value_error(cls: Any) -> None:
    """``cls(10, 3)``: 10 features can't be cut into 3 equal heads; the exercise demands a ValueError."""
    try:
        cls(10, 3)
    except ValueError:
        return
    except AssertionError:
        raise fail("your class(10, 3) raised AssertionError; the exercise asks for a ValueError",
                   "assert is for bugs in your own code (and python -O removes it): "
                   "raise ValueError(f'd_model={d_model} is not divisible by num_heads={num_heads}').") from None
    except Exception as error:  # noqa: BLE001 - any other exception is the wrong one
        hint = ("TypeError means an argument of the wrong type; 10 and 3 are ints, only their values don't fit: "
                "raise ValueError(...)." if isinstance(error, TypeError) else
                "if d_model % num_heads != 0: raise ValueError(...), before building anything.")
        raise fail(f"your class(10, 3) raised {type(error).__name__}; the exercise asks for a ValueError", hint) from None
    raise fail("your class(10, 3) was built although 10 features can't be split into 3 equal heads",
               "In __init__: if d_model % num_heads != 0: raise ValueError(...). Otherwise each head gets "
               "10 // 3 = 3 features and the split fails (or silently drops features) later.")


def check_multi_head_attention(cls: Any) -> CheckResult:
    """Check a class ``cls(d_model, num_heads)`` with ``nn.Linear`` attributes
    ``W_q, W_k, W_v, W_o`` and ``forward(query, key, value, mask=None)`` returning the
    output ``(B, Lq, d_model)`` (or ``(output, weights)``, weights ``(B, H, Lq, Lk)``);
    ``cls(10, 3)`` must raise ValueError."""

    def body() -> str:
        g = gen(5)
        n_cases = 0
        for D, H in [(12, 3), (16, 4), (8, 1)]:
            model = instantiate(cls, (D, H), "your class")
            layers = {a: linear_attr("your module", model, a, D, D) for a in ("W_q", "W_k", "W_v", "W_o")}
            w = set_weights(layers, g)
            for case in mha_cases(g, D):
                n_cases += 1
                q, k, v, mask = case["query"], case["key"], case["value"], case["mask"]
                where = f"for d_model={D}, num_heads={H}, {case['label']}"
                out, weights = forward_of(model, q, k, v, mask, "your forward",
                                        [mha_multi_head.MultiHeadAttention.forward])
                B, Lq = q.shape[:2]
                out = expect_tensor(out, "the output", (B, Lq, D), explain=" (B, Lq, d_model)")
                if not close(out, multi_head(w, q, k, v, mask, H)[0]):
                    def variant(**kw: Any) -> Callable[[], list[Tensor]]:
                        return flavours(lambda **more: multi_head(w, q, k, v, mask, H, **kw, **more), 0)
                    raise diagnose(out, [
                        ("the output projection W_o is missing", variant(out_proj=False),
                         "After combining the heads, mix them with the output projection: self.W_o(concat)."),
                        ("the scores were scaled by √d_model instead of √d_k", variant(scale="sqrt_d_model"),
                         "Each head's dot products have d_k = d_model // num_heads terms: divide by math.sqrt(d_k)."),
                        ("the scores were not scaled", variant(scale="none"), MODULE_SCALE_HINT),
                        ("the scores were divided by d_k instead of √d_k", variant(scale="d_k"), NO_SQRT_HINT),
                        ("the heads were split without the transpose", variant(split="reshape", combine="reshape"),
                         TRANSPOSE_HINT),
                        ("the heads were split without the transpose", variant(split="reshape"), TRANSPOSE_HINT),
                        ("the heads were combined without the transpose", variant(combine="reshape"), COMBINE_HINT),
                        ("one big head over all d_model features", variant(split="none"),
                         "Split Q, K and V into num_heads heads of d_k features each before attending."),
                        ("the keys and values were computed from the query", variant(kv_from_query=True),
                         "Project the key and value arguments: self.W_k(key), self.W_v(value)."),
                        ("the values were projected from the key", variant(v_from_key=True),
                         "self.W_v(value), not self.W_v(key)."),
                        ("the softmax ran over the queries (dim=-2)", variant(softmax_dim=-2),
                         "Each query's weights are a distribution over the keys: softmax(scores, dim=-1)."),
                        ("the mask is inverted (it blocks the keys that may be attended)",
                         variant(mask_mode="inverted"), INVERTED_HINT),
                        ("the mask was applied after the softmax", variant(mask_mode="after"),
                         "Mask the scores before the softmax."),
                        ("the mask was ignored", variant(mask_mode="ignored"),
                         "Pass the mask on to the attention of every head."),
                    ], f"wrong output {where}",
                        "Follow the five steps: project (W_q, W_k, W_v), split into heads, attend, combine, W_o.")
                if weights is not None:
                    _check_weights(weights, w, case, H, where)
        _check_value_error(cls)
        return (f"correct on {n_cases} cases (self- and cross-attention, masks, 1 to 4 heads), and a ValueError "
                "when num_heads doesn't divide d_model")

    return run_check("multi-head attention", body)


def check_cross_attention(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(mha, target, source, source_lengths) -> output``: multi-head
    cross-attention from ``target (B, Lt, D)`` to a padded ``source (B, Ls, D)``,
    ignoring the source's padding (which may go beyond its longest sentence); output
    ``(B, Lt, D)``."""

    def body() -> str:
        g = gen(8)
        D, H = 8, 2
        mha = mha_multi_head.MultiHeadAttention(D, H).double().eval()
        w = projections(mha, g)
        cases = [(randn(g, 2, 3, D), randn(g, 2, 5, D), [5, 2]), (randn(g, 3, 4, D), randn(g, 3, 2, D), [1, 2, 2]),
                 (randn(g, 2, 3, D), randn(g, 2, 6, D), [4, 2])]
        for tgt, src, lengths in cases:
            args = cloned(tgt, src)
            beyond = max(lengths) < src.size(1)
            where = f"for target {tuple(tgt.shape)}, source {tuple(src.shape)}, lengths {lengths}"
            try:
                with torch.no_grad():
                    out = call(fn, mha, *args, list(lengths), what="your function")
            except Verdict as verdict:
                if verdict.status == ERROR and beyond:
                    raise fail(f"your function fails {where}, a source padded beyond its longest sentence: it "
                               f"looks like the padding mask was only as long as the longest sentence ({verdict.message})",
                               "Pass max_len=source.size(1): padding_mask(source_lengths, max_len=source.size(1)).") from None
                raise
            check_unchanged(["target", "source"], [tgt, src], args, "your function")
            if isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(o, Tensor) for o in out):
                raise fail("your function returned (output, weights), where the exercise asks for the output alone",
                           "Call the module without return_weights=True (or return its first value): "
                           "return mha(target, source, source, mask=...), a (B, Lt, d_model) tensor.")
            B, Lt = tgt.shape[:2]
            if isinstance(out, Tensor) and out.shape == src.shape != tgt.shape:
                raise fail(f"the output has the source's shape {tuple(src.shape)}, expected {(B, Lt, D)}",
                           "The queries come from the target: mha(target, source, source, mask=...).")
            out = expect_tensor(out, "the output", (B, Lt, D), explain=" (B, Lt, d_model)")
            keep = padding_mask(lengths, max_len=src.size(1))
            if not close(out, multi_head(w, tgt, src, src, keep, H)[0]):
                raise diagnose(out, [
                    ("the source's padding was not masked", lambda: multi_head(w, tgt, src, src, None, H)[0],
                     "Pass mask=padding_mask(source_lengths, max_len=source.size(1)) so no query attends to padding."),
                    ("the mask is inverted", lambda: multi_head(w, tgt, src, src, ~keep, H)[0],
                     "True means *may attend*: padding_mask gives True for the real tokens."),
                    ("the target attended to itself", lambda: multi_head(w, tgt, tgt, tgt, None, H)[0],
                     "Keys and values come from the source: mha(target, source, source, mask=...)."),
                ], f"wrong output {where}",
                    "Queries from the target, keys and values from the source, and a padding mask for the source.")
        tgt, src, lengths = cases[0]
        with torch.no_grad():
            check_device_care(fn, on_meta(mha), on_meta(tgt), on_meta(src), list(lengths), what="your function",
                              hint="Put the padding mask on the source's device: "
                                   "padding_mask(source_lengths, max_len=source.size(1)).to(source.device).")
        return f"correct on {len(cases)} batches (one padded beyond its longest sentence), and on another device"

    return run_check("cross-attention", body)
