"""How much a head behaves like a previous-token, an induction or a "self" head.

Each score is a mean attention weight on a chosen key, per head, over queries and batch:

- :func:`previous_token_score`: query ``t`` -> key ``t - 1`` (``t >= 1``).
- :func:`self_score`: query ``t`` -> key ``t`` (``t >= 1``; query 0 can only see itself).
- :func:`induction_score`: in the second copy, query ``second + i`` -> key ``first + i + 1``,
  the token that followed the current token's earlier occurrence (``i = 0 ... length - 2``,
  the queries whose next token is predictable).
- :func:`duplicate_token_score`: the same queries -> key ``first + i``, the earlier occurrence
  of the current token itself (a "duplicate-token head").

A score only means something next to what a head that attends uniformly to the past
would get: :func:`uniform_previous_token_score` (also the self baseline) and
:func:`uniform_induction_score` (also the duplicate-token baseline), the mean of ``1 / (t + 1)``
over the same queries.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..validation import check_positive_int
from .data import RepeatBatch

__all__ = ["duplicate_token_score", "induction_score", "induction_queries", "previous_token_score", "self_score",
           "uniform_induction_score", "uniform_previous_token_score"]


def _check_batch(batch: object) -> None:
    if not isinstance(batch, RepeatBatch):
        raise TypeError(f"batch must be the RepeatBatch the weights were computed on (from repeated_segments), "
                        f"got {type(batch).__name__}")


def _check_weights(weights: Tensor) -> tuple[int, int, int]:
    if not isinstance(weights, Tensor) or weights.dim() != 4 or weights.size(-1) != weights.size(-2):
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(f"weights must be one layer's attention weights (B, H, L, L), got {shape}; "
                         "model(tokens, return_weights=True)[1][layer] has that shape")
    if not weights.is_floating_point():
        raise TypeError(f"weights must be attention weights, floating point, got dtype {weights.dtype}")
    B, H, L, _ = weights.shape
    return B, H, L


def previous_token_score(weights: Tensor) -> Tensor:
    """``(H,)``: the mean weight from query ``t`` to key ``t - 1``, over ``t >= 1`` and the batch."""
    B, H, L = _check_weights(weights)
    if L < 2:
        raise ValueError("previous_token_score needs sequences of at least 2 tokens")
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))  # w[b, h, t, t-1]


def self_score(weights: Tensor) -> Tensor:
    """``(H,)``: the mean weight from query ``t`` to key ``t`` (itself), over ``t >= 1`` and the batch."""
    B, H, L = _check_weights(weights)
    if L < 2:
        raise ValueError("self_score needs sequences of at least 2 tokens")
    return weights.diagonal(dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2))


def uniform_previous_token_score(seq_len: int) -> float:
    """The previous-token (and self) score of uniform causal attention: mean of ``1 / (t + 1)``, ``t = 1 ... L - 1``."""
    seq_len = check_positive_int(seq_len, "seq_len")
    if seq_len < 2:
        raise ValueError("seq_len must be at least 2")
    return sum(1.0 / (t + 1) for t in range(1, seq_len)) / (seq_len - 1)


def induction_queries(batch: RepeatBatch) -> tuple[Tensor, Tensor]:
    """``(queries, keys)``: bool ``(B, L)``, True at the scored queries, and long ``(B, L)``, each query's key.

    Query ``second + i`` (``0 <= i <= length - 2``) has key ``first + i + 1``; the key of
    other positions is 0 and meaningless.
    """
    _check_batch(batch)
    L = batch.tokens.size(1)
    t = torch.arange(L, device=batch.tokens.device)  # (L,)
    second, first, length = batch.second[:, None], batch.first[:, None], batch.length[:, None]
    queries = (t >= second) & (t <= second + length - 2)  # (B, L)
    keys = torch.where(queries, t - second + first + 1, torch.zeros_like(t))  # (B, L)
    return queries, keys


def _score_on_keys(weights: Tensor, batch: RepeatBatch, shift: int) -> Tensor:
    """``(H,)``: mean weight from each induction query to its induction key moved by ``shift``."""
    B, H, L = _check_weights(weights)
    _check_batch(batch)
    if tuple(batch.tokens.shape) != (B, L):
        raise ValueError(f"weights {tuple(weights.shape)} don't belong to a batch of tokens {tuple(batch.tokens.shape)}")
    queries, keys = induction_queries(batch)  # (B, L), (B, L)
    queries, keys = queries.to(weights.device), (keys + shift * queries).to(weights.device)
    picked = weights.gather(-1, keys[:, None, :, None].expand(B, H, L, 1)).squeeze(-1)  # (B, H, L): w[b, h, t, key(t)]
    return (picked * queries[:, None]).sum(dim=(0, 2)) / queries.sum()


def duplicate_token_score(weights: Tensor, batch: RepeatBatch) -> Tensor:
    """``(H,)``: the mean weight from query ``second + i`` to key ``first + i``, the same token's earlier occurrence.

    The queries are those of :func:`induction_score`; its uniform baseline applies.
    """
    return _score_on_keys(weights, batch, shift=-1)


def induction_score(weights: Tensor, batch: RepeatBatch) -> Tensor:
    """``(H,)``: the mean weight from each query in the second copy to the token after its earlier occurrence.

    Args:
        weights: ``(B, H, L, L)``, one layer's attention on ``batch.tokens``.
        batch: the :class:`~mha_lib.induction.RepeatBatch` the weights were computed on.
    """
    return _score_on_keys(weights, batch, shift=0)


def uniform_induction_score(batch: RepeatBatch) -> float:
    """The induction score of uniform causal attention: mean of ``1 / (t + 1)`` over the same queries."""
    queries, _ = induction_queries(batch)  # checks the batch
    t = torch.arange(batch.tokens.size(1), dtype=torch.float64)
    return ((1.0 / (t + 1)) * queries).sum().item() / queries.sum().item()
