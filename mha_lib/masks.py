"""Boolean attention masks: ``True`` = may attend, ``False`` = blocked.

Both masks are shaped to broadcast against scores ``(B, H, Lq, Lk)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["causal_mask", "padding_mask"]


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular mask: query ``i`` may attend to keys ``0 … i``.

    Returns a bool tensor ``(seq_len, seq_len)``; row = query, column = key.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: Tensor | Sequence[int], max_len: int | None = None) -> Tensor:
    """Mask out the padding at the end of each sequence in a batch.

    Args:
        lengths: ``(B,)`` true length of each sequence (a tensor or a list of ints).
        max_len: padded length ``Lk``; defaults to ``max(lengths)``.

    Returns:
        bool ``(B, 1, 1, Lk)``: ``mask[b, 0, 0, j]`` is True when ``j < lengths[b]``.
        It broadcasts over heads and queries of scores ``(B, H, Lq, Lk)``.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.numel() == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence, got shape {tuple(lengths.shape)}")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if (lengths < 0).any():
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max())
    if max_len is None:
        max_len = longest
    elif max_len < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest sequence ({longest})")
    positions = torch.arange(max_len, device=lengths.device)  # (Lk,)
    return (positions < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Lk)


def sliding_window_mask(seq_len: int, window: int, device: torch.device | str | None = None) -> Tensor:
    """Causal local attention: query ``i`` may attend to the ``window`` keys ``i - window + 1 … i``.

    ``mask[i, j]`` is True exactly where ``0 <= i - j < window`` (Mistral's sliding window,
    Longformer's local attention made causal). With ``window >= seq_len`` it equals
    :func:`causal_mask`; with ``window = 1`` every token sees only itself.

    Returns a bool tensor ``(seq_len, seq_len)``; row = query, column = key.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int (the number of keys each query sees), got {window!r}")
    i = torch.arange(seq_len, device=device)[:, None]  # (L, 1) queries
    j = torch.arange(seq_len, device=device)[None, :]  # (1, L) keys
    return (i - j >= 0) & (i - j < window)  # (L, L)


__all__ += ["sliding_window_mask"]
