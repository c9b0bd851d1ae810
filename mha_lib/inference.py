"""Attention at inference: fewer key/value heads (MQA/GQA) and a key/value cache.

Grouped-query attention (GQA, Ainslie et al., 2023) gives ``H`` query heads only ``H_kv``
key/value heads; each group of ``H // H_kv`` consecutive query heads shares one. Multi-query
attention (MQA, Shazeer, 2019) is the extreme ``H_kv = 1``; ``H_kv = H`` is plain multi-head
attention. :func:`repeat_kv` copies each key/value head to its group, so that the usual
per-head attention applies.

A :class:`KVCache` keeps one attention layer's keys and values while a decoder generates:
each step projects only the new tokens, appends their keys and values, and lets the new
queries attend to everything so far. Pass one to ``forward(x, x, x, cache=cache)`` of
:class:`~mha_lib.MultiHeadAttention` or :class:`~mha_lib.EfficientMultiHeadAttention`.
"""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

from .validation import check_mask_kind, check_positive_int, check_whole, describe

__all__ = ["KVCache", "kv_cache_bytes", "repeat_kv"]


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """``(B, H_kv, L, d_k) -> (B, H_kv * n_rep, L, d_k)``: each head repeated ``n_rep`` times in a row.

    Output head ``h`` is input head ``h // n_rep``, so query heads ``0 … n_rep - 1`` share key/value
    head 0, the next ``n_rep`` share head 1, and so on: the grouping of Hugging Face's
    ``repeat_kv`` and of ``F.scaled_dot_product_attention(..., enable_gqa=True)``
    (``torch.repeat_interleave`` on the head axis). ``n_rep = 1`` returns ``x`` itself.
    """
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"repeat_kv expects (B, H_kv, L, d_k), got {describe(x)}")
    n_rep = check_positive_int(n_rep, "n_rep")
    if n_rep == 1:
        return x
    B, H_kv, L, d_k = x.shape
    x = x[:, :, None].expand(B, H_kv, n_rep, L, d_k)  # (B, H_kv, n_rep, L, d_k), a view
    return x.reshape(B, H_kv * n_rep, L, d_k)  # (B, H, L, d_k), one copy


def _check_new(keys: object, values: object, method: str) -> None:
    """New keys and values: two tensors of one shape ``(B, H_kv, n, d_k)``; comparisons only (every decoding step)."""
    if isinstance(keys, Tensor) and isinstance(values, Tensor) and keys.ndim == 4 and keys.shape == values.shape:
        return
    if not (isinstance(keys, Tensor) and isinstance(values, Tensor)):
        raise TypeError(f"{method} expects keys and values as tensors (B, H_kv, n, d_k), "
                        f"got {describe(keys)} and {describe(values)}")
    raise ValueError(f"{method} expects keys and values of one shape (B, H_kv, n, d_k), got "
                     f"{tuple(keys.shape)} and {tuple(values.shape)}")


class KVCache:
    """The keys and values one self-attention layer has seen so far, for decoding.

    A model with several layers keeps one cache per layer. The cache holds keys and values as the
    layer uses them: after the projections ``W_k``, ``W_v`` and after RoPE, with ``H_kv`` heads.

    Attributes:
        keys: ``(B, H_kv, T, d_k)``, or None while empty.
        values: ``(B, H_kv, T, d_k)``, or None while empty.

    ``len(cache)`` is ``T``, the number of positions stored; ``cache.nbytes`` the memory they take,
    ``2 · B · H_kv · T · d_k · bytes per element``. Appending takes constant time: the cache keeps
    two buffers of ``capacity >= T`` positions and writes each new key and value in place;
    ``keys`` and ``values`` are views of their first ``T`` positions. When a buffer is full, it is
    replaced by one twice as large (or of ``capacity`` positions, if given, until that is full),
    so that ``T`` appends copy fewer than ``2 · T`` positions in all, where appending by
    ``torch.cat`` copies the whole cache at every step (``T² / 2`` positions). While autograd
    records (inputs that require grad, e.g. in training), it appends by concatenation instead,
    since writing in place would change tensors saved for the backward pass. Assigning
    ``cache.keys`` and ``cache.values`` (e.g. to trim a rolling window) replaces the buffers.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self._capacity = None if capacity is None else check_positive_int(capacity, "capacity")
        self._keys: Tensor | None = None  # (B, H_kv, capacity, d_k), the first T positions in use
        self._values: Tensor | None = None
        self._length = 0
        self._owner: weakref.ref | None = None  # the layer that filled it

    @property
    def keys(self) -> Tensor | None:
        return None if self._keys is None else self._keys[..., : self._length, :]

    @keys.setter
    def keys(self, keys: Tensor | None) -> None:
        self._keys = keys
        self._length = 0 if keys is None else keys.size(-2)

    @property
    def values(self) -> Tensor | None:
        return None if self._values is None else self._values[..., : self._length, :]

    @values.setter
    def values(self, values: Tensor | None) -> None:
        self._values = values
        if values is not None and self._keys is None:
            self._length = values.size(-2)

    @property
    def capacity(self) -> int:
        """Positions the buffers can hold before they grow (``len(cache)`` of them are in use)."""
        return 0 if self._keys is None else self._keys.size(-2)

    def __len__(self) -> int:
        return self._length

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values (the ``T`` positions in use, not the spare capacity)."""
        keys, values = self.keys, self.values
        return 0 if keys is None or values is None else keys.nbytes + values.nbytes

    def update(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new ``(B, H_kv, n, d_k)`` keys and values; return all ``(B, H_kv, T + n, d_k)``."""
        _check_new(keys, values, "KVCache.update")
        return self._append(keys, values)

    def _append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`update` for keys and values of one shape ``(B, H_kv, n, d_k)``, e.g. made by a layer."""
        held, T, n = self._keys, self._length, keys.size(-2)
        if held is None or self._values is None:
            held = None
        else:
            (B, H_kv, _, d_k), shape = held.shape, keys.shape
            if (B, H_kv, d_k) != (shape[0], shape[1], shape[3]) or held.dtype != keys.dtype or held.device != keys.device:
                had, new = (B, H_kv, d_k, held.dtype, held.device), (shape[0], shape[1], shape[3], keys.dtype, keys.device)
                raise ValueError(
                    f"this KVCache holds (B, H_kv, d_k, dtype, device) = {had}, the new keys are {new}: "
                    "use one cache per layer and per batch, and reset() it before a new sequence"
                )
            if self._values.size(-2) < T:
                raise ValueError(f"this KVCache's values hold {self._values.size(-2)} positions, its keys {T}: "
                                 "assign cache.keys and cache.values together")
        if torch.is_grad_enabled() and (keys.requires_grad or values.requires_grad or
                                        (held is not None and (held.requires_grad or self._values.requires_grad))):
            if held is None:  # autograd records: concatenate, never write into a tensor it may have saved
                self._keys, self._values = keys, values
            else:
                self._keys = torch.cat([self.keys, keys], dim=-2)  # (B, H_kv, T + n, d_k)
                self._values = torch.cat([self.values, values], dim=-2)
            self._length = T + n
            return self._keys, self._values
        if held is None or T + n > held.size(-2):  # (re)allocate: double, or the capacity asked for
            capacity = max(T + n, 2 * T, self._capacity or 0)
            grown = [torch.empty(*keys.shape[:2], capacity, keys.shape[3], dtype=keys.dtype, device=keys.device)
                     for _ in range(2)]
            if held is not None:
                grown[0][..., :T, :].copy_(self.keys)  # the one copy, amortised over the T appends before it
                grown[1][..., :T, :].copy_(self.values)
            self._keys, self._values = grown
        self._keys[..., T : T + n, :].copy_(keys)  # in place: the cost of n positions, whatever T is
        self._values[..., T : T + n, :].copy_(values)
        self._length = T + n
        return self.keys, self.values

    def reset(self) -> None:
        """Forget everything, to decode a new sequence (with any layer); the buffers are freed."""
        self._keys = self._values = None
        self._length = 0
        self._owner = None

    def claim(self, layer: object) -> None:
        """Remember ``layer`` as the one this cache serves; a clear error if another filled it.

        Two layers of one size would otherwise append their keys to one cache and silently mix them.
        """
        if layer is None:
            return
        owner = None if self._owner is None else self._owner()
        if owner is layer:
            return
        if self.keys is not None and owner is not None:
            raise ValueError("this KVCache holds another layer's keys and values: use one KVCache per layer "
                             "(e.g. caches = [KVCache() for _ in layers]), and reset() them before a new sequence")
        self._owner = weakref.ref(layer)

    def extend(self, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """One decoding step of a layer: append ``n`` new keys and values, and the mask of the new queries.

        New query ``i`` (position ``T + i``) may attend to keys ``0 … T + i``: every cached
        position, and causally within the new chunk. A user's ``mask`` (bool or float,
        broadcastable to ``(B, H, n, T + n)``, e.g. the last ``n`` rows of a
        :func:`~mha_lib.sliding_window_mask`) is combined with that: a layer's ``forward`` checks it
        in full, ``extend`` only its kind and last two sizes (comparisons, no data read).
        One new token with no mask may see everything: the mask is then None.

        Returns keys and values ``(B, H_kv, T + n, d_k)`` and the mask.
        """
        _check_new(keys, values, "KVCache.extend")
        n = keys.shape[-2]
        if mask is not None:  # before the cache grows: (..., n, T + n), bool or float
            total = len(self) + n
            if not (isinstance(mask, Tensor) and mask.ndim >= 1 and mask.shape[-1] in (1, total)
                    and (mask.ndim == 1 or mask.shape[-2] in (1, n))):
                raise ValueError(f"mask must be a tensor that broadcasts to (..., n, T + n) = (..., {n}, {total}), "
                                 f"the new queries against every key, got {describe(mask)}")
            check_mask_kind(mask, None)
        keys, values = self._append(keys, values)  # (B, H_kv, T + n, d_k)
        return keys, values, new_queries_mask(mask, n, keys.shape[-2], keys.device)

    def __repr__(self) -> str:
        shape = None if self.keys is None else tuple(self.keys.shape)
        return f"KVCache(len={len(self)}, keys={shape}, nbytes={self.nbytes})"


def new_queries_mask(mask: Tensor | None, n: int, total: int, device: torch.device) -> Tensor | None:
    """The mask of ``n`` new queries against ``total = T + n`` keys while decoding: query ``i``
    (position ``T + i``) sees every cached key and the new ones up to itself, combined with
    ``mask`` (bool or float, broadcastable to ``(..., n, total)``). None for one token and no mask."""
    if mask is None and n == 1:
        return None
    causal = torch.ones(n, total, dtype=torch.bool, device=device).tril(diagonal=total - n)  # (n, T + n)
    if mask is None:
        return causal
    causal = causal.to(mask.device)
    if mask.dtype == torch.bool:
        return mask & causal
    return mask.masked_fill(~causal, float("-inf"))


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, d_k: int, seq_len: int, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """A decoder's cache size by arithmetic: keys and values, every layer, every position.

    ``2 · num_layers · batch · num_kv_heads · seq_len · d_k · bytes_per_element`` (2 bytes for
    float16/bfloat16, 4 for float32). A LLaMA-2-7B-like model (32 layers, 32 heads of 128,
    float16) holds 0.5 MiB per token: 2 GiB for 4096 tokens; with 8 key/value heads, a quarter.
    """
    names = ("num_layers", "num_kv_heads", "d_k", "seq_len", "batch", "bytes_per_element")
    sizes = [check_whole(n, name, "an int >= 0") for n, name in zip((num_layers, num_kv_heads, d_k, seq_len, batch,
                                                       bytes_per_element), names)]
    if negative := [name for name, n in zip(names, sizes) if n < 0]:
        raise ValueError(f"kv_cache_bytes expects sizes >= 0, got {dict(zip(names, sizes))}; negative: {negative}")
    num_layers, num_kv_heads, d_k, seq_len, batch, bytes_per_element = sizes
    return 2 * num_layers * batch * num_kv_heads * seq_len * d_k * bytes_per_element
