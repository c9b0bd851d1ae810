"""Check for exercise 7.3 (chapter 07): mean- and resample-ablation of heads at ``<cls>``.

The reference is :mod:`mha_lib.sentiment.attribution`'s own: each head's output at ``<cls>`` as
``W_o`` receives it (read with a forward pre-hook, in evaluation mode) and
:func:`~mha_lib.sentiment.attribution.replace_heads`. The models are small untrained
``SentimentClassifier`` s with seeded weights (:mod:`._sentiment`), handed over in training mode,
with dropout and gradients on; one already carries a hook of its own and one has frozen parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..sentiment import attribution as _attribution
from ._ablated_mistakes import draw, logits_with, mistakes, named_draw, outputs
from ._core import CheckResult, Verdict, close, diagnose, expect_tensor, fail, on_meta, run_check
from ._sentiment import call_leaving_model_alone, device_and_grad_care, explain, seeded_model, sentences

DEFINITION = ("Read each head's output at <cls> (position 0 of W_o's input, head h in features [h*d_k, (h+1)*d_k)) "
              "on the reference sentences, in evaluation mode; then run the model on `tokens` with a forward pre-hook "
              "on W_o that writes, at position 0, for each head in `heads`: the mean over the reference sentences "
              "(how='mean'), or the output on reference sentence pick[b] for sentence b, with pick = "
              "torch.randint(M, (B,), generator=generator) drawn once (how='resample').")
FORBIDDEN = [_attribution.ablated_accuracy.__wrapped__, _attribution.replace_heads.__wrapped__,
             _attribution.head_outputs.__wrapped__]
DEVICE_HINT = ("Make what you create on the model's device (torch.zeros(..., device=tokens.device)), and move the "
               "drawn indices there: pick = torch.randint(M, (B,), generator=generator).to(tokens.device) (draw on "
               "the CPU, with the CPU generator).")


def check_ablated_logits(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(model, tokens, heads, how, reference, generator) -> (B, 2)``: the logits of a one-layer
    ``SentimentClassifier`` on ``tokens (B, L)`` with each head in ``heads`` replaced at ``<cls>``, just
    before ``W_o``, by its mean output at ``<cls>`` over ``reference (M, L')`` (``how="mean"``) or by its
    output on reference sentence ``pick[b]``, ``pick = torch.randint(M, (B,), generator=generator)``
    (``how="resample"``), computed in evaluation mode; the model's dtype kept, the model left as it was."""

    def body() -> str:
        first = seeded_model(31, num_heads=3, d_model=12, d_ff=16, dtype=torch.float64)
        second = seeded_model(32, num_heads=2, d_model=8, d_ff=12, dtype=torch.float32).eval()
        for p in second.token_embedding.parameters():
            p.requires_grad_(False)  # a frozen embedding: requires_grad must come back as it was, not all True
        witness = first.layers[0].self_attn.W_o.register_forward_pre_hook(lambda module, args: None)
        cases = [  # (model, heads, how, B, M, seed, label)
            (first, [1], "mean", 7, 11, 33, "3 heads, float64, training mode, head [1], mean"),
            (first, [0, 2], "resample", 6, 9, 34, "3 heads, float64, heads [0, 2], resample, a hook of its own on W_o"),
            (first, [1], "mean", 7, 8, 38, "3 heads, float64, head [1], mean again, other sentences"),
            (second, [0], "resample", 8, 5, 35, "2 heads, float32, evaluation mode, head [0], resample"),
            (second, [1], "mean", 5, 12, 36, "2 heads, float32, evaluation mode, head [1], mean"),
        ]
        seen: set[int] = set()
        try:
            for number, (model, heads, how, B, M, seed, label) in enumerate(cases):
                _, tokens, _ = sentences(B, seed)
                _, reference, ref_real = sentences(M, seed + 100)
                g = torch.Generator().manual_seed(seed)
                torch.randint(7, (3,), generator=g)  # the generator has drawn before: its state is not fresh
                state = g.get_state()
                if how == "mean":
                    expected = logits_with(model, tokens, heads, outputs(model, reference)[:, 0, heads].mean(0))
                else:
                    pick = draw(state, M, (B,))
                    expected = logits_with(model, tokens, heads, outputs(model, reference)[pick][:, 0, heads])

                def fresh(tokens: Tensor = tokens, heads: list[int] = heads, how: str = how,
                          reference: Tensor = reference, state: Tensor = state) -> list[Any]:
                    again = torch.Generator()
                    again.set_state(state)
                    return [tokens.clone(), list(heads), how, reference.clone(), again]

                def right(out: Any, expected: Tensor = expected) -> bool:
                    return isinstance(out, Tensor) and out.shape == expected.shape and close(out.detach(), expected)

                used_before, _ = id(model) in seen, seen.add(id(model))
                try:
                    given = [tokens.clone(), list(heads), how, reference.clone()]
                    out = call_leaving_model_alone(fn, model, *given, g, what=f"your function ({label})",
                                                   forbidden=FORBIDDEN)
                except Verdict as verdict:
                    if verdict.status == "error":
                        raise explain(verdict, fn, model, fresh, right, used_before=used_before, label=label) from None
                    raise
                if not torch.equal(given[0], tokens) or not torch.equal(given[3], reference) or given[1] != heads:
                    raise fail(f"your function changed its inputs in place ({label})",
                               "Leave `tokens`, `heads` and `reference` as they are; compute new tensors.")
                what = f"the logits ({label})"
                out = expect_tensor(out, what, (B, 2), dtype=next(model.parameters()).dtype, explain=" (B, 2)")
                if not close(out, expected):
                    verdict = diagnose(out, mistakes(model, tokens, heads, how, reference, ref_real, state, seed),
                                       f"wrong logits ({label})", DEFINITION, expected=expected, dim=0, axis="sentence")
                    if "it looks like" not in verdict.message:
                        verdict = explain(verdict, fn, model, fresh, right, used_before=used_before, label=label)
                    if how == "resample" and "it looks like" not in verdict.message:
                        if torch.equal(g.get_state(), state):
                            raise fail(f"wrong logits ({label}): your function never drew from the generator passed "
                                       "in", "Draw with it: pick = torch.randint(M, (B,), generator=generator), not "
                                       "from PyTorch's global generator.")
                        drawn = named_draw(model, tokens, heads, reference, state, out, label)
                        if drawn:
                            raise fail(drawn, "Draw once, with the generator as it is handed to you: pick = "
                                       "torch.randint(M, (B,), generator=generator); nothing else drawn from it.")
                    raise verdict
                if number == 1:
                    again = call_leaving_model_alone(fn, model, *fresh(), what=f"your function ({label}, called a "
                                                     "second time)")
                    if not isinstance(again, Tensor) or not close(again.detach(), out):
                        raise fail(f"a second call with a generator in the same state gave other logits ({label}): "
                                   "something your function changes stays changed",
                                   "Leave the model as you found it, and draw only from the generator passed in.")
        finally:
            witness.remove()
        _, tokens, _ = sentences(4, 37)
        _, reference, _ = sentences(6, 137)
        for how in ("mean", "resample"):
            device_and_grad_care(fn, on_meta(first), on_meta(tokens), [0, 2], how, on_meta(reference),
                                 torch.Generator().manual_seed(0), what=f"your function (how={how!r})",
                                 hint=DEVICE_HINT)
        return ("right for mean and resample on 2 untrained models (2 and 3 heads, float32 and float64, one head and "
                "two), twice with the same draw, and on another device; the models are left as they were")

    def on_one_thread() -> str:  # models this small run many times faster on one thread of a busy CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return body()
        finally:
            torch.set_num_threads(threads)

    return run_check("mean- and resample-ablation", on_one_thread)
