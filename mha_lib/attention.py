"""Scaled dot-product attention, the operation every chapter builds on.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + mask) V

Shapes use ``...`` for any leading (batch, head) dimensions:
query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, value ``(..., Lk, d_v)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["scaled_dot_product_attention", "check_mask"]


def check_mask(mask: Tensor, scores_shape: torch.Size) -> None:
    """Raise a clear error if ``mask`` can't be used on scores of ``scores_shape``.

    A mask must be boolean (True = may attend) or floating point (added to the
    scores), and must broadcast to the scores' shape ``(..., Lq, Lk)`` without
    growing it. Integer masks are refused: ``0/1`` would silently be *added*.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"mask has dtype {mask.dtype}; use a bool mask (True = may attend), "
            "e.g. mask.bool() or mask != 0, or a float mask that is added to the scores"
        )
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores' shape {tuple(scores_shape)} (..., Lq, Lk)"
        )


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Attend from every query to every key and blend the values.

    Args:
        query: ``(..., Lq, d_k)``.
        key: ``(..., Lk, d_k)``.
        value: ``(..., Lk, d_v)``.
        mask: optional, broadcastable to ``(..., Lq, Lk)``. A **boolean** mask
            means ``True`` = may attend, ``False`` = blocked (the convention of
            ``F.scaled_dot_product_attention``; ``nn.MultiheadAttention`` uses
            the opposite). A **float** mask is added to the scores (use
            ``-inf`` to block).
        dropout_p: probability of zeroing an attention weight (the survivors
            are rescaled by ``1 / (1 - dropout_p)``). Pass 0.0 in evaluation.

    Returns:
        ``(output, weights)``: output ``(..., Lq, d_v)`` and the weights that
        were applied to the values, ``(..., Lq, Lk)`` (after dropout, so that
        ``output == weights @ value``).

    A query whose keys are all blocked gets all-zero weights and a zero output,
    not NaN (softmax over a row of ``-inf`` would be ``0 / 0``); its gradients
    are zero too.
    """
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(
            "query, key and value need at least 2 dimensions (..., L, d); got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if query.size(-1) != key.size(-1):
        raise ValueError(
            f"query and key must share their last dimension d_k; got query "
            f"{tuple(query.shape)} and key {tuple(key.shape)}"
        )
    if key.size(-2) != value.size(-2):
        raise ValueError(
            f"key and value must have the same length Lk; got key "
            f"{tuple(key.shape)} and value {tuple(value.shape)}"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")

    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)

    if mask is not None:
        check_mask(mask, scores.shape)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)

    # A row with every key blocked would give softmax(-inf, ..., -inf) = NaN.
    # Give it finite scores for the softmax, then zero its weights.
    blocked_row = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., Lq, 1)
    scores = scores.masked_fill(blocked_row, 0.0)
    weights = torch.softmax(scores, dim=-1).masked_fill(blocked_row, 0.0)

    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)

    return weights @ value, weights  # (..., Lq, d_v), (..., Lq, Lk)
