"""The input checks of the attention code, in one place.

Every attention module (:class:`~mha_lib.AttentionHead`, :class:`~mha_lib.MultiHeadAttention`,
:class:`~mha_lib.EfficientMultiHeadAttention`) and :func:`~mha_lib.scaled_dot_product_attention`
call these first, so that their own code reads as the maths. An error says what was given,
what was expected and how to fix it, before PyTorch fails with a message about its internals
(or, worse, computes something wrong without failing).

Masks (True = may attend, or float = added to the scores) are matched against the scores
``(..., Lq, Lk)`` by broadcasting, aligned from the right. For the modules' scores
``(B, H, Lq, Lk)`` that means:

==================  ==============================================================
mask shape          meaning
==================  ==============================================================
``(Lk,)``           which keys every query may see
``(Lq, Lk)``        one pattern for every sequence and head (``causal_mask(L)``)
``(H, Lq, Lk)``     one pattern per head, shared by the sequences (chapter 06)
``(1, H, Lq, Lk)``  the same, written out
``(B, 1, 1, Lk)``   which keys each sequence may see (``padding_mask(lengths)``)
``(B, 1, Lq, Lk)``  one pattern per sequence, shared by the heads
``(B, H, Lq, Lk)``  one pattern per sequence and head
==================  ==============================================================

Broadcasting can't tell two shapes apart when their sizes coincide: a 2-D mask is always
``(Lq, Lk)``, also when ``B == Lq`` (a key-padding mask ``(B, Lk)`` must be given as
``(B, 1, 1, Lk)``), and a 3-D mask is always ``(H, Lq, Lk)``, also when ``B == H`` (one
pattern per sequence must be given as ``(B, 1, Lq, Lk)``). Where the sizes differ, such a
mask fails to broadcast and the error names the shape to use instead.
"""

from __future__ import annotations

import numbers
import operator

import torch
from torch import Tensor

__all__ = ["check_attention_inputs", "check_dropout", "check_heads", "check_mask", "check_positive_int",
           "check_qkv", "check_sequence"]


def _as_int(value: object, name: str) -> int:
    """``value`` as an ``int`` if it is a whole number (``int``, ``np.int64``...), else a ValueError.

    A ``bool`` is refused although Python counts it as an int, and so are ``2.0`` and ``"2"``.
    """
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    hint = ""
    if isinstance(value, float) and value.is_integer():
        hint = f"; write {int(value)}, without the decimal point"
    elif isinstance(value, str) and value.strip().isdigit():
        hint = f"; write {int(value)}, without the quotes"
    elif isinstance(value, bool):
        hint = "; a size is a number, not a flag"
    raise ValueError(f"{name} must be a positive int, got {value!r} (a {type(value).__name__}){hint}")


def check_positive_int(value: object, name: str) -> int:
    """``value`` as an ``int`` if it is a whole number >= 1, else a ValueError that names it."""
    number = _as_int(value, name)
    if number < 1:
        raise ValueError(f"{name} must be a positive int, got {number}")
    return number


def check_dropout(value: object, name: str = "dropout") -> float:
    """``value`` as a ``float`` if it is a probability in ``[0, 1)``, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ""
        if isinstance(value, bool) and name == "dropout":
            hint = (": a bool is not a probability; dropout is the argument after num_heads, "
                    "pass the others by name, e.g. bias=False")
        raise ValueError(f"{name} must be in [0, 1), got {value!r} (a {type(value).__name__}){hint}")
    if not 0.0 <= value < 1.0:  # NaN fails too
        raise ValueError(f"{name} must be in [0, 1), got {value}: the probability of zeroing an attention weight")
    return float(value)


def check_heads(d_model: object, num_heads: object, dropout: object = 0.0) -> tuple[int, int, float]:
    """The configuration of a multi-head module, checked: ``(d_model, num_heads, dropout)``.

    ``num_heads`` must divide ``d_model``, so that every head gets ``d_k = d_model // num_heads``
    features, at least one.
    """
    d_model, num_heads = _as_int(d_model, "d_model"), _as_int(num_heads, "num_heads")
    if num_heads < 1 or d_model < 1:
        raise ValueError(f"d_model and num_heads must be positive, got d_model={d_model}, num_heads={num_heads}")
    if num_heads > d_model:
        raise ValueError(f"num_heads={num_heads} is more than d_model={d_model}: each head would get "
                         f"d_k = d_model // num_heads = 0 features; use at most {d_model} heads")
    if d_model % num_heads != 0:
        raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}: "
                         f"every head needs the same share of the {d_model} features")
    return d_model, num_heads, check_dropout(dropout)


def _autocast_on(device: torch.device) -> bool:
    """Under ``torch.autocast`` PyTorch mixes dtypes on purpose, so they are not checked there."""
    try:
        return torch.is_autocast_enabled(device.type)
    except RuntimeError:  # a device type autocast doesn't know, e.g. "meta"
        return False


def _check_like(name: str, x: Tensor, weight: Tensor) -> None:
    """``x`` must be on the device and of the dtype of the module's ``weight``."""
    if x.device != weight.device:
        raise ValueError(f"{name} is on {x.device} but the module's weights are on {weight.device}; move one to "
                         f"the other, e.g. {name}.to({str(weight.device)!r}) or module.to({str(x.device)!r})")
    if x.dtype != weight.dtype and not _autocast_on(x.device):
        hint = (" (token ids? embed them first, e.g. with nn.Embedding)" if not x.is_floating_point()
                else f" or module.to({x.dtype})")
        raise TypeError(f"{name} has dtype {x.dtype} but the module's weights are {weight.dtype}; "
                        f"convert one to the other: {name}.to({weight.dtype}){hint}")


def check_sequence(x: Tensor, name: str, d_model: int, *, weight: Tensor | None = None) -> None:
    """Raise a clear error unless ``x`` is a ``(B, L, d_model)`` tensor (of ``weight``'s dtype and device)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 3 or x.size(-1) != d_model:
        raise ValueError(f"{name} must have shape (B, L, d_model={d_model}), got {tuple(x.shape)}")
    if weight is not None:
        _check_like(name, x, weight)


def check_qkv(
    query: Tensor, key: Tensor, value: Tensor, d_model: int, *, weight: Tensor | None = None, mask: Tensor | None = None
) -> None:
    """Raise a clear error unless query ``(B, Lq, d_model)``, key and value ``(B, Lk, d_model)`` fit.

    Shared by the attention modules, so that they refuse bad input alike. With ``weight``
    (one of the module's weights), the inputs must also have its dtype and device; ``mask``
    is checked for its type, dtype and device (its shape is checked against the scores by
    :func:`check_mask`).
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        check_sequence(x, name, d_model, weight=weight)
    if not query.size(0) == key.size(0) == value.size(0):
        raise ValueError(f"query, key and value must have the same batch size, got "
                         f"{query.size(0)}, {key.size(0)}, {value.size(0)}")
    if key.size(1) != value.size(1):
        raise ValueError(f"key and value must have the same length Lk, got {key.size(1)} and {value.size(1)}")
    if mask is not None:
        _check_mask_kind(mask, query.device)


def _check_mask_kind(mask: Tensor, device: torch.device | None) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask has dtype {mask.dtype}; use a bool mask (True = may attend), "
                        "e.g. mask.bool() or mask != 0, or a float mask that is added to the scores")
    if device is not None and mask.dim() > 0 and mask.device != device:
        raise ValueError(f"mask is on {mask.device} but the attention runs on {device}; "
                         f"move it there with mask.to({str(device)!r})")


def _check_float_mask_values(mask: Tensor) -> None:
    """A float mask is added to the scores: one of only 0s and 1s blocks nothing, so it is refused.

    An all-zero float mask is a legitimate "no bias" and passes, as do 0/-inf masks and biases.
    """
    with torch.no_grad():
        zero_or_one, has_one, has_nan = torch.stack(
            [((mask == 0) | (mask == 1)).all(), (mask == 1).any(), mask.isnan().any()]
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


def check_mask(mask: Tensor, scores_shape: torch.Size, device: torch.device | None = None) -> None:
    """Raise a clear error if ``mask`` can't be used on scores of ``scores_shape``.

    A mask must be boolean (True = may attend) or floating point (added to the scores), and
    must broadcast to the scores' shape ``(..., Lq, Lk)`` without growing it (see the table in
    this module's docstring). Refused, besides: integer masks (``0/1`` would silently be
    *added*), float masks of only 0s and 1s (the same mistake; an all-zero float mask is
    a valid "no bias" and passes), float masks with NaN, and a mask on another ``device``.
    """
    _check_mask_kind(mask, device)
    scores_shape = torch.Size(scores_shape)
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores_shape:
        names = {3: "(B, Lq, Lk)", 4: "(B, H, Lq, Lk)"}.get(len(scores_shape), "(..., Lq, Lk)")
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention "
            f"scores' shape {tuple(scores_shape)} {names}{_shape_hint(mask.shape, scores_shape)}"
        )
    if mask.is_floating_point() and mask.numel() > 0:
        _check_float_mask_values(mask)


def check_attention_inputs(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, dropout_p: object = 0.0
) -> float:
    """The checks of :func:`~mha_lib.scaled_dot_product_attention`; returns ``dropout_p`` as a float.

    query ``(..., Lq, d_k)``, key ``(..., Lk, d_k)``, value ``(..., Lk, d_v)``: floating point,
    one dtype (except under ``torch.autocast``) and one device, ``d_k >= 1``, and leading
    dimensions that broadcast; ``mask`` as :func:`check_mask` says, on the scores' shape.
    """
    tensors = (("query", query), ("key", key), ("value", value))
    for name, x in tensors:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    q, k, v = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(f"query, key and value need at least 2 dimensions (..., L, d); got {q}, {k}, {v}")
    for name, x in tensors:
        if not x.is_floating_point():
            raise TypeError(f"{name} has dtype {x.dtype}; attention needs floating-point vectors, e.g. {name}.float()")
        if x.device != query.device:
            raise ValueError(f"query is on {query.device} but {name} is on {x.device}; move them to one device")
        if x.dtype != query.dtype and not _autocast_on(query.device):
            raise TypeError(f"query has dtype {query.dtype} but {name} has {x.dtype}; convert them to one dtype, "
                            f"e.g. {name}.to({query.dtype})")
    if query.size(-1) != key.size(-1):
        raise ValueError(f"query and key must share their last dimension d_k; got query {q} and key {k}")
    if query.size(-1) == 0:
        raise ValueError(f"query and key have d_k = 0 features, got {q}: the scores would be 0 / sqrt(0) = NaN")
    if key.size(-2) != value.size(-2):
        raise ValueError(f"key and value must have the same length Lk; got key {k} and value {v}")
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch, head) dimensions of query {q}, key {k} and value {v} don't broadcast: "
                         "each must be equal or 1, aligned from the right") from None
    if mask is not None:
        scores_shape = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2]) + (query.size(-2), key.size(-2))
        check_mask(mask, scores_shape, query.device)  # scores (..., Lq, Lk)
    return check_dropout(dropout_p, "dropout_p")
