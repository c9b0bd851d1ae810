"""Split the model dimension into heads and put it back together.

Head ``h`` owns the features ``[h * d_k, (h + 1) * d_k)`` with ``d_k = D // H``,
the layout of ``nn.MultiheadAttention`` and of the original Transformer.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["split_heads", "combine_heads"]


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(B, L, D) -> (B, H, L, D // H)``.

    The view cuts the last axis into ``H`` chunks of ``d_k``; the transpose
    brings the head axis in front of the sequence axis, so that every head is
    a separate ``(L, d_k)`` matrix for batched matrix multiplication.
    """
    if x.dim() != 3:
        raise ValueError(f"split_heads expects (B, L, D), got shape {tuple(x.shape)}")
    B, L, D = x.shape
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
    if D % num_heads != 0:
        raise ValueError(f"D={D} is not divisible by num_heads={num_heads}")
    return x.reshape(B, L, num_heads, D // num_heads).transpose(1, 2)  # (B, H, L, d_k)


def combine_heads(x: Tensor) -> Tensor:
    """``(B, H, L, d_k) -> (B, L, H * d_k)``, the inverse of :func:`split_heads`.

    After the transpose the memory is no longer in row order, so a plain
    ``.view`` would fail; ``.reshape`` copies into the right order.
    """
    if x.dim() != 4:
        raise ValueError(f"combine_heads expects (B, H, L, d_k), got shape {tuple(x.shape)}")
    B, H, L, d_k = x.shape
    return x.transpose(1, 2).reshape(B, L, H * d_k)  # (B, L, D)
