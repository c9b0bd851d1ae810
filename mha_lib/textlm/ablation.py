"""Which heads a language model needs, and for which tokens: ablation by token class.

A head is **mean-ablated** when its output (its ``d_k`` columns of the input to ``W_o``) is
replaced at every position by its mean over a batch of held-out text: the head then says the
same thing everywhere, so what it computes from *this* text is gone, while the average it
adds to the stream stays (zeroing it would also remove that average, a change the model
never saw in training; chapter 07 compares the two). The loss it costs is measured per
**token class** of the target (the token the model has to predict):

- ``newline``: a line break;
- ``indent``: only spaces (indentation, alignment);
- ``punctuation``: brackets, dots, operators, quotes;
- ``word start``: the first piece of a word, name or number;
- ``word piece``: a piece that continues the previous one without a space (``assert`` + ``Equal``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from .model import TextTransformer
from .tokenizer import Tokenizer

__all__ = ["CLASSES", "ablation_losses", "class_losses", "head_means", "mean_ablated", "token_classes", "vocab_classes"]

CLASSES = ("newline", "indent", "punctuation", "word start", "word piece")


def _is_word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def token_classes(tokenizer: Tokenizer, inputs: Tensor, targets: Tensor) -> Tensor:
    """The class of every target token, an index into :data:`CLASSES`; ``(B, L)`` long.

    Args:
        inputs, targets: ``(B, L)`` token ids, the targets one token later than the inputs
            (so ``inputs[:, t]`` is the token before ``targets[:, t]``).
    """
    if inputs.shape != targets.shape or inputs.dim() != 2:
        raise ValueError(f"inputs and targets must both be (B, L), got {tuple(inputs.shape)} and {tuple(targets.shape)}")
    strings = tokenizer.tokens(range(len(tokenizer)))

    def cls(prev: int, tok: int) -> int:
        s, p = strings[tok], strings[prev]
        if "\n" in s:
            return 0
        if s.strip(" ") == "":
            return 1
        if not _is_word_char(s[0]) and not (s[0] == " " and len(s) > 1 and _is_word_char(s[1])):
            return 2
        if _is_word_char(s[0]) and _is_word_char(p[-1]):
            return 4
        return 3

    table: dict[tuple[int, int], int] = {}
    flat = []
    for prev, tok in zip(inputs.flatten().tolist(), targets.flatten().tolist()):
        if (prev, tok) not in table:
            table[prev, tok] = cls(prev, tok)
        flat.append(table[prev, tok])
    out = torch.tensor(flat, dtype=torch.long).view_as(targets)
    return out


def vocab_classes(tokenizer: Tokenizer) -> Tensor:
    """``(V,)``: each token's own class, an index into :data:`CLASSES`, the token taken as its own
    predecessor (only word start and word piece depend on the token before; the key roles
    indent and punctuation of :mod:`.scores` do not)."""
    ids = torch.arange(len(tokenizer))[None]
    return token_classes(tokenizer, ids, ids)[0]


def _head_slice(model: TextTransformer, layer: int, head: int) -> slice:
    d_k = model.config.d_model // model.num_heads
    return slice(head * d_k, (head + 1) * d_k)


@torch.no_grad()
def head_means(model: TextTransformer, tokens: Tensor) -> list[Tensor]:
    """Each layer's mean input to ``W_o`` over the batch and positions: one ``(d_model,)`` per layer.

    Head ``h``'s mean output is the slice ``h·d_k:(h+1)·d_k`` of its layer's vector.
    """
    means: list[Tensor] = []
    hooks = [block.attn.W_o.register_forward_pre_hook(lambda m, args: means.append(args[0].mean(dim=(0, 1))))
             for block in model.blocks]
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return means


@contextmanager
def mean_ablated(model: TextTransformer, heads: Iterable[tuple[int, int]], means: Sequence[Tensor]) -> Iterator[None]:
    """Inside the ``with``, the heads ``(layer, head)`` output their means (:func:`head_means`) everywhere."""
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if not (0 <= layer < model.num_layers and 0 <= head < model.num_heads):
            raise ValueError(f"no head ({layer}, {head}) in a model of {model.num_layers} layers of {model.num_heads} heads")
        by_layer.setdefault(layer, []).append(head)

    def hook_for(layer: int, heads_here: list[int]):
        def hook(module, args):
            x = args[0].clone()
            for head in heads_here:
                cols = _head_slice(model, layer, head)
                x[..., cols] = means[layer][cols].to(x.dtype)
            return (x,)
        return hook

    hooks = [model.blocks[layer].attn.W_o.register_forward_pre_hook(hook_for(layer, hs)) for layer, hs in by_layer.items()]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def class_losses(model: TextTransformer, inputs: Tensor, targets: Tensor, classes: Tensor) -> Tensor:
    """The mean next-token loss (nats) of every token class: ``(len(CLASSES),)`` (NaN for an absent class)."""
    logits = model(inputs)
    loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, L)
    out = torch.full((len(CLASSES),), float("nan"), dtype=torch.float64)
    for c in range(len(CLASSES)):
        picked = loss[classes == c]
        if picked.numel():
            out[c] = picked.double().mean()
    return out


@torch.no_grad()
def ablation_losses(model: TextTransformer, inputs: Tensor, targets: Tensor, classes: Tensor) -> dict[str, Tensor]:
    """What mean-ablating each head alone costs, per token class.

    Returns:
        ``{"clean": (C,), "increase": (layers, heads, C)}``: the model's loss per class, and
        how much it rises (nats) when one head is mean-ablated (means over ``inputs``).
    """
    clean = class_losses(model, inputs, targets, classes)
    means = head_means(model, inputs)
    increase = torch.zeros(model.num_layers, model.num_heads, len(CLASSES), dtype=torch.float64)
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            with mean_ablated(model, [(layer, head)], means):
                increase[layer, head] = class_losses(model, inputs, targets, classes) - clean
    return {"clean": clean, "increase": increase}
