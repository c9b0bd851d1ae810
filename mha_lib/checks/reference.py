"""The one reference implementation every check compares against, in float64.

:func:`attend` and :func:`multi_head` compute the right answer with their default
arguments (tests/test_check_gallery.py proves they equal ``mha_lib.scaled_dot_product_attention``
and ``mha_lib.MultiHeadAttention``); each keyword argument turns one knob that a common
mistake turns, so that a check can tell which mistake reproduces a wrong answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ._core import randn, sqrt

Weights = dict[str, tuple[Tensor, Tensor]]  # name -> (weight (out, in), bias (out,))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, scale: float | None = None,
           softmax_dim: int = -1, mask_mode: str = "before", fill: float = float("-inf"),
           values: str = "value", safe: bool = True) -> tuple[Tensor, Tensor]:
    """``(output (..., Lq, d_v), weights (..., Lq, Lk))``; the defaults are right.

    ``scale``: what the scores are divided by (√d_k); ``mask_mode``: ``"before"`` the
    softmax, ``"after"`` it, ``"inverted"``, ``"ignored"``; ``fill``: the blocked scores'
    value; ``safe``: zero weights for a query whose keys are all blocked (else NaN or,
    with a finite ``fill``, a uniform row); ``values="key"`` blends the keys instead.
    """
    scale = sqrt(q.size(-1)) if scale is None else scale
    scores = q @ k.transpose(-2, -1) / scale  # (..., Lq, Lk)
    if mask is not None and mask_mode == "before":
        scores = scores.masked_fill(~mask, fill)
    elif mask is not None and mask_mode == "inverted":
        scores = scores.masked_fill(mask, fill)
    if safe:
        blocked = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., Lq, 1)
    else:
        blocked = torch.zeros_like(scores[..., :1], dtype=torch.bool)
    weights = torch.softmax(scores.masked_fill(blocked, 0.0), dim=softmax_dim).masked_fill(blocked, 0.0)
    if mask is not None and mask_mode == "after":
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ (v if values == "value" else k), weights


def flavours(compute: Callable[..., tuple[Tensor, Tensor]], index: int) -> Callable[[], list[Tensor]]:
    """What ``compute(**more)[index]`` gives with each way of blocking: NaN-free, naive
    ``-inf`` (NaN for a fully blocked row) and ``-1e9`` (a uniform row)."""
    return lambda: [compute()[index], compute(safe=False)[index], compute(fill=-1e9, safe=False)[index]]


def linear(wb: tuple[Tensor, Tensor], x: Tensor) -> Tensor:
    """``nn.Linear`` with weight and bias ``wb``: ``x @ W.T + b``."""
    return x @ wb[0].T + wb[1]


def set_weights(layers: dict[str, nn.Linear], g: torch.Generator) -> Weights:
    """Give the learner's (or mha_lib's) layers known weights; return them (bias 0 where there is none)."""
    weights = {}
    with torch.no_grad():
        for attr, layer in layers.items():
            w = randn(g, layer.out_features, layer.in_features, scale=layer.in_features ** -0.5)
            if layer.bias is not None:
                b = randn(g, layer.out_features, scale=0.1)
                layer.bias.copy_(b)
            else:
                b = torch.zeros(layer.out_features, dtype=torch.float64)
            layer.weight.copy_(w)
            weights[attr] = (w, b)
    return weights


def projections(module: nn.Module, g: torch.Generator) -> Weights:
    """:func:`set_weights` on a module's ``W_q, W_k, W_v, W_o``."""
    return set_weights({a: getattr(module, a) for a in ("W_q", "W_k", "W_v", "W_o")}, g)


def multi_head(w: Weights, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, H: int, *,
               scale: str = "sqrt_d_k", split: str = "transpose", combine: str = "transpose",
               out_proj: bool = True, kv_from_query: bool = False, v_from_key: bool = False,
               **attend_knobs: Any) -> tuple[Tensor, Tensor]:
    """Multi-head attention: ``(output (B, Lq, D), weights (B, H, Lq, Lk))``; the defaults are right.

    ``scale``: ``"sqrt_d_k"``, ``"d_k"`` (no square root), ``"sqrt_d_model"``, ``"none"``;
    ``split``: ``"transpose"``, ``"reshape"`` (no transpose), ``"none"`` (one big head);
    ``combine``: ``"transpose"`` or ``"reshape"``; the other knobs go to :func:`attend`.
    """
    if kv_from_query:
        key = value = query
    if v_from_key:
        value = key
    B, Lq, D = query.shape
    d_k = D // H
    q, k, v = (linear(w[n], x) for n, x in (("W_q", query), ("W_k", key), ("W_v", value)))
    if split == "none":  # one big head
        heads, weights = attend(q, k, v, mask, scale=sqrt(D), **attend_knobs)
        return (linear(w["W_o"], heads) if out_proj else heads), weights

    def cut(x: Tensor) -> Tensor:
        L = x.size(1)
        return x.view(B, L, H, d_k).transpose(1, 2) if split == "transpose" else x.reshape(B, H, L, d_k)

    s = {"sqrt_d_k": sqrt(d_k), "d_k": float(d_k), "sqrt_d_model": sqrt(D), "none": 1.0}[scale]
    heads, weights = attend(cut(q), cut(k), cut(v), mask, scale=s, **attend_knobs)  # (B, H, Lq, d_k)
    concat = heads.transpose(1, 2).reshape(B, Lq, D) if combine == "transpose" else heads.reshape(B, Lq, D)
    return (linear(w["W_o"], concat) if out_proj else concat), weights
