"""Check for exercise 7.3 (chapter 07): mean- and resample-ablation of heads at ``<cls>``.

The reference is :mod:`mha_lib.sentiment.attribution`'s own: each head's output at ``<cls>`` as
``W_o`` receives it (read with a forward pre-hook, in evaluation mode) and
:func:`~mha_lib.sentiment.attribution.replace_heads`. The models are small untrained
``SentimentClassifier`` s with seeded weights (:mod:`._sentiment`), handed over in training mode,
with dropout and gradients on; one already carries a hook of its own and one has frozen parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..sentiment import attribution as _attribution
from ._core import (CheckResult, Mistake, check_device_care, close, diagnose, expect_tensor, fail, on_meta,
                    run_check)
from ._sentiment import call_leaving_model_alone, seeded_model, sentences

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


@torch.no_grad()
def outputs(model: nn.Module, tokens: Tensor) -> Tensor:
    """``(N, L, H, d_k)``: every head's output at every position, as ``W_o`` receives it, in evaluation mode."""
    attention = model.layers[0].self_attn
    got: list[Tensor] = []
    handle = attention.W_o.register_forward_pre_hook(lambda module, args: got.append(args[0].detach()))
    was_training = model.training
    model.eval()
    try:
        model(tokens)
    finally:
        handle.remove()
        model.train(was_training)
    N, L, _ = got[0].shape
    return got[0].view(N, L, model.num_heads, -1)


@torch.no_grad()
def logits_with(model: nn.Module, tokens: Tensor, heads: Sequence[int], values: Tensor | None,
                after: bool = False) -> Tensor:
    """The logits with the heads' outputs at ``<cls>`` set to ``values`` (``(len(heads), d_k)`` or
    ``(B, len(heads), d_k)``) before ``W_o`` (the library's ``replace_heads``), or, with ``after``,
    the heads' slices of ``W_o``'s output; ``values=None``: the intact model."""
    was_training = model.training
    model.eval()
    try:
        if values is None:
            return model(tokens)
        if not after:
            with _attribution.replace_heads(model, list(heads), values):
                return model(tokens)
        H = model.num_heads

        def swap(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            out = output.clone()
            at_cls = out[:, 0].view(out.size(0), H, -1)
            at_cls[:, list(heads)] = values.to(out.dtype)
            return out

        handle = model.layers[0].self_attn.W_o.register_forward_hook(swap)
        try:
            return model(tokens)
        finally:
            handle.remove()
    finally:
        model.train(was_training)


def _after_w_o(model: nn.Module, reference: Tensor) -> Tensor:
    """``(M, H, d_k)``: the heads' slices of ``W_o``'s output at ``<cls>`` on the reference sentences."""
    concat = outputs(model, reference)[:, 0].flatten(1)  # (M, H * d_k)
    with torch.no_grad():
        return model.layers[0].self_attn.W_o(concat).view(concat.size(0), model.num_heads, -1)


def _draw(generator_state: Tensor, high: int, size: tuple[int, ...]) -> Tensor:
    g = torch.Generator()
    g.set_state(generator_state)
    return torch.randint(high, size, generator=g)


def _mistakes(model: nn.Module, tokens: Tensor, heads: list[int], how: str, reference: Tensor, ref_real: Tensor,
              state: Tensor, seed: int) -> list[Mistake]:
    B, M, H = tokens.size(0), reference.size(0), model.num_heads
    everyone = list(range(H))
    ref, own = outputs(model, reference), outputs(model, tokens)  # (M, L', H, d_k), (B, L, H, d_k)
    cls_ref = ref[:, 0]  # (M, H, d_k)
    pick = _draw(state, M, (B,))
    with_values = lambda values, who=heads, after=False: lambda: logits_with(model, tokens, who, values, after)  # noqa: E731
    real = ref_real.to(ref.dtype)[:, :, None, None]  # (M, L', 1, 1)
    common: list[Mistake] = [
        ("nothing was replaced (these are the intact model's logits)", with_values(None),
         "Run the model *while* the hook is registered (inside the `with` block or before handle.remove()), and "
         "write into W_o's input at position 0 (<cls>): in a one-layer model a replacement at any other position "
         "never reaches the classifier."),
        ("zero-ablation (the heads' outputs set to zero)",
         with_values(torch.zeros(len(heads), cls_ref.size(-1), dtype=cls_ref.dtype)),
         "Write the heads' mean output (how='mean') or a reference sentence's output (how='resample'), not zeros."),
    ]
    if how == "mean":
        mean = cls_ref[:, heads].mean(0)  # (len(heads), d_k)
        specific: list[Mistake] = [
            ("every head was replaced, not only those in `heads`", with_values(cls_ref.mean(0), everyone),
             "Replace only the heads listed in `heads`; the others keep their own outputs."),
            ("a sum over the reference sentences instead of their mean", with_values(cls_ref[:, heads].sum(0)),
             "Divide by the number of reference sentences: .mean(dim=0) of the (M, len(heads), d_k) outputs."),
            ("the mean was taken over the evaluated sentences (`tokens`), not over the reference sentences",
             with_values(own[:, 0, heads].mean(0)),
             "The mean comes from the reference sentences (the training sentences in the notebook), the same "
             "value for every evaluated sentence: read the heads' outputs on `reference`."),
            ("the mean over every position, padding included, instead of the outputs at <cls>",
             lambda: [with_values(ref[:, :, heads].mean((0, 1)))(),
                      with_values(own[:, :, heads].mean((0, 1)))()],
             "Only position 0 (<cls>) reaches the classifier: average the heads' outputs at position 0 over the "
             "reference sentences, [:, 0]; padded positions are not even words."),
            ("the mean over every word of the reference sentences (padding left out), not only <cls>",
             with_values((ref[:, :, heads] * real).sum((0, 1)) / real.sum((0, 1))),
             "Only position 0 (<cls>) reaches the classifier: average over the reference sentences at position 0."),
            ("the mean was taken over the wrong axis (over the d_k features, one number per head)",
             with_values(cls_ref[:, heads].mean(-1, keepdim=True).mean(0).expand(len(heads), cls_ref.size(-1))),
             "Average over the sentences (dim 0 of (M, H, d_k)), keep each head's d_k features."),
            ("the mean was taken over the heads too (one vector for every head)",
             lambda: [with_values(cls_ref.mean((0, 1)).expand(len(heads), -1))(),
                      with_values(cls_ref[:, heads].mean((0, 1)).expand(len(heads), -1))()],
             "Average over the sentences only (dim 0 of (M, H, d_k)): each head keeps its own mean."),
            ("the heads' slices were replaced after W_o (in its output) instead of before it",
             with_values(_after_w_o(model, reference)[:, heads].mean(0), after=True),
             "W_o mixes every head into every output feature: replace the head's slice of W_o's *input* (a forward "
             "pre-hook on W_o), not of its output."),
            ("resample-ablation (one reference sentence per evaluated sentence) instead of the mean",
             with_values(cls_ref[pick][:, heads]), "how='mean' writes the same mean vector for every sentence."),
        ]
    else:
        specific = [
            ("every head was replaced, not only those in `heads`", with_values(cls_ref[pick], everyone),
             "Replace only the heads listed in `heads`; the others keep their own outputs."),
            ("no shuffle: sentence b took reference sentence b", with_values(cls_ref[torch.arange(B) % M][:, heads]),
             "Draw the reference sentences at random: pick = torch.randint(M, (B,), generator=generator)."),
            ("the resampled outputs came from the evaluated sentences (`tokens`), not the reference sentences",
             lambda: [with_values(own[:, 0][_draw(state, B, (B,))][:, heads])(),
                      with_values(own[:, 0][pick % B][:, heads])()],
             "Draw among the reference sentences (pick in [0, M)) and read the heads' outputs on `reference`."),
            ("a different reference sentence for each head (one draw per head)",
             lambda: _per_head(model, tokens, heads, cls_ref, state, M, B),
             "Draw once per call: pick = torch.randint(M, (B,), generator=generator); every head in `heads` takes "
             "its output on the same reference sentence pick[b], a whole report about one other sentence."),
            ("a permutation (torch.randperm) instead of torch.randint",
             lambda: with_values(cls_ref[_permutation(state, M)[:B]][:, heads])(),
             "Draw with replacement, as the exercise says: pick = torch.randint(M, (B,), generator=generator), the "
             "draw every resampled model is compared with."),
            ("one reference sentence for the whole batch", with_values(cls_ref[_draw(state, M, (1,))[0]][heads]),
             "One reference sentence per evaluated sentence: pick = torch.randint(M, (B,), generator=generator)."),
            ("the mean of the reference outputs instead of a resampled one", with_values(cls_ref[:, heads].mean(0)),
             "how='resample' writes, for sentence b, the heads' outputs on reference sentence pick[b]."),
            ("the generator was re-seeded inside your function",
             lambda: [with_values(cls_ref[torch.randint(M, (B,), generator=torch.Generator().manual_seed(s))]
                                  [:, heads])() for s in sorted({seed, 0})],
             "Use the generator as it is handed to you (it may have drawn numbers before): no manual_seed, and "
             "no torch.Generator() of your own."),
            ("the heads' slices were replaced after W_o (in its output) instead of before it",
             with_values(_after_w_o(model, reference)[pick][:, heads], after=True),
             "W_o mixes every head into every output feature: replace the head's slice of W_o's *input* (a forward "
             "pre-hook on W_o), not of its output."),
        ]
    return common + specific


def _permutation(state: Tensor, M: int) -> Tensor:
    g = torch.Generator()
    g.set_state(state)
    return torch.randperm(M, generator=g)


def _per_head(model: nn.Module, tokens: Tensor, heads: list[int], cls_ref: Tensor, state: Tensor, M: int,
              B: int) -> list[Tensor]:
    g = torch.Generator()
    g.set_state(state)
    one_by_one = torch.stack([torch.randint(M, (B,), generator=g) for _ in heads], 1)  # (B, len(heads))
    at_once = _draw(state, M, (B, len(heads)))
    transposed = _draw(state, M, (len(heads), B)).T
    who = torch.tensor(heads)
    return [logits_with(model, tokens, heads, cls_ref[picks, who]) for picks in (one_by_one, at_once, transposed)]


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
            (second, [0], "resample", 8, 5, 35, "2 heads, float32, evaluation mode, head [0], resample"),
            (second, [1], "mean", 5, 12, 36, "2 heads, float32, evaluation mode, head [1], mean"),
        ]
        try:
            for number, (model, heads, how, B, M, seed, label) in enumerate(cases):
                _, tokens, _ = sentences(B, seed)
                _, reference, ref_real = sentences(M, seed + 100)
                g = torch.Generator().manual_seed(seed)
                torch.randint(7, (3,), generator=g)  # the generator has drawn before: its state is not fresh
                state = g.get_state()
                given = [tokens.clone(), list(heads), how, reference.clone()]
                out = call_leaving_model_alone(fn, model, *given, g, what=f"your function ({label})",
                                               forbidden=FORBIDDEN)
                if not torch.equal(given[0], tokens) or not torch.equal(given[3], reference) or given[1] != heads:
                    raise fail(f"your function changed its inputs in place ({label})",
                               "Leave `tokens`, `heads` and `reference` as they are; compute new tensors.")
                what = f"the logits ({label})"
                out = expect_tensor(out, what, (B, 2), dtype=next(model.parameters()).dtype, explain=" (B, 2)")
                if how == "mean":
                    expected = logits_with(model, tokens, heads, outputs(model, reference)[:, 0, heads].mean(0))
                else:
                    pick = _draw(state, M, (B,))
                    expected = logits_with(model, tokens, heads, outputs(model, reference)[pick][:, 0, heads])
                if not close(out, expected):
                    mistakes = _mistakes(model, tokens, heads, how, reference, ref_real, state, seed)
                    verdict = diagnose(out, mistakes, f"wrong logits ({label})", DEFINITION, expected=expected, dim=0,
                                       axis="sentence")
                    if how == "resample" and torch.equal(g.get_state(), state) and "it looks like" not in verdict.message:
                        raise fail(f"wrong logits ({label}): your function never drew from the generator passed in",
                                   "Draw with it: pick = torch.randint(M, (B,), generator=generator), not from "
                                   "PyTorch's global generator.")
                    raise verdict
                if number == 1:
                    g2 = torch.Generator()
                    g2.set_state(state)
                    again = call_leaving_model_alone(fn, model, tokens.clone(), list(heads), how, reference.clone(),
                                                     g2, what=f"your function ({label}, called a second time)")
                    if not isinstance(again, Tensor) or not close(again.detach(), out):
                        raise fail(f"a second call with a generator in the same state gave other logits ({label}): "
                                   "something your function changes stays changed",
                                   "Leave the model as you found it, and draw only from the generator passed in.")
        finally:
            witness.remove()
        _, tokens, _ = sentences(4, 37)
        _, reference, _ = sentences(6, 137)
        for how in ("mean", "resample"):
            with torch.no_grad():
                check_device_care(fn, on_meta(first), on_meta(tokens), [0, 2], how, on_meta(reference),
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
