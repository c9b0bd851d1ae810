"""Checks of masks: a bool (True = may attend) or float (added) tensor that broadcasts to the
scores ``(..., Lq, Lk)``; the table of shapes is in :mod:`mha_lib.validation`."""

from __future__ import annotations

import torch
from torch import Tensor

from .sizes import broadcast_shapes

__all__ = ["check_mask", "check_mask_kind"]


def check_mask_kind(mask: Tensor, device: torch.device | None) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask has dtype {mask.dtype}; use a bool mask (True = may attend), "
                        "e.g. mask.bool() or mask != 0, or a float mask that is added to the scores")
    if device is not None and mask.dim() > 0 and mask.device != device:
        raise ValueError(f"mask is on {mask.device} but the attention runs on {device}; put it on the inputs' "
                         "device: mask.to(x.device) for an input x, or device=x.device where you create it")


def _check_float_mask_values(mask: Tensor) -> None:
    """A float mask is added to the scores: one of only 0s and 1s blocks nothing, so it is refused.

    An all-zero float mask is a legitimate "no bias" and passes, as do 0/-inf masks and biases.
    NaN and +inf are refused: either makes the rows it touches NaN.
    """
    with torch.no_grad():
        zero_or_one, has_one, has_nan, has_posinf = torch.stack(
            [((mask == 0) | (mask == 1)).all(), (mask == 1).any(), mask.isnan().any(), mask.isposinf().any()]
        ).tolist()
    if zero_or_one and has_one:
        raise ValueError(
            f"mask is a {mask.dtype} tensor of 0s and 1s, but a float mask is *added* to the scores, "
            "so this one blocks nothing. For keep (1) / block (0) use mask.bool() (True = may attend); "
            "for an additive mask use 0 = may attend and -inf = blocked, e.g. "
            "torch.zeros_like(mask).masked_fill(mask == 0, float('-inf'))"
        )
    if has_nan:
        raise ValueError("mask contains NaN, which would make every score it touches NaN; "
                         "block with -inf (float mask) or False (bool mask)")
    if has_posinf:
        raise ValueError("mask contains +inf, which would make the softmax of its row NaN (inf - inf); "
                         "block with -inf (float mask) or False (bool mask), and favour a key with a finite bias")


def _shape_hint(mask: torch.Size, scores: torch.Size) -> str:
    """What the mask probably meant, for the shapes broadcasting misreads."""
    n, m = len(scores), len(mask)
    if m > n:
        if n == 3 and m == 4 and mask[1:3] == (1, 1):
            return ("; for padding_mask(lengths), which is (B, 1, 1, Lk), on (B, Lq, Lk) scores "
                    "pass padding_mask(lengths)[:, 0], (B, 1, Lk)")
        return f"; the mask has {m} dimensions, the scores only {n}"
    if m >= 1 and mask[-1] not in (1, scores[-1]):
        if m >= 2 and mask[-1] == scores[-2] and mask[-2] == scores[-1]:
            return "; is it transposed? Rows are queries, columns are keys: (..., Lq, Lk)"
        return f"; its last size must be Lk={scores[-1]} (one entry per key) or 1"
    pad = "(B, 1, 1, Lk): padding_mask(lengths), or mask[:, None, None, :]"
    if n == 3:
        pad = "(B, 1, Lk): padding_mask(lengths)[:, 0], or mask[:, None, :]"
    if n >= 3 and m == 2 and mask[0] == scores[0] != scores[-2]:
        return (f"; a 2-D mask is read as (Lq, Lk), one row per query, but this one has B={scores[0]} "
                f"rows, like a key-padding mask (B, Lk): pass it as {pad}")
    if n == 4 and m == 3 and mask[0] == scores[0] != scores[1]:
        return (f"; a 3-D mask is read as (H, Lq, Lk), one pattern per head, but its first size is "
                f"B={scores[0]}, not H={scores[1]}: for one pattern per sequence, shared by the heads, "
                f"add a head axis: mask[:, None], {(mask[0], 1, *mask[1:])}")
    if n == 4 and m == 4 and mask[0] == scores[1] != scores[0] and mask[1] == 1:
        return (f"; the first axis of a 4-D mask is the batch (B={scores[0]}), but this one has "
                f"H={scores[1]} entries there, like an (H, 1, Lq, Lk) per-head mask: pass it as "
                "(H, Lq, Lk), i.e. mask[:, 0], or as (1, H, Lq, Lk), i.e. mask.transpose(0, 1)")
    return ""


def _fits(mask: torch.Size, scores: tuple[int, ...]) -> bool:
    """Whether a mask of at most as many dimensions broadcasts to the scores without growing them."""
    return all(m == 1 or m == n for m, n in zip(reversed(mask), reversed(scores)))


def check_mask(mask: Tensor, scores_shape: torch.Size, device: torch.device | None = None,
               values: bool = True) -> None:
    """Raise a clear error if ``mask`` can't be used on scores of ``scores_shape``.

    A mask must be boolean (True = may attend) or floating point (added to the scores), and
    must broadcast to the scores' shape ``(..., Lq, Lk)`` without growing it (see the table in
    this module's docstring). Refused, besides: integer masks (``0/1`` would silently be
    *added*), float masks of only 0s and 1s (the same mistake; an all-zero float mask is
    a valid "no bias" and passes), float masks with NaN or +inf, and a mask on another ``device``.
    ``values=False`` skips reading a float mask's values (a host sync on a GPU); the modules always read them,
    with a cache too (a 0/1 float mask blocks nothing while decoding either).
    """
    if (isinstance(mask, Tensor) and (mask.dtype == torch.bool or (not values and mask.is_floating_point()))
            and mask.ndim <= len(scores_shape)
            and (device is None or mask.device == device) and _fits(mask.shape, scores_shape)):
        return  # the common case (a mask a caller checked or built, checked again per layer): comparisons only
    check_mask_kind(mask, device)
    scores_shape = torch.Size(scores_shape)
    try:
        broadcast = broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        names = {3: "(B, Lq, Lk)", 4: "(B, H, Lq, Lk)"}.get(len(scores_shape), "(..., Lq, Lk)")
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores' shape {tuple(scores_shape)} {names}{_shape_hint(mask.shape, scores_shape)}"
        )
    if values and mask.is_floating_point() and mask.numel() > 0:
        _check_float_mask_values(mask)


