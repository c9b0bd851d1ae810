"""Split the model dimension into heads and put it back together.

Head ``h`` owns the features ``[h * d_k, (h + 1) * d_k)`` with ``d_k = D // H``,
the layout of ``nn.MultiheadAttention`` and of the original Transformer.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .validation import as_index, check_positive_int, describe

__all__ = ["split_heads", "combine_heads", "silence_heads"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(B, L, D) -> (B, H, L, D // H)``.

    The view cuts the last axis into ``H`` chunks of ``d_k``; the transpose
    brings the head axis in front of the sequence axis, so that every head is
    a separate ``(L, d_k)`` matrix for batched matrix multiplication.
    """
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(f"split_heads expects (B, L, D), got {describe(x)}")
    num_heads = check_positive_int(num_heads, "num_heads")
    if x.size(-1) % num_heads != 0:
        raise ValueError(f"D={x.size(-1)} is not divisible by num_heads={num_heads}")
    return _split_heads(x, num_heads)


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    """:func:`split_heads` without its checks, for callers that checked at their door."""
    B, L, D = x.shape
    return x.reshape(B, L, num_heads, D // num_heads).transpose(1, 2)  # (B, H, L, d_k)


def combine_heads(x: Tensor) -> Tensor:
    """``(B, H, L, d_k) -> (B, L, H * d_k)``, the inverse of :func:`split_heads`.

    After the transpose the memory is no longer in row order, so a plain
    ``.view`` would fail; ``.reshape`` copies into the right order.
    """
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"combine_heads expects (B, H, L, d_k), got {describe(x)}")
    B, H, L, d_k = x.shape
    return x.transpose(1, 2).reshape(B, L, H * d_k)  # (B, L, D)


@contextmanager
def silence_heads(attention: nn.Module, heads: Iterable[int]) -> Iterator[None]:
    """Switch heads off inside a ``with`` block: zero their outputs just before ``W_o``.

    Works for any multi-head module whose output projection ``W_o`` receives the heads
    side by side, ``(B, L, H * d_k)`` as :func:`combine_heads` makes them
    (:class:`~mha_lib.MultiHeadAttention`, :class:`~mha_lib.EfficientMultiHeadAttention`).
    Head ``h`` owns the features ``[h * d_k, (h + 1) * d_k)``. A forward pre-hook on
    ``W_o`` multiplies them by 0, so the output projection receives nothing from the
    silenced heads; the other heads and the rest of the model are untouched. No weight
    changes, and the hook is removed on exit (also after an error).

        with silence_heads(model.layers[0].self_attn, [1]):
            accuracy = evaluate(model, test, vocab)
    """
    num_heads, W_o = getattr(attention, "num_heads", None), getattr(attention, "W_o", None)
    if not isinstance(num_heads, int) or not isinstance(W_o, nn.Linear) or W_o.in_features % num_heads:
        raise TypeError("silence_heads needs a multi-head module with an int num_heads and an nn.Linear W_o "
                        f"that receives the heads side by side (e.g. MultiHeadAttention); got {type(attention).__name__}")
    if isinstance(heads, (int, str, Tensor)) or not isinstance(heads, Iterable):
        raise TypeError(f"heads must be a list of head indices, e.g. [{heads!r}], got {heads!r} "
                        f"(a {type(heads).__name__})")
    heads = list(heads)
    indices = [as_index(h) for h in heads]  # ints, NumPy ints and 0-d integer tensors (w.argmax())
    bad = [h for h, i in zip(heads, indices) if i is None or not 0 <= i < num_heads]
    if bad:
        raise ValueError(f"heads must be ints in [0, {num_heads}), got {bad}")
    heads = indices
    d_k = W_o.in_features // num_heads
    keep = torch.ones(W_o.in_features)  # (H * d_k,)
    for h in heads:
        keep[h * d_k : (h + 1) * d_k] = 0.0

    def zero_heads(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        concatenated = args[0]  # (B, L, H * d_k), the heads side by side
        return (concatenated * keep.to(concatenated.device, concatenated.dtype), *args[1:])

    handle = W_o.register_forward_pre_hook(zero_heads)
    try:
        yield
    finally:
        handle.remove()
