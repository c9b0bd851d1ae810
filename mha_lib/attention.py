"""Scaled dot-product attention, the operation every chapter builds on.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + mask) V

With ``sinks`` (a learned logit per head, as in gpt-oss), the softmax gets one more logit that
belongs to no key: it takes part of every row's weight and hands over nothing.

Shapes use ``...`` for any leading (batch, head) dimensions:
query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, value ``(..., Lk, d_v)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .validation import check_attention_inputs

__all__ = ["scaled_dot_product_attention"]


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Attend from every query to every key and blend the values.

    Args:
        query: ``(..., Lq, d_k)``.
        key: ``(..., Lk, d_k)``.
        value: ``(..., Lk, d_v)``.
        mask: optional, broadcastable to the scores ``(..., Lq, Lk)`` without
            growing them, aligned from the right: ``(Lk,)`` = the keys every
            query may see, ``(Lq, Lk)`` = one pattern for all, and a size 1
            wherever it is shared. For scores ``(B, Lq, Lk)`` (one head) a
            3-D mask is ``(B, Lq, Lk)`` and a key-padding mask is
            ``(B, 1, Lk)``, i.e. ``padding_mask(lengths)[:, 0]``; for scores
            ``(B, H, Lq, Lk)`` see :mod:`mha_lib.validation` (a 3-D mask is
            ``(H, Lq, Lk)`` there). A **boolean** mask means ``True`` = may
            attend, ``False`` = blocked (the convention of
            ``F.scaled_dot_product_attention``; ``nn.MultiheadAttention`` uses
            the opposite). A **float** mask is added to the scores (0 = may
            attend, ``-inf`` = blocked, or any bias); one of only 0s and 1s is
            refused, as it would block nothing: use ``mask.bool()``.
        dropout_p: probability of zeroing an attention weight (the survivors
            are rescaled by ``1 / (1 - dropout_p)``). Pass 0.0 in evaluation.
        sinks: optional float logits, broadcastable to ``(..., Lq, 1)`` without growing the
            scores: one extra logit per row of scores, e.g. ``(H, 1, 1)`` for one per head
            (``MultiHeadAttention(sinks=True)``). Each row's softmax then runs over its ``Lk``
            scores and the sink, and the sink's share is dropped: the weights sum to less
            than 1, and the same as appending to the keys one whose score is the sink and
            whose value is zero (gpt-oss's "attention sinks"; Miller's "softmax plus one"
            for a sink fixed at 0). A row can then put its weight nowhere.

    Returns:
        ``(output, weights)``: output ``(..., Lq, d_v)`` and the weights that
        were applied to the values, ``(..., Lq, Lk)`` (after dropout, so that
        ``output == weights @ value``). With ``sinks`` a row's weights sum to
        ``1 - (the sink's share)``.

    A query whose keys are all blocked gets all-zero weights and a zero output,
    not NaN (softmax over a row of ``-inf`` would be ``0 / 0``); its gradients
    are zero too. A blocked key's value still enters ``weights @ value`` with
    weight 0, and ``0 × NaN`` is NaN: NaN or inf in a masked value (an
    uninitialised pad token, say) makes the outputs NaN, as in PyTorch's own
    kernels, so fill padding with zeros. Bad input (shapes, dtypes, devices,
    masks) gets a ValueError or TypeError that names it
    (:func:`~mha_lib.validation.check_attention_inputs`).
    """
    dropout_p = check_attention_inputs(query, key, value, mask, dropout_p, sinks)

    d_k = query.size(-1)
    if query.dtype == torch.float16:  # Q Kᵀ itself can overflow float16 (above 65504): scale first
        scores = (query / math.sqrt(d_k)) @ key.transpose(-2, -1)  # (..., Lq, Lk)
    else:
        scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., Lq, Lk)

    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)

    if sinks is not None:  # one more logit per row, for no key: (..., Lq, Lk + 1)
        sink_column = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)  # (..., Lq, 1)
        scores = torch.cat([scores, sink_column], dim=-1)

    # A row with every key blocked would give softmax(-inf, ..., -inf) = NaN.
    # Give it finite scores for the softmax, then zero its weights.
    blocked_row = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., Lq, 1)
    scores = scores.masked_fill(blocked_row, 0.0)
    weights = torch.softmax(scores, dim=-1).masked_fill(blocked_row, 0.0)
    if sinks is not None:
        weights = weights[..., :-1]  # the sink's share goes nowhere: (..., Lq, Lk)

    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)

    return weights @ value, weights  # (..., Lq, d_v), (..., Lq, Lk)
