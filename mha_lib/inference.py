"""Attention at inference: fewer key/value heads (MQA/GQA) and a key/value cache.

Grouped-query attention (GQA, Ainslie et al., 2023) gives ``H`` query heads only ``H_kv``
key/value heads; each group of ``H // H_kv`` consecutive query heads shares one. Multi-query
attention (MQA, Shazeer, 2019) is the extreme ``H_kv = 1``; ``H_kv = H`` is plain multi-head
attention. :func:`repeat_kv` copies each key/value head to its group, so that the usual
per-head attention applies.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["repeat_kv", "check_num_kv_heads"]


def check_num_kv_heads(num_heads: int, num_kv_heads: int | None) -> int:
    """``num_kv_heads``, defaulting to ``num_heads``; a clear error unless it divides ``num_heads``."""
    if num_kv_heads is None:
        return num_heads
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int) or num_kv_heads < 1:
        raise ValueError(f"num_kv_heads must be a positive int, got {num_kv_heads!r}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}: every key/value "
            f"head must serve the same number of query heads"
        )
    return num_kv_heads


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, H_kv, L, d_k) -> (B, H_kv * n_rep, L, d_k)``: each head repeated ``n_rep`` times in a row.

    Output head ``h`` is input head ``h // n_rep``, so query heads ``0 … n_rep - 1`` share key/value
    head 0, the next ``n_rep`` share head 1, and so on: the grouping of Hugging Face's
    ``repeat_kv`` and of ``F.scaled_dot_product_attention(..., enable_gqa=True)``
    (``torch.repeat_interleave`` on the head axis). ``n_rep = 1`` returns ``x`` itself.
    """
    if x.dim() != 4:
        raise ValueError(f"repeat_kv expects (B, H_kv, L, d_k), got shape {tuple(x.shape)}")
    if isinstance(n_rep, bool) or not isinstance(n_rep, int) or n_rep < 1:
        raise ValueError(f"n_rep must be a positive int, got {n_rep!r}")
    if n_rep == 1:
        return x
    B, H_kv, L, d_k = x.shape
    x = x[:, :, None].expand(B, H_kv, n_rep, L, d_k)  # (B, H_kv, n_rep, L, d_k), a view
    return x.reshape(B, H_kv * n_rep, L, d_k)  # (B, H, L, d_k), one copy
