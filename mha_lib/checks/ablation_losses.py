"""Check for exercise 8.3 (chapter 08): the loss of a model with each head silenced in turn.

The references are :mod:`mha_lib.induction`'s own ``losses`` and ``silence_heads``. The models
are small *untrained* ``AttentionOnlyTransformer`` s with seeded weights: the function's
correctness doesn't depend on training, and so the check is fast and the same on every machine.
The models are handed over in training mode (one in evaluation mode) with gradients on, and the
learner's function must leave the model as it found it (no hook, its mode, ``requires_grad``, the same
parameters, gradients on).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..heads import silence_heads
from ..induction.data import RepeatBatch, repeated_segments
from ..induction.model import AttentionOnlyTransformer
from ..induction.train import losses
from ._core import (CheckResult, Mistake, Verdict, check_unchanged, close, diagnose, expect_tensor, fail, gen, randn,
                    run_check)
from ._sentiment import call_leaving_model_alone
from .head_scores import copy_batch, expect_score_dtype


def _untrained_model(seed: int, V: int, D: int, H: int, layers: int, L: int, positions: str,
                     dtype: torch.dtype) -> AttentionOnlyTransformer:
    """A small attention-only model with seeded random weights, large enough that every head matters."""
    torch.manual_seed(seed)
    model = AttentionOnlyTransformer(V, d_model=D, num_heads=H, num_layers=layers, max_len=L, positions=positions)
    g = gen(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embedding" in name:
                p.copy_(randn(g, *p.shape))
            elif p.dim() > 1:
                p.copy_(randn(g, *p.shape, scale=(1.0 if name.startswith("unembed") else 1.5) * p.shape[1] ** -0.5))
            else:
                p.copy_(randn(g, *p.shape, scale=0.2))
    return model.to(dtype).eval()


def _predictable_loss(logits: Tensor, batch: RepeatBatch, shift: int = 1) -> Tensor:
    """Cross-entropy on the predictable tokens, position ``t - shift`` predicting token ``t``."""
    V = logits.size(-1)
    if shift == 1:
        return losses(logits, batch)[1]
    if shift == 0:
        return F.cross_entropy(logits[batch.predictable].reshape(-1, V), batch.tokens[batch.predictable])
    return F.cross_entropy(logits[:, 1:][batch.predictable[:, :-1]], batch.tokens[:, :-1][batch.predictable[:, :-1]])


def _ablated(model: AttentionOnlyTransformer, batch: RepeatBatch, silenced: Callable[[int, int], list[tuple[int, list[int]]]],
             loss: Callable[[Tensor], Tensor]) -> Tensor:
    """``(num_layers, H)``: ``loss(logits)`` with the heads that ``silenced(l, h)`` names switched off."""
    rows = []
    with torch.no_grad():
        for l in range(model.num_layers):
            row = []
            for h in range(model.num_heads):
                with ExitStack() as stack:
                    for layer, heads in silenced(l, h):
                        stack.enter_context(silence_heads(model.layers[layer], heads))
                    row.append(loss(model(batch.tokens)))
            rows.append(torch.stack(row))
    return torch.stack(rows)


ABLATION_DEFINITION = ("Entry [l, h] is the mean cross-entropy on the predictable tokens, "
                       "mha_lib.induction.losses(logits, batch)[1], of the model's logits computed inside "
                       "`with silence_heads(model.layers[l], [h]):`.")


def _call_leaving_model_alone(fn: Callable[..., Any], model: AttentionOnlyTransformer, batch: RepeatBatch,
                              what: str) -> Any:
    """Call ``fn(model, batch)`` with :func:`._sentiment.call_leaving_model_alone` (grad mode, hooks, mode of every
    module, ``requires_grad``, parameters, ``.grad``); fail if it changed the batch too."""
    given = copy_batch(batch)
    try:
        out = call_leaving_model_alone(fn, model, given, what=what)
    except Verdict as verdict:
        if "left a hook registered" in verdict.message:
            raise fail("your function left a hook on the model: every later forward pass still silences a head",
                       "Silence inside `with silence_heads(model.layers[l], [h]):`; the hook is removed when the block "
                       "ends, also after an error.") from None
        if "changed the model's parameters" in verdict.message:
            raise fail("your function changed the model's parameters",
                       "Silence a head on the way through (silence_heads adds a hook and removes it) instead of "
                       "zeroing weights.") from None
        raise
    check_unchanged(["batch.tokens", "batch.predictable"], [batch.tokens, batch.predictable],
                    [given.tokens, given.predictable], "your function")
    return out


def check_ablation_losses(fn: Callable[[AttentionOnlyTransformer, RepeatBatch], Any]) -> CheckResult:
    """Check ``fn(model, batch) -> (num_layers, H)``: entry ``[l, h]`` is the loss on the
    predictable tokens (``mha_lib.induction.losses(logits, batch)[1]``) with head ``h`` of layer
    ``l`` silenced (``silence_heads(model.layers[l], [h])``); the model is left as it was found
    (no hook, its mode, ``requires_grad``, same parameters, gradients on), a second call gives the same, and a
    third after the weights change gives the new model's losses."""

    def body() -> str:
        cases = [
            dict(seed=81, V=12, D=12, H=3, layers=2, L=16, B=8, segment=(3, 6), positions="learned", dtype=torch.float32),
            dict(seed=82, V=10, D=8, H=2, layers=2, L=12, B=6, segment=(2, 5), positions="rotary", dtype=torch.float64),
            dict(seed=83, V=9, D=8, H=2, layers=3, L=14, B=5, segment=(3, 7), positions="sinusoidal", dtype=torch.float32),
        ]
        calls = 0
        for number, c in enumerate(cases):
            model = _untrained_model(c["seed"], c["V"], c["D"], c["H"], c["layers"], c["L"], c["positions"], c["dtype"])
            if number != 1:
                model.train()  # handed over in training mode, gradients on: both must come back as they were
            else:
                for p in model.token_embedding.parameters():
                    p.requires_grad_(False)  # a frozen embedding: requires_grad must come back as it was, not all True
            batch = repeated_segments(c["B"], c["L"], c["V"], c["segment"], generator=gen(c["seed"]))
            layers, H = c["layers"], c["H"]
            label = f"a {layers}-layer model with {H} heads per layer, {str(c['dtype']).replace('torch.', '')}"
            expected = _ablated(model, batch, lambda l, h: [(l, [h])], lambda z: losses(z, batch)[1])
            with torch.no_grad():
                intact = losses(model(batch.tokens), batch)[1]
            out = _call_leaving_model_alone(fn, model, batch, f"your function ({label})")
            calls += 1
            what = f"the losses for {label}"
            if isinstance(out, Tensor) and tuple(out.shape) == (H, layers) and H != layers:
                raise fail(f"{what} have shape {(H, layers)}: transposed, expected (num_layers, H) = {(layers, H)}",
                           "One row per layer, one column per head: out[l, h].")
            if isinstance(out, Tensor) and tuple(out.shape) == (layers * H,):
                raise fail(f"{what} have shape {(layers * H,)}, expected (num_layers, H) = {(layers, H)}",
                           "One row per layer: torch.stack the rows, or .reshape(num_layers, H).")
            if isinstance(out, Tensor) and tuple(out.shape) == (2, 4) and (layers, H) != (2, 4):
                raise fail(f"{what} have shape (2, 4), the shipped model's (2 layers, 4 heads), expected "
                           f"(num_layers, H) = {(layers, H)}: it looks like the sizes were typed in",
                           "Read the sizes from the model: for layer in model.layers, for h in range(layer.num_heads) "
                           "(or len(model.layers) and model.num_heads).")
            expect_score_dtype(out, c["dtype"], what, of="a model",
                               build="torch.stack the loss tensors into rows, and the rows into a table.")
            out = expect_tensor(out, what, (layers, H), dtype=c["dtype"], explain=" (num_layers, H)")
            if not close(out, expected):
                shown = "; ".join(", ".join(f"{v:.3f}" for v in row) for row in out.double().tolist())
                raise diagnose(out, _ablation_mistakes(model, batch, expected, intact),
                               f"wrong losses for {label} (yours: {shown})", ABLATION_DEFINITION)
            if number == 0:
                again = _call_leaving_model_alone(fn, model, batch, f"your function ({label}, called a second time)")
                calls += 1
                if not isinstance(again, Tensor) or not close(again.detach(), out):
                    raise fail(f"a second call on the same model gave other losses ({label}): something your "
                               "function changes stays changed", "Leave the model as you found it.")
                # the same model with other weights, and another batch of the same shape: nothing may be remembered
                fresh = _untrained_model(c["seed"] + 10, c["V"], c["D"], c["H"], c["layers"], c["L"], c["positions"],
                                         c["dtype"])
                with torch.no_grad():
                    for p, q in zip(model.parameters(), fresh.parameters()):
                        p.copy_(q)
                other = repeated_segments(c["B"], c["L"], c["V"], c["segment"], generator=gen(c["seed"] + 10))
                expected = _ablated(model, other, lambda l, h: [(l, [h])], lambda z: losses(z, other)[1])
                third = _call_leaving_model_alone(fn, model, other, f"your function ({label}, after its weights "
                                                  "changed, on another batch)")
                calls += 1
                if isinstance(third, Tensor) and third.shape == out.shape and close(third.detach(), out) \
                        and not close(expected, out):
                    raise fail(f"after the model's weights changed and on another batch ({label}), your function "
                               "returned the losses of the earlier call: it looks like a result kept from call to "
                               "call", "Keep nothing from one call to the next (no cache keyed on the model or on "
                               "shapes): compute from this call's model and batch, every time.")
                third = expect_tensor(third, what, (layers, H), dtype=c["dtype"], explain=" (num_layers, H)")
                if not close(third, expected):
                    raise fail(f"wrong losses for {label} after its weights changed, on another batch (right the first "
                               "time): something from an earlier call stays", "Compute from this call's model and "
                               "batch, every time.")
        return (f"right for {len(cases)} untrained models (2 and 3 layers, 2 and 3 heads, float32 and float64, "
                f"training and evaluation mode) in {calls} calls (twice on the same model, again after its weights "
                "changed); the model is left as it was")

    def on_one_thread() -> str:  # models this small run many times faster on one thread of a busy CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return body()
        finally:
            torch.set_num_threads(threads)

    return run_check("ablation losses", on_one_thread)


def _ablation_mistakes(model: AttentionOnlyTransformer, batch: RepeatBatch, expected: Tensor,
                       intact: Tensor) -> list[Mistake]:
    H = model.num_heads

    def each(silenced: Callable[[int, int], list[tuple[int, list[int]]]], shift: int = 1, which: int = 1):
        if which == 1:
            return lambda: _ablated(model, batch, silenced, lambda z: _predictable_loss(z, batch, shift))
        return lambda: _ablated(model, batch, silenced, lambda z: losses(z, batch)[which])

    one = lambda l, h: [(l, [h])]  # noqa: E731
    return [
        ("the increase over the intact model's loss, not the loss itself",
         lambda: [expected - intact, intact - expected],
         "Return the loss with the head silenced; compare it with the intact model's loss afterwards, in the "
         "notebook."),
        ("nothing was silenced (every entry is the intact model's loss)", lambda: intact.expand_as(expected),
         "Compute the logits *inside* `with silence_heads(model.layers[l], [h]):`."),
        ("each entry silences the whole layer", each(lambda l, h: [(l, list(range(H)))]),
         "Silence one head at a time: silence_heads(model.layers[l], [h]), a list holding only h."),
        ("the silenced heads added up: entry [l, h] silences heads 0 ... h of layer l together, not head h alone",
         each(lambda l, h: [(l, list(range(h + 1)))]),
         "Silence one head at a time, with a fresh list each time: silence_heads(model.layers[l], [h]) (a list "
         "that grows as the loop goes silences more and more heads)."),
        ("every row silences the heads of layer 0 (model.layers[0] instead of model.layers[l])",
         each(lambda l, h: [(0, [h])]), "Row l silences the heads of model.layers[l]."),
        ("the loss over all tokens, not only the predictable ones", each(one, which=0),
         "Only the predictable tokens tell whether the model copies: losses(logits, batch)[1]."),
        ("the loss over the unpredictable tokens", each(one, which=2),
         "losses(logits, batch) returns (all, predictable, other): take [1]."),
        ("the logits at the wrong position: logits[:, t] scored against token t, not t + 1",
         lambda: [each(one, shift=0)(), each(one, shift=-1)()],
         "Position t predicts token t + 1: score logits[:, :-1] against tokens[:, 1:] (losses(logits, batch) does)."),
        ("the rows and columns are swapped (entry [h, l])", lambda: expected.T,
         "One row per layer, one column per head: out[l, h]."),
    ]
