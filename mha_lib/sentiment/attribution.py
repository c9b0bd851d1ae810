"""What each head contributes to the prediction, measured three ways (chapter 07).

Silencing a head (:func:`~mha_lib.silence_heads`, *zero-ablation*) replaces its output by a
zero vector, a value the model never saw in training: what breaks may be the model's answer
to that strange input, not the loss of what the head brings. Two gentler replacements
keep the head's output on the distribution the model knows:

- *mean-ablation*: the head's mean output at ``<cls>`` over reference sentences, the same
  for every sentence: what the head says "on average";
- *resample-ablation*: the head's output at ``<cls>`` on another, randomly drawn reference
  sentence: a real report, about the wrong sentence.

:func:`head_outputs` reads the heads' outputs at ``<cls>``; :func:`replace_heads` swaps
some of them inside a ``with`` block; :func:`ablated_accuracy` measures all three kinds.

*Direct logit attribution* (:func:`logit_attribution`) asks instead how much each head's
term in ``<cls>``'s vector pushes the logits, holding everything else as it was. The
classifier reads ``LayerNorm(x)`` of a **sum** ``x`` = embedding + one term per head +
``W_o``'s bias + the feed-forward output; with the LayerNorm's scale ``sigma`` frozen at its
value for the sentence, the logit difference is a sum of one part per term.

Only ``<cls>``'s vector reaches the classifier, and in a one-layer model nothing else
changes it, so every function here works at position 0 of the one encoder layer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from ..validation import as_index
from .data import Example, Vocab, batch_examples
from .model import SentimentClassifier, device_of

__all__ = ["ABLATIONS", "ablated_accuracy", "head_outputs", "logit_attribution", "replace_heads"]

ABLATIONS = ("zero", "mean", "resample")


def _one_layer(model: SentimentClassifier) -> nn.Module:
    if len(model.layers) != 1:
        raise ValueError(f"these probes read a one-layer model (the output at <cls> of its only layer); "
                         f"got {len(model.layers)} layers")
    return model.layers[0]


def _heads_of(model: SentimentClassifier, heads: Sequence[int]) -> list[int]:
    heads = list(heads)
    H = model.num_heads
    indices = [as_index(h) for h in heads]  # ints, NumPy ints and 0-d integer tensors
    if not heads or any(i is None or not 0 <= i < H for i in indices):
        raise ValueError(f"heads must be a non-empty list of head indices in [0, {H}), got {heads!r}")
    return indices


@torch.no_grad()
def head_outputs(model: SentimentClassifier, examples: Sequence[Example], vocab: Vocab) -> Tensor:
    """``(N, H, d_k)``: each head's output at ``<cls>``, as ``W_o`` receives it, in evaluation mode."""
    attention = _one_layer(model).self_attn
    captured: list[Tensor] = []

    def grab(module: nn.Module, args: tuple[Tensor, ...]) -> None:
        captured.append(args[0][:, 0].detach())  # (N, H * d_k) at <cls>

    was_training = model.training
    model.eval()
    handle = attention.W_o.register_forward_pre_hook(grab)
    try:
        model(batch_examples(examples, vocab).to(device_of(model)))
    finally:
        handle.remove()
        model.train(was_training)
    return captured[0].view(len(examples), model.num_heads, -1)  # (N, H, d_k)


@contextmanager
def replace_heads(model: SentimentClassifier, heads: Sequence[int], values: Tensor) -> Iterator[None]:
    """Inside a ``with`` block, the output at ``<cls>`` of each head in ``heads`` is ``values``.

    ``values``: ``(len(heads), d_k)`` (the same for every sentence) or ``(B, len(heads), d_k)``
    (one per sentence of the batch the model is called on). A forward pre-hook on ``W_o``
    writes them into the heads' slices at position 0; no weight changes.
    """
    attention = _one_layer(model).self_attn
    heads = _heads_of(model, heads)
    d_k = attention.W_o.in_features // model.num_heads
    if values.shape[-2:] != (len(heads), d_k) or values.dim() not in (2, 3):
        raise ValueError(f"values must be ({len(heads)}, {d_k}) or (B, {len(heads)}, {d_k}), "
                         f"got {tuple(values.shape)}")

    def swap(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        x = args[0].clone()  # (B, L, H * d_k)
        if values.dim() == 3 and values.size(0) != x.size(0):
            raise ValueError(f"values hold {values.size(0)} sentences, the batch {x.size(0)}")
        at_cls = x[:, 0].view(x.size(0), model.num_heads, d_k)  # a view into x
        at_cls[:, heads] = values.to(x.dtype)
        return (x, *args[1:])

    handle = attention.W_o.register_forward_pre_hook(swap)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def ablated_accuracy(
    model: SentimentClassifier,
    examples: Sequence[Example],
    vocab: Vocab,
    heads: Sequence[int],
    how: str,
    reference: Sequence[Example],
    seed: int = 0,
) -> Tensor:
    """``(N,)`` bool: which of ``examples`` the model gets right with ``heads`` ablated.

    ``how``: ``"zero"`` (the heads' outputs are zero vectors), ``"mean"`` (their mean output
    at ``<cls>`` over ``reference``) or ``"resample"`` (their output on a reference sentence
    drawn at random for each example, with a CPU generator seeded with ``seed``).
    """
    if how not in ABLATIONS:
        raise ValueError(f"how must be one of {ABLATIONS}, got {how!r}")
    heads = _heads_of(model, heads)
    if not examples or not reference:
        raise ValueError("ablated_accuracy needs examples and reference sentences")
    outputs = head_outputs(model, reference, vocab)[:, heads]  # (M, len(heads), d_k)
    if how == "zero":
        values = torch.zeros_like(outputs[0])
    elif how == "mean":
        values = outputs.mean(dim=0)  # (len(heads), d_k)
    else:
        pick = torch.randint(len(reference), (len(examples),), generator=torch.Generator().manual_seed(seed))
        values = outputs[pick.to(outputs.device)]  # (N, len(heads), d_k)
    labels = torch.tensor([e.label for e in examples])
    was_training = model.training
    model.eval()
    try:
        with replace_heads(model, heads, values):
            logits = model(batch_examples(examples, vocab).to(device_of(model)))
    finally:
        model.train(was_training)
    return logits.argmax(-1).cpu() == labels


@torch.no_grad()
def logit_attribution(model: SentimentClassifier, examples: Sequence[Example], vocab: Vocab) -> dict[str, Tensor]:
    """Each term's direct push on the logit difference (positive minus negative), ``(N,)`` per term.

    ``<cls>``'s vector after the layer is a sum: ``"embedding"`` (token + position),
    ``"head 0"`` ... ``"head H-1"`` (each head's output through its slice of ``W_o``),
    ``"W_o bias"`` and ``"feed-forward"``. The classifier computes
    ``w · LayerNorm(x) + b`` with ``LayerNorm(x) = gamma * (x - mean(x)) / sigma + beta``;
    holding ``sigma`` at its value for the sentence, term ``t`` contributes
    ``w · (gamma * (t - mean(t)) / sigma)``, and ``"constant"`` (``w · beta + b``) completes
    the sum: the terms add up to the model's logit difference exactly.
    """
    layer = _one_layer(model)
    attention = layer.self_attn
    H = model.num_heads
    parts: dict[str, Tensor] = {}

    def grab_heads(module: nn.Module, args: tuple[Tensor, ...]) -> None:
        parts["heads"] = args[0][:, 0]  # (N, H * d_k)

    def grab_ffn(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> None:
        parts["feed-forward"] = output[:, 0]  # (N, D)

    was_training = model.training
    model.eval()
    tokens = batch_examples(examples, vocab).to(device_of(model))
    handles = [attention.W_o.register_forward_pre_hook(grab_heads),
               layer.feed_forward.register_forward_hook(grab_ffn)]
    try:
        logits = model(tokens)  # (N, 2)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)

    N = len(examples)
    W_o = attention.W_o.weight  # (D, H * d_k)
    d_k = W_o.size(1) // H
    per_head = parts["heads"].view(N, H, d_k)
    positions = torch.zeros(1, dtype=torch.long, device=tokens.device)
    terms = {"embedding": model.token_embedding(tokens[:, 0]) + model.position_embedding(positions)}  # (N, D)
    for h in range(H):
        terms[f"head {h}"] = per_head[:, h] @ W_o[:, h * d_k:(h + 1) * d_k].T  # (N, D)
    terms["W_o bias"] = attention.W_o.bias.expand(N, -1)
    terms["feed-forward"] = parts["feed-forward"]

    x = sum(terms.values())  # (N, D): <cls>'s vector after the layer
    norm = model.norm
    sigma = torch.sqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # (N, 1), frozen
    w = model.classifier.weight[1] - model.classifier.weight[0]  # (D,): the logit difference's direction
    b = model.classifier.bias[1] - model.classifier.bias[0]
    out = {name: ((t - t.mean(dim=-1, keepdim=True)) * norm.weight / sigma) @ w for name, t in terms.items()}
    out["constant"] = (norm.bias @ w + b).expand(N)
    total = sum(out.values())
    assert torch.allclose(total, logits[:, 1] - logits[:, 0], atol=1e-4, rtol=1e-4), "the terms must add up"
    return {name: value.cpu() for name, value in out.items()}
