"""Checks for chapter 07: the pre-norm encoder layer, and a head silenced before ``W_o``.

The references are computed from the module's own layers (the learner's layer, or a
``MultiHeadAttention``) with distinct seeded weights, so that a misplaced norm or residual shows. The
modules are handed over in training mode with gradients on (one with a frozen part, one with a hook of
its own), called with other lengths and after their weights change, and must come back as they were
(:func:`._sentiment.call_leaving_model_alone`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .. import heads as mha_heads
from ..masks import padding_mask
from ..multi_head import MultiHeadAttention
from ._core import (CheckResult, Verdict, accepts, call, check_device_care, check_unchanged, cloned, close, diagnose,
                    expect_tensor, fail, gen, on_meta, randn, run_check, where_differs)
from ._sentiment import call_leaving_model_alone
from .reference import projections


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


ENCODER_DEFINITION = ("Pre-norm: x = x + self_attn(h, h, h, mask) with h = norm1(x); then "
                      "x = x + feed_forward(norm2(x)).")


def _has_dropout(layer: nn.Module) -> bool:
    return any(isinstance(m, nn.Dropout) and m.p > 0 or getattr(m, "dropout", 0) not in (0, 0.0, None)
               and isinstance(getattr(m, "dropout", 0), float) for m in layer.modules())


def _encoder_mistakes(layer: nn.Module, x: Tensor, mask: Tensor | None, earlier: list[Tensor]) -> list[Any]:
    attn, ff, n1, n2 = layer.self_attn, layer.feed_forward, layer.norm1, layer.norm2

    def sa(h: Tensor, m: Tensor | None = mask) -> Tensor:
        return attn(h, h, h, mask=m)

    def no_w_o(h: Tensor) -> Tensor:  # the heads concatenated, never projected by W_o
        H = attn.num_heads
        q, k, v = (mha_heads.split_heads(f(h), H) for f in (attn.W_q, attn.W_k, attn.W_v))
        scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return mha_heads.combine_heads(scores.softmax(-1) @ v)

    def right_with(attend: Callable[[Tensor], Tensor]) -> Tensor:
        y = x + attend(n1(x))
        return y + ff(n2(y))

    def post_norm() -> Tensor:
        y = n1(x + sa(x))
        return n2(y + ff(y))

    def residual_from_normalized() -> list[Tensor]:
        h = n1(x)
        y = h + sa(h)  # the attention's residual from norm1(x)
        h2 = n2(y)
        z = x + sa(h)  # the right first sublayer
        return [h2 + ff(h2), y + ff(n2(y)), n2(z) + ff(n2(z))]  # both, the first only, the second only

    def ff_first() -> list[Tensor]:
        out = []
        for a, b in ((n2, n1), (n1, n2)):
            y = x + ff(a(x))
            out.append(y + sa(b(y)))
        return out

    def parallel() -> list[Tensor]:
        h = n1(x)
        return [x + sa(h) + ff(n2(x)), x + sa(h) + ff(h)]

    def no_norm() -> list[Tensor]:
        y1 = x + sa(x)
        y2 = x + sa(n1(x))
        return [y1 + ff(n2(y1)), y2 + ff(y2), y1 + ff(y1)]

    return [
        ("the post-norm order (normalize after adding)", post_norm,
         "This layer is pre-norm: normalize the input of each sublayer, x + self_attn(norm1(x)), "
         "and leave the residual path un-normalized."),
        ("the residual starts from the normalized input", residual_from_normalized,
         "Add the sublayer's output to x itself, not to norm1(x): x = x + self_attn(norm1(x))."),
        ("a norm is missing: a sublayer reads x itself, not its normalized copy", no_norm,
         "Each sublayer reads a normalized copy of x: self_attn(h, h, h) with h = norm1(x), feed_forward(norm2(x))."),
        ("a parallel block: both sublayers read the same input and are added to it at once", parallel,
         "The sublayers run one after the other: the feed-forward network reads x *after* the attention's "
         "residual was added, x = x + self_attn(...); then x = x + feed_forward(norm2(x))."),
        ("the feed-forward sublayer runs first, then the attention", ff_first,
         "Attention first (norm1, self_attn), then the feed-forward network (norm2, feed_forward)."),
        ("the attention sublayer has no residual connection",
         lambda: (lambda y: y + ff(n2(y)))(sa(n1(x))), "Add the input back: x = x + self_attn(...)."),
        ("the feed-forward sublayer has no residual connection", lambda: ff(n2(x + sa(n1(x)))),
         "Add the input back: x = x + feed_forward(norm2(x))."),
        ("the feed-forward sublayer is missing: the output is x + self_attn(norm1(x)) alone",
         lambda: x + sa(n1(x)), "Both sublayers, one after the other: then x = x + feed_forward(norm2(x))."),
        ("the attention sublayer is missing: the output is x + feed_forward(norm2(x)) alone",
         lambda: [x + ff(n2(x)), x + ff(n1(x))],
         "Both sublayers, one after the other: first x = x + self_attn(h, h, h, mask=mask) with h = norm1(x)."),
        ("only the queries were normalized: the attention's keys and values read x itself",
         lambda: [right_with(lambda h: attn(h, x, x, mask=mask)), right_with(lambda h: attn(h, h, x, mask=mask))],
         "Self-attention of the normalized copy: self_attn(h, h, h, mask=mask) with h = norm1(x), the same h "
         "for the queries, keys and values."),
        ("norm1 was used for both sublayers", lambda: (lambda y: y + ff(n1(y)))(x + sa(n1(x))),
         "Each sublayer has its own LayerNorm: norm2 before the feed-forward network."),
        ("the attention's heads were never projected by W_o", lambda: right_with(no_w_o),
         "Call the module, self_attn(h, h, h, mask=mask), whose last step is W_o; by hand, end with "
         "self_attn.W_o(combine_heads(...))."),
        ("the mask was not passed to the attention", lambda: right_with(lambda h: sa(h, None)),
         "Pass the mask on: self_attn(h, h, h, mask=mask)."),
        ("an earlier call's result came back (the layer's weights or the input changed since)", lambda: earlier,
         "Keep nothing from one call to the next: compute from this call's x, every time."),
    ]


def _one_tensor(out: Any, what: str, name: str) -> None:
    """Fail naming a pair (e.g. ``(output, weights)``) where the exercise asks for the output alone."""
    if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], Tensor):
        second = f"Tensor {tuple(out[1].shape)}" if isinstance(out[1], Tensor) else type(out[1]).__name__
        raise fail(f"{what} returned a pair (Tensor {tuple(out[0].shape)}, {second}); the exercise asks for the "
                   "output alone, (B, L, d_model)",
                   f"End with return {name}: a layer that returns a pair can't be stacked or fed to the next one "
                   "(the attention weights, if you want them, are another function's job).")


def check_encoder_layer(cls: Any) -> CheckResult:
    """Check a pre-norm encoder layer ``cls(d_model, num_heads, d_ff)`` whose ``forward(x,
    mask=None)`` computes ``x + self_attn(norm1(x))`` then ``x + feed_forward(norm2(x))``,
    using its attributes ``self_attn`` (a ``MultiHeadAttention``), ``feed_forward``,
    ``norm1`` and ``norm2``; returns ``(B, L, d_model)`` in ``x``'s dtype, on its device, and leaves
    the layer as it was (mode, ``requires_grad``, hooks, weights)."""

    def build(D: int, H: int, d_ff: int) -> nn.Module:
        layer = call(cls, D, H, d_ff, what=f"your class({D}, {H}, {d_ff})")
        if not isinstance(layer, nn.Module):
            raise fail(f"your class({D}, {H}, {d_ff}) is a {type(layer).__name__}, not an nn.Module")
        for name, kind in (("self_attn", nn.Module), ("feed_forward", nn.Module), ("norm1", nn.LayerNorm),
                           ("norm2", nn.LayerNorm)):
            if not isinstance(getattr(layer, name, None), kind):
                raise fail(f"your layer has no {kind.__name__} attribute {name}",
                           "Keep the __init__ of the exercise as it is; write only forward.")
        if not accepts(layer, "mask"):
            raise fail("your forward doesn't accept the argument mask=",
                       "Keep the exercise's signature, mask included: def forward(self, x, mask=None), even when no "
                       "mask is given.")
        return layer

    def forward(layer: nn.Module, x: Tensor, mask: Tensor | None) -> Any:
        return layer(x) if mask is None else layer(x, mask=mask)

    def body() -> str:
        g = gen(41)
        first = build(8, 2, 16).double()
        second = build(12, 3, 24).float()
        _randomize(first, g)
        _randomize(second, g)
        for p in second.norm1.parameters():
            p.requires_grad_(False)  # a frozen norm: requires_grad must come back as it was, not all True
        cases = [  # (layer, (B, L), lengths of a padding mask or None, mode, reseed weights before, label)
            (first, (2, 5), None, "train", False, "8 features, float64, B=2, L=5, no mask"),
            (first, (2, 5), [5, 3], "train", False, "8 features, float64, B=2, L=5, a padding mask (B, 1, 1, L)"),
            (first, (3, 7), [7, 4, 2], "train", True, "8 features, float64, B=3, L=7, a padding mask, after the "
                                                        "layer's weights changed"),
            (first, (2, 6), None, "eval", False, "8 features, float64, evaluation mode, B=2, L=6, no mask"),
            (second, (2, 6), [6, 2], "train", False, "12 features, 3 heads, float32, a frozen norm1, B=2, L=6, "
                                                      "a padding mask"),
        ]
        earlier: list[Tensor] = []
        for layer, (B, L), lengths, mode, reseed, label in cases:
            if reseed:
                _randomize(layer, g)
            layer.train(mode == "train" and not _has_dropout(layer))
            dtype = next(layer.parameters()).dtype
            x = randn(g, B, L, layer.norm1.normalized_shape[0], dtype=dtype)
            mask = None if lengths is None else padding_mask(lengths)
            (arg,) = cloned(x)
            out = call_leaving_model_alone(forward, layer, arg, mask, what=f"your forward ({label})")
            check_unchanged(["x"], [x], [arg], "your forward")
            _one_tensor(out, f"your forward ({label})", "x")
            if isinstance(out, Tensor) and earlier and out.shape != x.shape \
                    and any(out.shape == t.shape for t in earlier):
                raise fail(f"the output ({label}) has the shape {tuple(out.shape)} of an earlier call's, for an "
                           f"input {tuple(x.shape)}: it looks like a result kept from an earlier call",
                           "Keep nothing from one call to the next: compute from this call's x, every time.")
            out = expect_tensor(out, f"the output ({label})", x.shape, dtype=dtype, explain=" (B, L, d_model)")
            again = call_leaving_model_alone(forward, layer, x.clone(), mask, what=f"your forward ({label}, again)")
            if isinstance(again, (tuple, list)) and len(again) == 2:
                again = again[0]
            if isinstance(again, Tensor) and again.shape == out.shape and not close(again, out):
                raise fail(f"your forward gave other numbers for the same input, called twice ({label}, the layer in "
                           f"{'training' if layer.training else 'evaluation'} mode): it looks like a dropout that is "
                           "on whatever the mode, or random numbers drawn in forward",
                           "The exercise's layer has no dropout. If you add one, use an nn.Dropout module (off in "
                           "evaluation mode) or F.dropout(x, p, training=self.training): F.dropout's training "
                           "defaults to True, so it drops in evaluation mode too.")
            with torch.no_grad():
                expected = forward_reference(layer, x, mask)
                if not close(out, expected):
                    raise diagnose(out, _encoder_mistakes(layer, x, mask, earlier), f"wrong output ({label})",
                                   ENCODER_DEFINITION, expected=expected, dim=-2, axis="position")
            earlier.append(out)
        first.eval()
        with torch.no_grad():
            check_device_care(forward, on_meta(first), on_meta(randn(g, 2, 5, 8)), on_meta(padding_mask([5, 3])),
                              what="your forward", hint="Make any tensor you create on x's device and in its dtype "
                                                        "(torch.zeros_like(x), device=x.device).")
        return (f"correct in {len(cases)} calls (with and without a padding mask, other lengths, changed weights, "
                "training and evaluation mode, float32 and float64), each twice, the layer left as it was, and on "
                "another device")

    return run_check("encoder layer", body)


def forward_reference(layer: nn.Module, x: Tensor, mask: Tensor | None) -> Tensor:
    """The pre-norm layer, from the learner's own sublayers (the attention in evaluation mode, no dropout)."""
    attn, ff, n1, n2 = layer.self_attn, layer.feed_forward, layer.norm1, layer.norm2
    h = n1(x)
    y = x + attn(h, h, h, mask=mask)
    return y + ff(n2(y))


HEAD_ABLATION_DEFINITION = ("Run the module's steps yourself (or use a forward pre-hook on W_o) and zero head h's "
                            "output, features [h*d_k, (h+1)*d_k) of the concatenated heads, before W_o.")
HOOK_LEFT = ("your function left a hook registered on the module: every later call still silences a head (a second "
             "call then silences two)")


def _head_outputs(mha: nn.Module, x: Tensor, *, zero_q: int | None = None, zero_k: int | None = None) -> Tensor:
    """``(B, H, L, d_k)``: each head's output, computed from the module's own layers (float64 inputs)."""
    H = mha.num_heads
    q, k, v = (mha_heads.split_heads(layer(x), H) for layer in (mha.W_q, mha.W_k, mha.W_v))
    if zero_q is not None:
        q = q.clone()
        q[:, zero_q] = 0
    if zero_k is not None:
        k = k.clone()
        k[:, zero_k] = 0
    weights = (q @ k.transpose(-2, -1) / q.size(-1) ** 0.5).softmax(-1)
    return weights @ v


def _silenced(mha: nn.Module, x: Tensor, head: int) -> Tensor:
    heads = _head_outputs(mha, x).clone()
    heads[:, head] = 0
    return mha.W_o(mha_heads.combine_heads(heads))


def _head_ablation_mistakes(mha: nn.Module, x: Tensor, head: int, earlier: list[tuple[Tensor, str]]) -> list[Any]:
    H, d_k = mha.num_heads, mha.d_k
    heads = _head_outputs(mha, x)  # (B, H, L, d_k)
    concat = mha_heads.combine_heads(heads)  # (B, L, D)
    full = mha.W_o(concat)

    def out_with(change: Callable[[Tensor], None], of: Tensor = concat) -> Tensor:
        c = of.clone()
        change(c)
        return mha.W_o(c)

    def zeroed(index: Any) -> Callable[[Tensor], None]:
        def change(c: Tensor) -> None:
            c[index] = 0
        return change

    def zero_after_w_o() -> Tensor:
        y = full.clone()
        y[..., head * d_k:(head + 1) * d_k] = 0
        return y

    def on_heads(index: Any) -> Tensor:
        h = heads.clone()
        h[index] = 0
        return mha.W_o(mha_heads.combine_heads(h))

    def on_scores(scale: float) -> Tensor:
        q, k, v = (mha_heads.split_heads(layer(x), H) for layer in (mha.W_q, mha.W_k, mha.W_v))
        h = ((q @ k.transpose(-2, -1) / scale).softmax(-1) @ v).clone()
        h[:, head] = 0
        return mha.W_o(mha_heads.combine_heads(h))

    def keep_only() -> Tensor:
        h = torch.zeros_like(heads)
        h[:, head] = heads[:, head]
        return mha.W_o(mha_heads.combine_heads(h))

    def other_widths() -> list[Tensor]:
        D = H * d_k
        return [out_with(zeroed((..., slice(head * w, (head + 1) * w)))) for w in range(1, D + 1)
                if D % w == 0 and w != d_k and head * w < D]

    return [
        ("nothing was silenced", lambda: full, "Zero head h's features [h*d_k, (h+1)*d_k) before W_o."),
        ("the head's queries were zeroed instead of its output (a head without queries still attends, "
         "uniformly, and still writes)",
         lambda: mha.W_o(mha_heads.combine_heads(_head_outputs(mha, x, zero_q=head))),
         "Zero what the head *writes*, its output after the attention (or its values), not its queries: "
         "heads[:, h] = 0 on the (B, H, L, d_k) outputs, before combine_heads and W_o."),
        ("the head's keys were zeroed instead of its output (it then attends uniformly, and still writes)",
         lambda: mha.W_o(mha_heads.combine_heads(_head_outputs(mha, x, zero_k=head))),
         "Zero what the head *writes*, its output after the attention, not its keys: heads[:, h] = 0."),
        ("the slice was zeroed after W_o", zero_after_w_o,
         "W_o mixes the heads: zero the head's slice *before* the output projection."),
        ("another head was silenced", lambda: [_silenced(mha, x, h) for h in range(H) if h != head],
         "Head h owns the features [h*d_k, (h+1)*d_k)."),
        ("the wrong axis was zeroed: a sequence of the batch (heads[h], axis 0) instead of a head (axis 1)",
         lambda: on_heads((head,)), "The outputs are (B, H, L, d_k): the head axis is 1, heads[:, h] = 0."),
        ("the wrong axis was zeroed: a position (heads[:, :, h], axis 2) instead of a head (axis 1)",
         lambda: on_heads((slice(None), slice(None), head)),
         "The outputs are (B, H, L, d_k): the head axis is 1, heads[:, h] = 0."),
        ("the wrong axis was zeroed: feature h of each head (heads[..., h], the last axis) instead of a head",
         lambda: on_heads((..., head)), "The outputs are (B, H, L, d_k): the head axis is 1, heads[:, h] = 0."),
        ("one feature was zeroed (concat[..., h]) instead of the head's d_k features",
         lambda: out_with(zeroed((..., head))),
         "Head h owns d_k features of the concatenation: concat[..., h*d_k:(h+1)*d_k] = 0."),
        ("the head's features were taken as interleaved (features h, h + H, ...) instead of side by side",
         lambda: out_with(zeroed((..., slice(head, None, H)))),
         "combine_heads puts the heads side by side: head h owns features [h*d_k, (h+1)*d_k)."),
        ("a position of the concatenated heads was zeroed (concat[:, h]) instead of the head's features",
         lambda: out_with(zeroed((slice(None), head))),
         "The concatenated heads are (B, L, H*d_k): the head's slice is on the last axis, "
         "concat[..., h*d_k:(h+1)*d_k]."),
        ("the scores were not scaled by 1/sqrt(d_k)", lambda: on_scores(1.0),
         "Divide the scores by sqrt(d_k) before the softmax, as the module does (or call "
         "scaled_dot_product_attention, which does it)."),
        ("the scores were divided by d_k instead of sqrt(d_k)", lambda: on_scores(float(d_k)),
         "Divide the scores by sqrt(d_k) (math.sqrt(d_k) or d_k ** 0.5), not by d_k."),
        ("W_o's bias was left out (concat @ W_o.weight.T without + W_o.bias)",
         lambda: out_with(zeroed((..., slice(head * d_k, (head + 1) * d_k)))) - mha.W_o.bias,
         "Apply the whole output projection, bias included: mha.W_o(concat), not concat @ mha.W_o.weight.T."),
        ("only head h was kept: the other heads were zeroed instead",
         keep_only,
         "Silence head h alone: zero its features [h*d_k, (h+1)*d_k) and keep every other head."),
        ("a slice of the wrong width was zeroed, as if the module had another number of heads (d_k taken from "
         "the example, not from the module)", other_widths,
         f"Read the sizes from the module: d_k = mha.d_k (here {d_k}, with {H} heads), not a number from the "
         "example."),
        ("the head's output was zeroed at the first position only",
         lambda: on_heads((slice(None), head, 0)), "Zero the head at every position: heads[:, h] = 0."),
        ("an earlier call's result came back (a result kept from call to call: the module's weights or the input "
         "changed since)", lambda: [t for t, _ in earlier],
         "Keep nothing from one call to the next: compute from this call's module and input, every time."),
    ]


def _which_heads(mha: nn.Module, x: Tensor, head: int, out: Tensor) -> str:
    """Where a wrong output differs, head by head: the output read back through ``W_o`` (invertible here)
    into the concatenated heads, compared with the right ones; "" when it can't be told."""
    try:
        W, b = mha.W_o.weight.double(), mha.W_o.bias.double()
        concat = torch.linalg.solve(W.T, out.double() - b, left=False)  # out = concat @ W.T + b
        right = _head_outputs(mha, x).double().clone()  # (B, H, L, d_k)
        right[:, head] = 0
        B, L, _ = concat.shape
        where = where_differs(concat.to(out.dtype).reshape(B, L, mha.num_heads, -1), right.transpose(1, 2),
                              dim=2, axis="head")
    except Exception:  # noqa: BLE001 - a hint only
        return ""
    if not where:
        return ""
    return f"; read back through W_o into the heads' outputs: {where} (head {head} should be all zeros)"


def check_head_ablation(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(mha, x, head) -> output``: self-attention of ``x (B, L, d_model)``
    through ``mha`` with head ``head``'s output set to zero just before ``W_o``, in ``x``'s dtype;
    the module left as it was found (mode, ``requires_grad``, hooks, weights)."""

    def body() -> str:
        g = gen(42)
        first = MultiHeadAttention(12, 3).double().train()  # training mode, gradients on: they must stay so
        second = MultiHeadAttention(8, 2).train()  # float32
        projections(first, g)
        projections(second, g)
        for p in second.W_q.parameters():
            p.requires_grad_(False)  # a frozen layer: requires_grad must come back as it was, not all True
        witness = first.W_q.register_forward_hook(lambda module, args, output: None)  # a hook of the caller's own
        cases = [  # (module, (B, L), head, reseed weights before, label)
            (first, (2, 5), 0, False, "3 heads, float64, B=2, L=5, head=0"),
            (first, (2, 5), 1, False, "3 heads, float64, B=2, L=5, head=1"),
            (first, (2, 5), 2, False, "3 heads, float64, B=2, L=5, head=2"),
            (first, (3, 7), 1, False, "3 heads, float64, another input: B=3, L=7, head=1"),
            (first, (3, 7), 1, True, "3 heads, float64, B=3, L=7, head=1, after the module's weights changed"),
            (second, (2, 6), 0, False, "2 heads, float32, a frozen W_q, B=2, L=6, head=0"),
            (second, (4, 3), 1, False, "2 heads, float32, a frozen W_q, B=4, L=3, head=1"),
        ]
        earlier: list[tuple[Tensor, str]] = []
        try:
            for mha, (B, L), head, reseed, label in cases:
                if reseed:
                    projections(mha, g)
                dtype = next(mha.parameters()).dtype
                x = randn(g, B, L, mha.d_model, dtype=dtype)
                (arg,) = cloned(x)
                kinds = {n: (p.dtype, p.device) for n, p in mha.named_parameters()}
                try:
                    out = call_leaving_model_alone(fn, mha, arg, head, what=f"your function ({label})",
                                                   forbidden=[mha_heads.silence_heads.__wrapped__])
                    moved = [n for n, p in mha.named_parameters() if (p.dtype, p.device) != kinds[n]]
                    if moved:
                        p = dict(mha.named_parameters())[moved[0]]
                        raise fail(f"your function changed the module's dtype or device ({label}): {moved[0]} was "
                                   f"{kinds[moved[0]][0]} on {kinds[moved[0]][1]}, it is now {p.dtype} on {p.device}",
                                   "module.double(), .float() and .to(...) change the module itself, in place: "
                                   "leave it as it is, and compute in x's dtype.")
                except Verdict as verdict:
                    if "left a hook registered" in verdict.message:
                        raise fail(f"{HOOK_LEFT} ({label})", verdict.hint) from None
                    if "changed the model's parameters" in verdict.message:
                        raise fail(f"your function changed the module's weights ({label})",
                                   "Silence the head on the way through (zero its slice of the concatenated heads), "
                                   "leaving the weights as they are.") from None
                    raise
                check_unchanged(["x"], [x], [arg], "your function")
                _one_tensor(out, f"your function ({label})", "output")
                with torch.no_grad():
                    expected = _silenced(mha, x, head)
                    if isinstance(out, Tensor) and earlier and out.shape != x.shape \
                            and any(out.shape == t.shape for t, _ in earlier):
                        raise fail(f"the output ({label}) has the shape {tuple(out.shape)} of an earlier call's, for "
                                   f"an input {tuple(x.shape)}: it looks like a result kept from an earlier call",
                                   "Keep nothing from one call to the next (no cache keyed on some arguments only): "
                                   "compute from this call's module and input, every time.")
                    out = expect_tensor(out, f"the output ({label})", x.shape, dtype=dtype, explain=" (B, L, d_model)")
                    if not close(out, expected):
                        verdict = diagnose(out, _head_ablation_mistakes(mha, x, head, earlier),
                                           f"wrong output ({label})", HEAD_ABLATION_DEFINITION, expected=expected,
                                           dim=-2, axis="position")
                        if "it looks like" not in verdict.message:
                            verdict.message += _which_heads(mha, x, head, out)
                        raise verdict
                earlier.append((out, label))
        finally:
            witness.remove()
        with torch.no_grad():
            check_device_care(fn, on_meta(first), on_meta(randn(g, 2, 5, 12)), 1, what="your function",
                              hint="Make the head's mask (or zeros) on the input's device: "
                                   "torch.ones(..., device=x.device), or multiply the slice by 0 in place of a mask.")
        return (f"correct in {len(cases)} calls (each of the 3 heads, other lengths, changed weights, float32 and "
                "float64), the module left as it was, and on another device")

    return run_check("head ablation", body)
