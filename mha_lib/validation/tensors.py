"""Checks of tensors: the ``(B, L, d_model)`` inputs of a module, a decoding cache, and the
inputs of :func:`~mha_lib.scaled_dot_product_attention`."""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from .masks import check_mask, check_mask_kind
from .sizes import broadcast_shapes, check_dropout, check_flag


class DecodingCache(Protocol):
    """What :func:`check_cache` asks of a decoding cache (:class:`~mha_lib.KVCache`,
    :class:`~mha_lib.LatentCache`): a structural type, so that the validation package never
    imports the inference module, which imports it."""

    def __len__(self) -> int: ...

    def claim(self, owner: Any) -> None: ...

    def extend(self, *args: Any, **kwargs: Any) -> Any: ...

__all__ = ["check_attention_inputs", "check_cache", "check_forward", "check_positions", "check_qkv", "check_sequence",
           "check_sinks", "same_tensor"]


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
    check_sequence(query, "query", d_model, weight=weight)
    if key is not query:  # self-attention passes one tensor: checked once
        check_sequence(key, "key", d_model, weight=weight)
    if value is not key and value is not query:
        check_sequence(value, "value", d_model, weight=weight)
    if not query.size(0) == key.size(0) == value.size(0):
        raise ValueError(f"query, key and value must have the same batch size, got "
                         f"{query.size(0)}, {key.size(0)}, {value.size(0)}")
    if key.size(1) != value.size(1):
        raise ValueError(f"key and value must have the same length Lk, got {key.size(1)} and {value.size(1)}")
    if mask is not None:
        check_mask_kind(mask, query.device)


def same_tensor(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same numbers in the same memory: the same object, or two
    views with one start, shape and strides (``x[:, :3]`` taken twice). No data is read."""
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
                      and a.dtype == b.dtype and a.device == b.device)


def check_cache(cache: DecodingCache | None, query: Tensor, key: Tensor, value: Tensor, owner: Any = None) -> int:
    """The number ``T`` of positions already cached (0 without a cache); a clear error for misuse.

    A cache serves self-attention (one tensor as query, key and value, recognised by its memory)
    and one layer: ``owner``, the module that calls, must be the one that filled it.
    """
    if cache is None:
        return 0
    claim = getattr(cache, "claim", None)
    if not (callable(claim) and hasattr(cache, "extend") and hasattr(cache, "__len__")):
        raise TypeError(f"cache must be a mha_lib.KVCache, got {type(cache).__name__}")
    if not (query is key is value or (same_tensor(query, key) and same_tensor(key, value))):
        raise ValueError(
            "a KVCache works for self-attention only: pass the same tensor as query, key and value "
            "(cross-attention attends to a fixed memory, whose keys and values never grow)"
        )
    claim(owner)
    return len(cache)


def _output_weight(module: Any) -> Tensor:
    """``module.W_o.weight``, whose dtype and device the inputs must have, read from the dicts in which
    ``nn.Module`` keeps it: ``module.W_o.weight`` goes through ``nn.Module.__getattr__`` twice, each after
    a failed ordinary lookup, 1.4 µs together, 1 % of a decoding step of a 512-wide layer."""
    try:
        return module._modules["W_o"]._parameters["weight"]
    except (AttributeError, KeyError):
        return module.W_o.weight


def check_positions(module: Any, positions: object, query: Tensor, key: Tensor) -> None:
    """A clear error unless ``positions`` fits a rotary module's self-attention input ``query``
    ``(B, L, d_model)``: an integer tensor ``(L,)``, ``(1, L)`` or ``(B, L)`` on the input's device."""
    if not getattr(module, "rotary", False):
        raise ValueError("positions are RoPE's: they rotate the queries and keys of a module built with rotary=True; "
                         "this one has rotary=False (learned or sinusoidal positions are added to the input instead)")
    if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.is_complex() \
            or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor (L,), (1, L) or (B, L), "
                        f"got {getattr(positions, 'dtype', type(positions).__name__)!r}")
    B, L = query.shape[:2]
    if key.size(1) != L:
        raise ValueError(f"positions number the tokens of self-attention, where the queries are the keys; got "
                         f"{L} queries and {key.size(1)} keys (without positions, each side counts from its start)")
    if positions.shape not in ((L,), (1, L), (B, L)):
        raise ValueError(f"positions must have shape (L,) = ({L},), (1, L) or (B, L) = ({B}, {L}), "
                         f"got {tuple(positions.shape)}")
    if positions.device != query.device:
        raise ValueError(f"positions is on {positions.device} but the input is on {query.device}; "
                         f"move it, e.g. positions.to({str(query.device)!r})")


def check_forward(module: Any, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
                  cache: DecodingCache | None, return_weights: object = False, positions: object = None) -> int:
    """Every check of a multi-head ``forward``, once, at the door; returns ``T`` (cached positions).

    query ``(B, Lq, d_model)``, key and value ``(B, Lk, d_model)`` of the module's dtype and
    device; ``cache`` as :func:`check_cache` says; ``mask`` against the scores
    ``(B, H, Lq, T + Lk)``; ``positions`` as :func:`check_positions` says. A float mask's values
    are read (a host sync), while decoding too. Self-attention on a well-formed input, the step a decoder repeats, costs a few comparisons.
    """
    weight = _output_weight(module)
    fits = (query is key is value and isinstance(query, Tensor) and query.ndim == 3  # the common case
            and query.shape[2] == module.d_model and query.dtype == weight.dtype and query.device == weight.device)
    if not fits:
        check_qkv(query, key, value, module.d_model, weight=weight)
    if return_weights is not False and return_weights is not True:
        check_flag(return_weights, "return_weights")
    past = 0 if cache is None else check_cache(cache, query, key, value, owner=module)
    if mask is not None:
        scores = (query.size(0), module.num_heads, query.size(1), past + key.size(1))  # (B, H, Lq, T + Lk)
        check_mask(mask, torch.Size(scores), query.device)  # values too: a 0/1 float mask is refused with a cache as without
    if positions is not None:
        check_positions(module, positions, query, key)
    return past


def check_sinks(sinks: object, scores_shape: torch.Size, dtype: torch.dtype, device: torch.device) -> None:
    """A clear error unless ``sinks`` is a floating-point tensor on ``device`` that broadcasts to
    ``scores_shape[:-1] + (1,)`` (one logit per row of scores) without growing the scores, free of
    NaN and +inf (its values are read: a host sync)."""
    if not isinstance(sinks, Tensor):
        raise TypeError(f"sinks must be a torch.Tensor of logits, e.g. (H, 1, 1) for one per head, "
                        f"got {type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be floating-point logits, got dtype {sinks.dtype}; e.g. sinks.float()")
    if sinks.device != device:
        raise ValueError(f"sinks is on {sinks.device} but query is on {device}; move it, e.g. sinks.to({str(device)!r})")
    if sinks.dtype != dtype and not _autocast_on(device):
        raise TypeError(f"sinks has dtype {sinks.dtype} but query has {dtype}; e.g. sinks.to({dtype})")
    rows = tuple(scores_shape[:-1]) + (1,)  # (..., Lq, 1)
    try:
        grows = broadcast_shapes(sinks.shape, rows) != rows
    except RuntimeError:
        grows = True
    if grows:
        raise ValueError(f"sinks of shape {tuple(sinks.shape)} does not broadcast to the rows of the scores "
                         f"{rows} (one logit per row): give e.g. (H, 1, 1) for one sink per head")
    if torch.isnan(sinks).any() or torch.isposinf(sinks).any():  # -inf is allowed: a sink that takes nothing
        raise ValueError("sinks holds NaN or +inf: a sink logit must be a number or -inf (no sink); "
                         "+inf would take every weight and make the softmax NaN")


def check_attention_inputs(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, dropout_p: object = 0.0,
    sinks: Tensor | None = None,
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
    if not query.dim() == key.dim() == value.dim():
        raise ValueError(f"query, key and value must have the same number of dimensions, got {q}, {k}, {v}: "
                         "with fewer, a key's batch axis would line up with the query's head axis; "
                         "add the missing axes, e.g. key[:, None] for (B, 1, Lk, d_k)")
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
        broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise ValueError(f"the leading (batch, head) dimensions of query {q}, key {k} and value {v} don't broadcast: "
                         "each must be equal or 1, aligned from the right") from None
    if mask is not None:
        scores_shape = broadcast_shapes(query.shape[:-2], key.shape[:-2]) + (query.size(-2), key.size(-2))
        check_mask(mask, scores_shape, query.device)  # scores (..., Lq, Lk)
    if sinks is not None:
        scores_shape = broadcast_shapes(query.shape[:-2], key.shape[:-2]) + (query.size(-2), key.size(-2))
        check_sinks(sinks, scores_shape, query.dtype, query.device)
    return check_dropout(dropout_p, "dropout_p")
