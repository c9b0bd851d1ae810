"""The known mistakes of exercise 7.4 (direct logit attribution), for :mod:`.logit_terms`: the terms computed
right, or with one mistake switched on (:func:`terms`), and the list of mistakes with their hints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ._core import Mistake


def parts_of(model: nn.Module, tokens: Tensor) -> dict[str, Tensor]:
    """``heads (N, L, H, d_k)``, ``ffn`` and ``norm2`` ``(N, L, D)``, ``logits (N, 2)``, in evaluation mode."""
    layer = model.layers[0]
    got: dict[str, Tensor] = {}
    handles = [layer.self_attn.W_o.register_forward_pre_hook(lambda m, a: got.__setitem__("heads", a[0])),
               layer.feed_forward.register_forward_hook(lambda m, a, out: got.__setitem__("ffn", out)),
               layer.norm2.register_forward_hook(lambda m, a, out: got.__setitem__("norm2", out))]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            got["logits"] = model(tokens)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    N, L, _ = got["heads"].shape
    got["heads"] = got["heads"].view(N, L, model.num_heads, -1)
    return got


def terms(model: nn.Module, tokens: Tensor, *, position: str | int = 0, center: bool | str = True, gamma: bool = True,
          sigma: str = "frozen", beta_each: bool = False, bias_each: bool = False, wo_bias: str = "own",
          order: int = 1, position_embedding: bool | str = True, heads_as: str = "columns", ffn_at: str = "output",
          scale: str = "logits") -> dict[str, Tensor]:
    """Direct logit attribution, right by default, or with one of the known mistakes switched on.

    ``position``: 0 (``<cls>``), an index, ``"last"`` (each sentence's last word) or ``"mean"`` (the mean over the
    real tokens); ``center``: False, ``"x"`` (by x's mean) or ``"batch"``; ``sigma``: ``"frozen"``, ``"own"`` (each
    term's own, with eps), ``"no eps"``, ``"unbiased"``, ``"from terms"`` (frozen, but from the sum of the returned
    terms), ``"eps outside"``, ``"batch"`` (over the batch), ``"embedding"`` (of the embedding alone); ``wo_bias``:
    ``"own"`` (a term of its own), ``"each head"`` (also in every head's term), ``"each head only"``, ``"none"``;
    ``order``: -1 for negative minus positive; ``position_embedding``: False, ``"one"`` (position 1) or
    ``"cls id"`` (the <cls> id as a position); ``heads_as``: ``"rows"`` (W_o's rows) or ``"interleaved"``;
    ``ffn_at``: ``"norm2"`` (norm2's output); ``scale``: ``"probability"`` (terms that add up to p1 - p0)."""
    got = parts_of(model, tokens)
    heads, ffn = got["heads"], got["norm2" if ffn_at == "norm2" else "ffn"]
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

    def head_part(h: int) -> Tensor:
        if heads_as == "rows":
            return heads[:, :, h] @ W_o[h * d_k:(h + 1) * d_k]
        if heads_as == "interleaved":
            return heads.flatten(2).view(N, L, d_k, H)[..., h] @ W_o.view(-1, d_k, H)[..., h].T
        return heads[:, :, h] @ W_o[:, h * d_k:(h + 1) * d_k].T

    with torch.no_grad():
        positions = model.position_embedding(torch.arange(L, device=tokens.device))  # (L, D)
        token = model.token_embedding(tokens)  # (N, L, D)
        embedding = {True: token + positions, False: token,
                     "one": token + model.position_embedding.weight[1],
                     "cls id": token + model.position_embedding.weight[model.cls_id]}[position_embedding]
        parts = {"embedding": at(embedding)}
        own = [at(head_part(h)) for h in range(H)]
        for h in range(H):
            parts[f"head {h}"] = own[h] + (b_o if wo_bias.startswith("each head") else 0)
        if wo_bias in ("own", "each head"):
            parts["W_o bias"] = b_o.expand(N, -1)
        parts["feed-forward"] = at(ffn)
        true_own = [at(heads[:, :, h] @ W_o[:, h * d_k:(h + 1) * d_k].T) for h in range(H)]
        x_true = at(token + positions) + sum(true_own) + b_o + at(got["ffn"])  # the vector LayerNorm reads
        x = sum(parts.values()) if sigma == "from terms" else x_true
        eps = norm.eps
        frozen = {"frozen": torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps),
                  "from terms": torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps),
                  "no eps": x.var(-1, unbiased=False, keepdim=True).sqrt(),
                  "unbiased": torch.sqrt(x.var(-1, unbiased=True, keepdim=True) + eps),
                  "eps outside": x.std(-1, unbiased=False, keepdim=True) + eps,
                  "batch": torch.sqrt(x.var(0, unbiased=False, keepdim=True) + eps),
                  "embedding": torch.sqrt(parts["embedding"].var(-1, unbiased=False, keepdim=True) + eps)}.get(sigma)
        w = (model.classifier.weight[1] - model.classifier.weight[0]) * order
        b = (model.classifier.bias[1] - model.classifier.bias[0]) * order
        g = norm.weight if gamma else torch.ones_like(norm.weight)
        out = {}
        for name, t in parts.items():
            s = frozen if frozen is not None else torch.sqrt(t.var(-1, unbiased=False, keepdim=True) + eps)
            mean = {True: t.mean(-1, keepdim=True), False: 0, "x": x_true.mean(-1, keepdim=True),
                    "batch": t.mean(0, keepdim=True)}[center]
            value = (g * (t - mean) / s + (norm.bias if beta_each else 0)) @ w
            out[name] = value + (b if bias_each else 0)
        out["constant"] = (norm.bias @ w + b).expand(N)
        if scale == "probability":
            logits = got["logits"]
            p = logits.softmax(-1)
            ratio = (p[:, 1] - p[:, 0]) / (logits[:, 1] - logits[:, 0])
            out = {name: value * ratio for name, value in out.items()}
    return out


def mistakes(model: nn.Module, tokens: Tensor) -> list[Mistake]:
    def variant(**kw: Any) -> Callable[[], dict[str, Tensor]]:
        return lambda: terms(model, tokens, **kw)

    def either_sigma(**kw: Any) -> Callable[[], list[dict[str, Tensor]]]:  # sigma of the model's x, or of the terms'
        return lambda: [terms(model, tokens, sigma=s, **kw) for s in ("frozen", "from terms")]

    return [
        ("the wrong sign: the logit difference negative minus positive", variant(order=-1),
         "The logit difference is logit[1] - logit[0] (positive minus negative): w = classifier.weight[1] - "
         "classifier.weight[0], and the same order for the bias."),
        ("the terms were not centred (LayerNorm subtracts the mean of x, so each term loses its own mean)",
         variant(center=False), "Subtract each term's own mean over its d_model features: t - t.mean(-1, keepdim=True)."),
        ("every term was centred by the mean of x, not by its own mean",
         variant(center="x"), "Centring is linear: x - mean(x) = sum over the terms of (t - mean(t)), so each term "
         "subtracts its *own* mean over its d_model features, t - t.mean(-1, keepdim=True)."),
        ("the terms were centred over the batch (dim 0), not over their d_model features",
         variant(center="batch"), "LayerNorm works on each vector alone: t - t.mean(dim=-1, keepdim=True)."),
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
        ("sigma with eps added outside the square root (std + eps)", variant(sigma="eps outside"),
         "eps goes under the root: sigma = sqrt(x.var(-1, unbiased=False) + model.norm.eps)."),
        ("sigma over the batch (dim 0), not over x's d_model features", variant(sigma="batch"),
         "Each sentence has its own sigma: x.var(dim=-1, unbiased=False, keepdim=True), x being (B, D)."),
        ("sigma of the embedding alone (the layer's input), not of x after the layer", variant(sigma="embedding"),
         "sigma belongs to the vector the final LayerNorm reads: x = the sum of every term's vector (embedding, "
         "heads, W_o's bias, feed-forward), or a forward pre-hook on model.norm."),
        ("beta (model.norm.bias) and the classifier's bias were counted in every term",
         variant(beta_each=True, bias_each=True),
         "beta and the classifier's bias belong to no term: they go once into 'constant' = w . beta + (b_1 - b_0)."),
        ("beta (model.norm.bias) was counted in every term", variant(beta_each=True),
         "beta belongs to no term: it goes once into 'constant' = w . beta + (b_1 - b_0)."),
        ("the classifier's bias was counted in every term", variant(bias_each=True),
         "The classifier's bias belongs to no term: it goes once into 'constant' = w . beta + (b_1 - b_0)."),
        ("W_o's bias was counted in every head's term (each head through the whole W_o)",
         lambda: [terms(model, tokens, wo_bias=w, sigma=s) for w in ("each head", "each head only")
                  for s in ("frozen", "from terms")],
         "A head's term is its output through its own slice of W_o's weight, W_o.weight[:, h*d_k:(h+1)*d_k], "
         "without the bias; W_o's bias is a term of its own, 'W_o bias'."),
        ("each head went through *rows* h*d_k:(h+1)*d_k of W_o's weight, not its columns",
         either_sigma(heads_as="rows"),
         "nn.Linear computes x @ weight.T: head h's d_k inputs meet the *columns* W_o.weight[:, h*d_k:(h+1)*d_k], so "
         "its term is part @ W_o.weight[:, h*d_k:(h+1)*d_k].T."),
        ("each head's features were read as interleaved (a (d_k, H) view: head h as features h, h+H, ...)",
         either_sigma(heads_as="interleaved"),
         "W_o's input holds the heads side by side: head h owns features [h*d_k, (h+1)*d_k), of the input and of "
         "W_o's columns."),
        ("the embedding term has no position embedding",
         either_sigma(position_embedding=False),
         "<cls>'s embedding is token_embedding(<cls>) + position_embedding(0), as in the model's forward."),
        ("the embedding term took position 1's embedding (positions start at 0)",
         either_sigma(position_embedding="one"),
         "<cls> sits at position 0: position_embedding(torch.zeros(1, dtype=torch.long, device=tokens.device))."),
        ("the embedding term looked up the <cls> token id in the position table (position_embedding(tokens[:, 0]))",
         either_sigma(position_embedding="cls id"),
         "The position table takes positions, not token ids: <cls> is at position 0."),
        ("the 'feed-forward' term was read at norm2's output (the network's input), not at the feed-forward "
         "network's output", either_sigma(ffn_at="norm2"),
         "The residual adds feed_forward(norm2(x)): read the output of layer.feed_forward (a forward hook), at [:, 0]."),
        ("the terms at the wrong position (not <cls>, position 0)",
         lambda: [terms(model, tokens, position=p) for p in (1, -1, "last", "mean")],
         "Only <cls>'s vector, position 0, reaches the classifier: read every part at [:, 0]."),
        ("the terms were scaled to add up to p(positive) - p(negative), not the logit difference",
         variant(scale="probability"),
         "The terms add up to the logit difference logit[1] - logit[0] itself, no softmax: the map from x to it is "
         "linear once sigma is frozen."),
    ]


def named_constant(given: Tensor, model: nn.Module) -> str | None:
    """What a wrong 'constant' (the other terms right) left out or turned around, if a known slip."""
    norm, classifier = model.norm, model.classifier
    with torch.no_grad():
        w = classifier.weight[1] - classifier.weight[0]
        b = classifier.bias[1] - classifier.bias[0]
        beta = norm.bias @ w
    known = [(b, "it has no w . beta (the final LayerNorm's bias, model.norm.bias, through w)"),
             (beta, "it has no classifier bias b_1 - b_0"),
             (beta - b, "its classifier bias has the wrong sign (b_0 - b_1)"),
             (-beta + b, "its w . beta has the wrong sign"),
             (torch.zeros_like(b), "it is zero")]
    from ._core import close
    for value, name in known:
        if close(given, value.expand_as(given).to(given.dtype)):
            return name
    return None
