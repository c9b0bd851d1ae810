"""Boolean attention masks: ``True`` = may attend, ``False`` = blocked.

Each is shaped to broadcast against the multi-head scores ``(B, H, Lq, Lk)``:
``causal_mask(L)`` and ``sliding_window_mask(L, W)`` are ``(L, L)``, one pattern for every
sequence and head, and ``padding_mask(lengths)`` is ``(B, 1, 1, Lk)``, each sequence's real
keys for all of its heads and queries. For one head's scores ``(B, Lq, Lk)`` (``AttentionHead``, or
:func:`~mha_lib.scaled_dot_product_attention` on 3-D inputs) use
``padding_mask(lengths)[:, 0]``, ``(B, 1, Lk)``. Combine them with ``&``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .validation import check_device, check_positive_int, check_whole

__all__ = ["causal_mask", "padding_mask", "sliding_window_mask"]


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> Tensor:
    """Lower-triangular mask: query ``i`` may attend to keys ``0 … i``.

    Returns a bool tensor ``(seq_len, seq_len)``; row = query, column = key. It broadcasts
    over every leading dimension of the scores: ``(B, L, L)`` or ``(B, H, L, L)``.
    """
    seq_len, device = check_positive_int(seq_len, "seq_len"), check_device(device)
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: Tensor | Sequence[int], max_len: int | None = None) -> Tensor:
    """Mask out the padding at the end of each sequence in a batch.

    Args:
        lengths: ``(B,)`` true length of each sequence (a tensor or a list of ints).
        max_len: padded length ``Lk``; defaults to ``max(lengths)``. Pass the padded
            length of the batch whenever it can be longer than the longest sequence.

    Returns:
        bool ``(B, 1, 1, Lk)``: ``mask[b, 0, 0, j]`` is True when ``j < lengths[b]``.
        It broadcasts over heads and queries of scores ``(B, H, Lq, Lk)``; for one
        head's scores ``(B, Lq, Lk)`` take ``padding_mask(lengths)[:, 0]``, ``(B, 1, Lk)``.
        Never pass it as a 2-D ``(B, Lk)`` mask: a 2-D mask is read as ``(Lq, Lk)``.
    """
    try:
        lengths = torch.as_tensor(lengths)
    except (TypeError, ValueError, RuntimeError):  # None, a string, a set, a list of strings...
        raise TypeError(f"lengths must be a 1-D tensor or list of ints, the true length of each sequence, "
                        f"e.g. [3, 5]; got {lengths!r} (a {type(lengths).__name__})") from None
    if lengths.dim() != 1 or lengths.numel() == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence, got shape {tuple(lengths.shape)}")
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if (lengths < 0).any():
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    longest = int(lengths.max())
    if max_len is None:
        max_len = longest
    else:
        max_len = check_whole(max_len, "max_len")  # an int, a NumPy int, or a 0-d tensor such as lengths.max()
        if max_len < longest:
            raise ValueError(f"max_len={max_len} is shorter than the longest sequence ({longest})")
    positions = torch.arange(max_len, device=lengths.device)  # (Lk,)
    return (positions < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Lk)


def sliding_window_mask(seq_len: int, window: int, device: torch.device | str | None = None,
                        sinks: int = 0) -> Tensor:
    """Causal local attention: query ``i`` may attend to the ``window`` keys ``i - window + 1 … i``.

    ``mask[i, j]`` is True exactly where ``0 <= i - j < window`` (Mistral's sliding window,
    Longformer's local attention made causal). ``window`` counts the keys a query sees, itself
    included, the convention of chapters 11 and 12 (the Mistral paper writes the span as
    ``i - W … i``, one key more). With ``window >= seq_len`` it equals :func:`causal_mask`; with
    ``window = 1`` every token sees only itself.

    ``sinks``: the first ``sinks`` positions stay visible to every later query, outside the
    window too (attention sinks, StreamingLLM: Xiao et al., 2024).

    Returns a bool tensor ``(seq_len, seq_len)``; row = query, column = key.
    """
    seq_len = check_positive_int(seq_len, "seq_len")
    window = check_positive_int(window, "window")  # the number of keys each query sees
    sinks = check_whole(sinks, "sinks", "an int >= 0")
    if sinks < 0:
        raise ValueError(f"sinks must be an int >= 0 (the first positions every query keeps), got {sinks}")
    device = check_device(device)
    i = torch.arange(seq_len, device=device)[:, None]  # (L, 1) queries
    j = torch.arange(seq_len, device=device)[None, :]  # (1, L) keys
    return (i - j >= 0) & ((i - j < window) | (j < sinks))  # (L, L)
