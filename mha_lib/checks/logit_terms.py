"""Check for exercise 7.4 (chapter 07): direct logit attribution whose terms add up to the logit
difference.

The reference is :func:`mha_lib.sentiment.attribution.logit_attribution`. The models are small
untrained ``SentimentClassifier`` s with seeded weights (:mod:`._sentiment`) whose LayerNorm gains and
biases, classifier bias and ``W_o`` bias are far from 1 and 0, so that forgetting any of them shows;
handed over in training mode, with dropout and gradients on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ..sentiment import attribution as _attribution
from ._core import CheckResult, close, expect_tensor, fail, float32_close, on_meta, run_check, where_differs
from ._logit_mistakes import mistakes as _mistakes
from ._logit_mistakes import named_constant, parts_of
from ._result import ERROR, Verdict
from ._sentiment import VOCAB, call_leaving_model_alone, device_and_grad_care, explain, seeded_model, sentences

DEFINITION = ("x = <cls>'s vector after the layer = embedding (token + position 0) + one term per head (its output at "
              "<cls> through its slice of W_o, no bias) + W_o's bias + the feed-forward output. With w = classifier "
              "row 1 - row 0, gamma = model.norm.weight and sigma = sqrt(x.var(unbiased=False) + eps) frozen, term t "
              "gives w . (gamma * (t - mean(t)) / sigma), and 'constant' = w . beta + (b_1 - b_0).")
DEVICE_HINT = ("Make every tensor you create on the model's device (device=tokens.device): a +-1 vector for the "
               "logit difference, a position index torch.zeros(1, dtype=torch.long, device=tokens.device).")


_ABOUT = ("'embedding', 'head 0' ... 'head H-1', 'W_o bias', 'feed-forward' and 'constant'")


def _named(out: dict[str, Tensor], model: nn.Module, tokens: Tensor, message: str) -> Verdict | None:
    """The known mistake that reproduces every term of ``out`` (``'constant'`` aside), if any."""
    for name, compute, hint in _mistakes(model, tokens):
        try:
            candidates = compute()
        except Exception:  # noqa: BLE001 - a mistake that can't happen here
            continue
        for candidate in candidates if isinstance(candidates, list) else [candidates]:
            keys = [n for n in candidate if n != "constant"]
            if all(n in out for n in keys) and all(close(out[n], candidate[n]) for n in keys):
                return fail(f"{message}: it looks like {name}", hint)
    return None


def _diagnose(out: dict[str, Tensor], expected: dict[str, Tensor], logit_diff: Tensor, model: nn.Module,
              tokens: Tensor, label: str) -> Verdict:
    message = f"wrong terms ({label})"
    named = _named(out, model, tokens, message)
    if named is not None:
        return named
    wrong = [name for name in expected if not close(out[name], expected[name])]
    if wrong == ["constant"]:
        slip = named_constant(out["constant"], model)
        return fail(f"{message}: only 'constant' differs" + (f": {slip}" if slip else ""),
                    "'constant' = w . beta + (b_1 - b_0), with w = classifier.weight[1] - classifier.weight[0], beta = "
                    "model.norm.bias and b = model.classifier.bias: what the final LayerNorm and the classifier add "
                    "whatever the sentence.")
    heads = [name for name in expected if name.startswith("head ")]
    if sorted(wrong) == sorted(heads):
        return fail(f"{message}: only the heads' terms differ ({', '.join(map(repr, wrong))})",
                    "Head h's term is its output at <cls>, W_o's input features [h*d_k, (h+1)*d_k), through the "
                    "same columns of W_o's weight: part @ W_o.weight[:, h*d_k:(h+1)*d_k].T, no bias.")
    vectors = [name for name in expected if name != "constant"]
    ratios = torch.stack([out[n].detach().double().cpu() / expected[n].double().cpu() for n in vectors])  # (T, B)
    if not all(float32_close(out[name], expected[name]) for name in wrong) and "constant" not in wrong and \
            bool(torch.isfinite(ratios).all()) and torch.allclose(ratios, ratios[:1].expand_as(ratios), rtol=1e-6):
        return fail(f"{message}: every term is off by the same factor in each sentence, so sigma is off",
                    "sigma = sqrt(x.var(dim=-1, unbiased=False) + eps), x being <cls>'s vector after the layer (the "
                    "sum of every term's vector, or what a forward pre-hook on model.norm receives), one sigma per "
                    "sentence.")
    if all(float32_close(out[name], expected[name]) for name in wrong):
        return fail(f"{message}: right only up to float32's rounding, so part of the computation ran in float32 while "
                    "the model is float64", "Keep the model's dtype: no .float(), no torch.tensor(...) of Python floats.")
    adds_up = close(sum(out.values()), logit_diff)
    detail = "; ".join(f"{name!r}: {where_differs(out[name], expected[name], dim=0, axis='sentence')}"
                       for name in wrong[:3])
    return fail(f"{message}: {', '.join(repr(n) for n in wrong)} differ ({detail}); "
                + ("they still add up to the logit difference" if adds_up
                   else "and they don't add up to the logit difference logit[1] - logit[0]"), DEFINITION)


def check_logit_attribution(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(model, tokens) -> {term: (B,)}``: direct logit attribution of a one-layer
    ``SentimentClassifier`` on ``tokens (B, L)``, the terms 'embedding', 'head 0' ... 'head H-1',
    'W_o bias', 'feed-forward' and 'constant', the final LayerNorm's sigma frozen, so that they add up
    to ``logit[1] - logit[0]``; in evaluation mode, in the model's dtype, the model left as it was."""

    def body() -> str:
        first = seeded_model(41, num_heads=3, d_model=12, d_ff=16, dtype=torch.float64)
        second = seeded_model(42, num_heads=2, d_model=8, d_ff=12, dtype=torch.float32).eval()
        for p in second.position_embedding.parameters():
            p.requires_grad_(False)
        witness = first.layers[0].self_attn.W_o.register_forward_pre_hook(lambda module, args: None)
        cases = [(first, 7, 43, "3 heads, float64, training mode"),
                 (first, 5, 44, "3 heads, float64, other sentences, a hook of its own on W_o"),
                 (first, -7, 43, "3 heads, float64, the first sentences in reverse order"),  # the same shape
                 (second, 6, 45, "2 heads, float32, evaluation mode")]
        seen: set[int] = set()
        try:
            for model, B, seed, label in cases:
                examples, tokens, _ = sentences(abs(B), seed)
                if B < 0:
                    B, examples, tokens = -B, examples[::-1], tokens.flip(0)
                given = tokens.clone()
                expected = {n: v.to(next(model.parameters()).dtype)
                            for n, v in _attribution.logit_attribution(model, examples, VOCAB).items()}

                def right(out: Any, expected: dict[str, Tensor] = expected) -> bool:
                    return isinstance(out, dict) and set(out) == set(expected) and all(
                        isinstance(out[n], Tensor) and out[n].shape == v.shape and close(out[n].detach(), v)
                        for n, v in expected.items())

                used_before, _ = id(model) in seen, seen.add(id(model))
                fresh = lambda tokens=tokens: [tokens.clone()]  # noqa: E731
                try:
                    out = call_leaving_model_alone(fn, model, given, what=f"your function ({label})",
                                                   forbidden=[_attribution.logit_attribution.__wrapped__])
                except Verdict as verdict:
                    if verdict.status == ERROR:
                        raise explain(verdict, fn, model, fresh, right, used_before=used_before, label=label) from None
                    raise
                if not torch.equal(given, tokens):
                    raise fail(f"your function changed `tokens` in place ({label})", "Compute new tensors instead.")
                dtype = next(model.parameters()).dtype
                names = ["embedding", *(f"head {h}" for h in range(model.num_heads)), "W_o bias", "feed-forward",
                         "constant"]
                if out is None:
                    expect_tensor(out, "the terms", (B,))  # "not implemented yet"
                if not isinstance(out, dict):
                    raise fail(f"your function returned {type(out).__name__}, expected a dict {{term name: tensor (B,)}}",
                               f"Return one entry per term: {_ABOUT}.")
                if used_before and not right(out):
                    stale = explain(fail(f"wrong terms ({label})"), fn, model, fresh, right, used_before=True, label=label)
                    if stale.hint:
                        raise stale
                given_terms = {n: expect_tensor(out[n], f"the term {n!r} ({label})", (B,), dtype=dtype,
                                                explain=" (B,), one number per sentence") for n in names if n in out}
                missing = [n for n in names if n not in out]
                if "W_o bias" in missing:
                    named = _named(given_terms, model, tokens, f"wrong terms ({label})")
                    raise named or fail(
                        f"there is no 'W_o bias' term ({label}): W_o's bias is part of <cls>'s vector, so without it "
                        "the terms don't add up to the logit difference",
                        "W_o(concat) = concat @ W_o.weight.T + W_o.bias: the heads' terms take the weight, slice by "
                        "slice; the bias is a term of its own, 'W_o bias'.")
                if missing or len(out) != len(names):
                    extra = [str(n) for n in out if n not in names]
                    raise fail(f"the terms are named {sorted(map(str, out))}; expected {names}"
                               + (f" (missing: {missing})" if missing else "") + (f" (extra: {extra})" if extra else ""),
                               f"Return exactly these entries: {_ABOUT}.")
                out = given_terms
                logits = parts_of(model, tokens)["logits"]
                if not all(close(out[n], expected[n]) for n in names):
                    raise _diagnose(out, expected, logits[:, 1] - logits[:, 0], model, tokens, label)
        finally:
            witness.remove()
        _, tokens, _ = sentences(4, 46)
        device_and_grad_care(fn, on_meta(first), on_meta(tokens), what="your function", hint=DEVICE_HINT)
        return ("every term right on 2 untrained models (2 and 3 heads, float32 and float64), twice on the same "
                "model, and on another device; the terms add up to the logit difference; the models are left as they were")

    def on_one_thread() -> str:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return body()
        finally:
            torch.set_num_threads(threads)

    return run_check("direct logit attribution", on_one_thread)
