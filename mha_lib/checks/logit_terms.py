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
from ._core import (CheckResult, Mistake, check_device_care, close, expect_tensor, fail, float32_close, on_meta,
                    run_check, where_differs)
from ._result import Verdict
from ._sentiment import VOCAB, call_leaving_model_alone, seeded_model, sentences

DEFINITION = ("x = <cls>'s vector after the layer = embedding (token + position 0) + one term per head (its output at "
              "<cls> through its slice of W_o, no bias) + W_o's bias + the feed-forward output. With w = classifier "
              "row 1 - row 0, gamma = model.norm.weight and sigma = sqrt(x.var(unbiased=False) + eps) frozen, term t "
              "gives w . (gamma * (t - mean(t)) / sigma), and 'constant' = w . beta + (b_1 - b_0).")
DEVICE_HINT = ("Make every tensor you create on the model's device (device=tokens.device): a +-1 vector for the "
               "logit difference, a position index torch.zeros(1, dtype=torch.long, device=tokens.device).")


def _parts(model: nn.Module, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(heads (N, L, H, d_k), feed-forward (N, L, D), logits (N, 2))`` in evaluation mode."""
    layer = model.layers[0]
    got: dict[str, Tensor] = {}
    handles = [layer.self_attn.W_o.register_forward_pre_hook(lambda m, a: got.__setitem__("heads", a[0])),
               layer.feed_forward.register_forward_hook(lambda m, a, out: got.__setitem__("ffn", out))]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(tokens)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    N, L, _ = got["heads"].shape
    return got["heads"].view(N, L, model.num_heads, -1), got["ffn"], logits


def terms(model: nn.Module, tokens: Tensor, *, position: str | int = 0, center: bool = True, gamma: bool = True,
          sigma: str = "frozen", beta_each: bool = False, bias_each: bool = False, wo_bias: str = "own",
          order: int = 1, position_embedding: bool = True) -> dict[str, Tensor]:
    """Direct logit attribution, right by default, or with one of the known mistakes switched on.

    ``position``: 0 (``<cls>``), an index, ``"last"`` (each sentence's last word) or ``"mean"`` (the
    mean over the real tokens); ``sigma``: ``"frozen"``, ``"own"`` (each term's own, with eps),
    ``"no eps"``, ``"unbiased"``, ``"from terms"`` (frozen, but from the sum of the returned terms); ``wo_bias``: ``"own"`` (a term of its own), ``"each head"``
    (also in every head's term), ``"each head only"`` (in every head's term, no term of its own), ``"none"``; ``order``: -1 for negative minus positive."""
    heads, ffn, _ = _parts(model, tokens)
    N, L, H, d_k = heads.shape
    attention, norm = model.layers[0].self_attn, model.norm
    W_o, b_o = attention.W_o.weight, attention.W_o.bias  # (D, H * d_k), (D,)
    real = (tokens != model.pad_id).to(heads.dtype)  # (N, L)

    def at(t: Tensor) -> Tensor:  # (N, L, D) -> (N, D) at the position asked for
        if position == "mean":
            return (t * real[..., None]).sum(1) / real.sum(1, keepdim=True)
        if position == "last":
            return t[torch.arange(N), real.sum(1).long() - 1]
        return t[:, position]

    with torch.no_grad():
        positions = model.position_embedding(torch.arange(L, device=tokens.device))  # (L, D)
        token = model.token_embedding(tokens)  # (N, L, D)
        parts = {"embedding": at(token + positions if position_embedding else token)}
        own = [at(heads[:, :, h] @ W_o[:, h * d_k:(h + 1) * d_k].T) for h in range(H)]
        for h in range(H):
            parts[f"head {h}"] = own[h] + (b_o if wo_bias.startswith("each head") else 0)
        if wo_bias in ("own", "each head"):
            parts["W_o bias"] = b_o.expand(N, -1)
        parts["feed-forward"] = at(ffn)
        x_true = at(token + positions) + sum(own) + b_o + at(ffn)  # the vector LayerNorm reads, at that position
        x = sum(parts.values()) if sigma == "from terms" else x_true
        eps = norm.eps
        frozen = {"frozen": torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps),
                  "from terms": torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps),
                  "no eps": x.var(-1, unbiased=False, keepdim=True).sqrt(),
                  "unbiased": torch.sqrt(x.var(-1, unbiased=True, keepdim=True) + eps)}.get(sigma)
        w = (model.classifier.weight[1] - model.classifier.weight[0]) * order
        b = (model.classifier.bias[1] - model.classifier.bias[0]) * order
        g = norm.weight if gamma else torch.ones_like(norm.weight)
        out = {}
        for name, t in parts.items():
            s = frozen if frozen is not None else torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + eps)
            centred = t - t.mean(-1, keepdim=True) if center else t
            value = (g * centred / s + (norm.bias if beta_each else 0)) @ w
            out[name] = value + (b if bias_each else 0)
        out["constant"] = (norm.bias @ w + b).expand(N)
    return out


def _mistakes(model: nn.Module, tokens: Tensor) -> list[Mistake]:
    def variant(**kw: Any) -> Callable[[], dict[str, Tensor]]:
        return lambda: terms(model, tokens, **kw)

    return [
        ("the wrong sign: the logit difference negative minus positive", variant(order=-1),
         "The logit difference is logit[1] - logit[0] (positive minus negative): w = classifier.weight[1] - "
         "classifier.weight[0], and the same order for the bias."),
        ("the terms were not centred (LayerNorm subtracts the mean of x, so each term loses its own mean)",
         variant(center=False), "Subtract each term's own mean over its d_model features: t - t.mean(-1, keepdim=True)."),
        ("gamma (model.norm.weight) was left out", variant(gamma=False),
         "LayerNorm multiplies by its gain: gamma * (t - mean(t)) / sigma."),
        ("sigma was recomputed for each term (each term normalized on its own, as if the LayerNorm ran on it alone)",
         lambda: [terms(model, tokens, sigma="own", beta_each=beta, bias_each=bias)
                  for beta, bias in ((False, False), (True, False), (True, True))],
         "Freeze sigma at its value for the whole vector x, the sum of the terms: sigma = sqrt(x.var(-1, "
         "unbiased=False) + eps), the same for every term."),
        ("sigma with the unbiased variance", variant(sigma="unbiased"),
         "LayerNorm uses the biased variance: x.var(-1, unbiased=False) (or x.std(-1, unbiased=False)), plus eps."),
        ("sigma without LayerNorm's eps", variant(sigma="no eps"),
         "sigma = sqrt(x.var(-1, unbiased=False) + model.norm.eps)."),
        ("beta (model.norm.bias) and the classifier's bias were counted in every term",
         variant(beta_each=True, bias_each=True),
         "beta and the classifier's bias belong to no term: they go once into 'constant' = w . beta + (b_1 - b_0)."),
        ("beta (model.norm.bias) was counted in every term", variant(beta_each=True),
         "beta belongs to no term: it goes once into 'constant' = w . beta + (b_1 - b_0)."),
        ("the classifier's bias was counted in every term", variant(bias_each=True),
         "The classifier's bias belongs to no term: it goes once into 'constant' = w . beta + (b_1 - b_0)."),
        ("W_o's bias was counted in every head's term (each head through the whole W_o)", lambda: [terms(model, tokens, wo_bias=w, sigma=s) for w in ("each head", "each head only")
                 for s in ("frozen", "from terms")],
         "A head's term is its output through its own slice of W_o's weight, W_o.weight[:, h*d_k:(h+1)*d_k], "
         "without the bias; W_o's bias is a term of its own, 'W_o bias'."),
        ("the embedding term has no position embedding",
         lambda: [terms(model, tokens, position_embedding=False, sigma=s) for s in ("frozen", "from terms")],
         "<cls>'s embedding is token_embedding(<cls>) + position_embedding(0), as in the model's forward."),
        ("the terms at the wrong position (not <cls>, position 0)",
         lambda: [terms(model, tokens, position=p) for p in (1, -1, "last", "mean")],
         "Only <cls>'s vector, position 0, reaches the classifier: read every part at [:, 0]."),
    ]


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
                 (second, 6, 45, "2 heads, float32, evaluation mode")]
        try:
            for model, B, seed, label in cases:
                examples, tokens, _ = sentences(B, seed)
                given = tokens.clone()
                out = call_leaving_model_alone(fn, model, given, what=f"your function ({label})",
                                               forbidden=[_attribution.logit_attribution.__wrapped__])
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
                expected = {n: v.to(dtype) for n, v in _attribution.logit_attribution(model, examples, VOCAB).items()}
                _, _, logits = _parts(model, tokens)
                if not all(close(out[n], expected[n]) for n in names):
                    raise _diagnose(out, expected, logits[:, 1] - logits[:, 0], model, tokens, label)
        finally:
            witness.remove()
        _, tokens, _ = sentences(4, 46)
        with torch.no_grad():
            check_device_care(fn, on_meta(first), on_meta(tokens), what="your function", hint=DEVICE_HINT)
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
