"""Checks for chapter 07: the pre-norm encoder layer, and a head silenced before ``W_o``.

The references are :mod:`.reference`'s attention, on a ``MultiHeadAttention`` (or the learner's
layer) with distinct seeded weights, so that a misplaced norm or residual shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .. import heads as mha_heads
from ..masks import padding_mask
from ..multi_head import MultiHeadAttention
from ._core import (CheckResult, call, check_device_care, check_unchanged, cloned, close, diagnose, expect_tensor, fail, gen,
                    on_meta, randn, run_check)
from .reference import linear, multi_head, projections


def _randomize(module: nn.Module, g: torch.Generator) -> None:
    """Give every parameter (LayerNorm's too) distinct values, so that a misplaced piece shows."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() > 1:
                p.copy_(randn(g, *p.shape, scale=p.shape[1] ** -0.5))
            elif name.endswith("weight"):  # a LayerNorm gain
                p.copy_(1.0 + randn(g, *p.shape, scale=0.3))
            else:
                p.copy_(randn(g, *p.shape, scale=0.2))


def check_encoder_layer(cls: Any) -> CheckResult:
    """Check a pre-norm encoder layer ``cls(d_model, num_heads, d_ff)`` whose ``forward(x,
    mask=None)`` computes ``x + self_attn(norm1(x))`` then ``x + feed_forward(norm2(x))``,
    using its attributes ``self_attn`` (a ``MultiHeadAttention``), ``feed_forward``,
    ``norm1`` and ``norm2``; returns ``(B, L, d_model)``."""

    def body() -> str:
        g = gen(41)
        D, H, d_ff = 8, 2, 16
        layer = call(cls, D, H, d_ff, what=f"your class({D}, {H}, {d_ff})")
        if not isinstance(layer, nn.Module):
            raise fail(f"your class({D}, {H}, {d_ff}) is a {type(layer).__name__}, not an nn.Module")
        parts = {}
        for name, kind in (("self_attn", nn.Module), ("feed_forward", nn.Module), ("norm1", nn.LayerNorm),
                           ("norm2", nn.LayerNorm)):
            part = getattr(layer, name, None)
            if not isinstance(part, kind):
                raise fail(f"your layer has no {kind.__name__} attribute {name}",
                           "Keep the __init__ of the exercise as it is; write only forward.")
            parts[name] = part
        layer = layer.double().eval()
        _randomize(layer, g)
        attn, ff, n1, n2 = parts["self_attn"], parts["feed_forward"], parts["norm1"], parts["norm2"]

        def sa(h: Tensor, mask: Tensor | None) -> Tensor:
            return attn(h, h, h, mask=mask)

        def right(x: Tensor, mask: Tensor | None) -> Tensor:
            x = x + sa(n1(x), mask)
            return x + ff(n2(x))

        x = randn(g, 2, 5, D)
        cases = [(x, None, "no mask"), (x, padding_mask([5, 3]), "a padding mask (B, 1, 1, L)")]
        for x, mask, label in cases:
            (arg,) = cloned(x)
            kwargs = {} if mask is None else {"mask": mask}
            with torch.no_grad():
                out = call(layer, arg, **kwargs, what="your forward")
                check_unchanged(["x"], [x], [arg], "your forward")
                if isinstance(out, (tuple, list)) and len(out) == 2:
                    out = out[0]
                out = expect_tensor(out, "the output", x.shape, explain=" (B, L, d_model)")
                if close(out, right(x, mask)):
                    continue

                def post_norm() -> Tensor:
                    y = n1(x + sa(x, mask))
                    return n2(y + ff(y))

                def residual_from_normalized() -> Tensor:
                    h = n1(x)
                    y = h + sa(h, mask)
                    h2 = n2(y)
                    return h2 + ff(h2)

                def no_attention_residual() -> Tensor:
                    y = sa(n1(x), mask)
                    return y + ff(n2(y))

                def no_ff_residual() -> Tensor:
                    return ff(n2(x + sa(n1(x), mask)))

                def one_norm() -> Tensor:
                    y = x + sa(n1(x), mask)
                    return y + ff(n1(y))

                def no_mask() -> Tensor:
                    return right(x, None)

                raise diagnose(out, [
                    ("the post-norm order (normalize after adding)", post_norm,
                     "This layer is pre-norm: normalize the input of each sublayer, x + self_attn(norm1(x)), "
                     "and leave the residual path un-normalized."),
                    ("the residual starts from the normalized input", residual_from_normalized,
                     "Add the sublayer's output to x itself, not to norm1(x): x = x + self_attn(norm1(x))."),
                    ("the attention sublayer has no residual connection", no_attention_residual,
                     "Add the input back: x = x + self_attn(...)."),
                    ("the feed-forward sublayer has no residual connection", no_ff_residual,
                     "Add the input back: x = x + feed_forward(norm2(x))."),
                    ("norm1 was used for both sublayers", one_norm,
                     "Each sublayer has its own LayerNorm: norm2 before the feed-forward network."),
                    ("the mask was not passed to the attention", no_mask,
                     "Pass the mask on: self_attn(h, h, h, mask=mask)."),
                ], f"wrong output with {label}",
                    "Pre-norm: x = x + self_attn(h, h, h, mask) with h = norm1(x); then x = x + feed_forward(norm2(x)).")
        return "correct, with and without a padding mask"

    return run_check("encoder layer", body)


def check_head_ablation(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(mha, x, head) -> output``: self-attention of ``x (B, L, d_model)``
    through ``mha`` with head ``head``'s output set to zero just before ``W_o``."""

    def body() -> str:
        g = gen(42)
        D, H = 12, 3
        mha = MultiHeadAttention(D, H).double().eval()
        w = projections(mha, g)
        x = randn(g, 2, 5, D)
        d_k = D // H

        def silenced(h: int) -> Tensor:
            concat = multi_head(w, x, x, x, None, H, out_proj=False)[0]  # (B, L, D) before W_o
            concat = concat.clone()
            concat[..., h * d_k:(h + 1) * d_k] = 0
            return linear(w["W_o"], concat)

        for head in range(H):
            (arg,) = cloned(x)
            before = {n: p.detach().clone() for n, p in mha.named_parameters()}
            with torch.no_grad():
                out = call(fn, mha, arg, head, what=f"your function (head={head})",
                           forbidden=[mha_heads.silence_heads.__wrapped__])
            check_unchanged(["x"], [x], [arg], "your function")
            if any(not torch.equal(p, before[n]) for n, p in mha.named_parameters()):
                raise fail("your function changed the module's weights",
                           "Silence the head on the way through (zero its slice of the concatenated heads), "
                           "leaving the weights as they are.")
            if isinstance(out, (tuple, list)) and len(out) == 2:
                out = out[0]
            out = expect_tensor(out, f"the output for head={head}", x.shape, explain=" (B, L, d_model)")
            if not close(out, silenced(head)):
                full = multi_head(w, x, x, x, None, H)[0]

                def zero_after_w_o() -> Tensor:
                    y = full.clone()
                    y[..., head * d_k:(head + 1) * d_k] = 0
                    return y

                others = [silenced(h) for h in range(H) if h != head]
                raise diagnose(out, [
                    ("nothing was silenced", lambda: full, "Zero head h's features [h*d_k, (h+1)*d_k) before W_o."),
                    ("the slice was zeroed after W_o", zero_after_w_o,
                     "W_o mixes the heads: zero the head's slice *before* the output projection."),
                    ("another head was silenced", lambda: others, "Head h owns the features [h*d_k, (h+1)*d_k)."),
                ], f"wrong output for head={head}",
                    "Run the module's steps yourself (or use a forward pre-hook on W_o) and zero the head's slice "
                    "of the concatenated heads before W_o.")
        with torch.no_grad():
            check_device_care(fn, on_meta(mha), on_meta(x), 1, what="your function",
                              hint="Make the head's mask (or zeros) on the input's device: "
                                   "torch.ones(..., device=x.device), or multiply the slice by 0 in place of a mask.")
        return f"correct for each of the {H} heads, and on another device"

    return run_check("head ablation", body)
