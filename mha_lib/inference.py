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

import torch
from torch import Tensor

from .positions import apply_rotary
from .validation import check_mask, check_positive_int

__all__ = ["KVCache", "kv_cache_bytes", "repeat_kv", "cached_mask", "check_cache", "check_num_kv_heads", "rotate_and_cache"]


def check_num_kv_heads(num_heads: int, num_kv_heads: int | None) -> int:
    """``num_kv_heads``, defaulting to ``num_heads``; a clear error unless it divides ``num_heads``."""
    if num_kv_heads is None:
        return num_heads
    num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")  # np.int64 too; not True or 2.0
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


class KVCache:
    """The keys and values one self-attention layer has seen so far, for decoding.

    A model with several layers keeps one cache per layer. The cache holds keys and values as the
    layer uses them: after the projections ``W_k``, ``W_v`` and after RoPE, with ``H_kv`` heads.

    Attributes:
        keys: ``(B, H_kv, T, d_k)``, or None while empty.
        values: ``(B, H_kv, T, d_k)``, or None while empty.

    ``len(cache)`` is ``T``, the number of positions stored; ``cache.nbytes`` the memory they take,
    ``2 · B · H_kv · T · d_k · bytes per element``. Each :meth:`update` copies the cache into a new
    tensor one step longer (``torch.cat``): simple, and cheap next to recomputing every key.
    Production servers preallocate the full length instead.
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.size(-2)

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values."""
        return 0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes

    def update(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new ``(B, H_kv, n, d_k)`` keys and values; return all ``(B, H_kv, T + n, d_k)``."""
        if keys.dim() != 4 or keys.shape != values.shape:
            raise ValueError(
                f"KVCache.update expects keys and values of one shape (B, H_kv, n, d_k), got "
                f"{tuple(keys.shape)} and {tuple(values.shape)}"
            )
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
            return keys, values
        held = (self.keys.size(0), self.keys.size(1), self.keys.size(3), self.keys.dtype, self.keys.device)
        new = (keys.size(0), keys.size(1), keys.size(3), keys.dtype, keys.device)
        if held != new:
            raise ValueError(
                f"this KVCache holds (B, H_kv, d_k, dtype, device) = {held}, the new keys are {new}: "
                "use one cache per layer and per batch, and reset() it before a new sequence"
            )
        self.keys = torch.cat([self.keys, keys], dim=-2)  # (B, H_kv, T + n, d_k)
        self.values = torch.cat([self.values, values], dim=-2)  # (B, H_kv, T + n, d_k)
        return self.keys, self.values

    def reset(self) -> None:
        """Forget everything, to decode a new sequence."""
        self.keys = self.values = None

    def __repr__(self) -> str:
        shape = None if self.keys is None else tuple(self.keys.shape)
        return f"KVCache(len={len(self)}, keys={shape}, nbytes={self.nbytes})"


def kv_cache_bytes(
    num_layers: int, num_kv_heads: int, d_k: int, seq_len: int, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """A decoder's cache size by arithmetic: keys and values, every layer, every position.

    ``2 · num_layers · batch · num_kv_heads · seq_len · d_k · bytes_per_element`` (2 bytes for
    float16/bfloat16, 4 for float32). A LLaMA-2-7B-like model (32 layers, 32 heads of 128,
    float16) holds 0.5 MiB per token: 2 GiB for 4096 tokens; with 8 key/value heads, a quarter.
    """
    sizes = (num_layers, num_kv_heads, d_k, seq_len, batch, bytes_per_element)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sizes):
        raise ValueError(f"kv_cache_bytes expects non-negative ints, got {sizes}")
    return 2 * num_layers * batch * num_kv_heads * seq_len * d_k * bytes_per_element


def check_cache(cache: KVCache | None, query: Tensor, key: Tensor, value: Tensor) -> int:
    """The number ``T`` of positions already cached (0 without a cache); a clear error for misuse."""
    if cache is None:
        return 0
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a mha_lib.KVCache, got {type(cache).__name__}")
    if not (query is key and key is value):
        raise ValueError(
            "a KVCache works for self-attention only: pass the same tensor as query, key and value "
            "(cross-attention attends to a fixed memory, whose keys and values never grow)"
        )
    return len(cache)


def cached_mask(
    mask: Tensor | None, scores_shape: tuple[int, ...], device: torch.device | str | None = None
) -> Tensor | None:
    """The mask for ``n`` new queries at positions ``T … T + n - 1`` over ``T + n`` keys.

    New query ``i`` may attend to keys ``0 … T + i``: every cached position, and causally within the
    new chunk. ``scores_shape`` is ``(B, H, n, T + n)``. A user's ``mask`` (bool or float,
    broadcastable to ``scores_shape``, e.g. the last ``n`` rows of a
    :func:`~mha_lib.sliding_window_mask`) is combined with it. One new token with no mask may see
    everything: then None.
    """
    n, total = scores_shape[-2], scores_shape[-1]
    if mask is None and n == 1:
        return None
    causal = torch.ones(n, total, dtype=torch.bool, device=device).tril(diagonal=total - n)  # (n, T + n)
    if mask is None:
        return causal
    check_mask(mask, torch.Size(scores_shape))
    causal = causal.to(mask.device)
    if mask.dtype == torch.bool:
        return mask & causal
    return mask.masked_fill(~causal, float("-inf"))


def rotate_and_cache(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, rotary: bool, cache: KVCache | None, past: int
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The step both attention modules take between ``split_heads`` and attending.

    q ``(B, H, n, d_k)``, k and v ``(B, H_kv, n, d_k)`` of ``n`` tokens at positions
    ``past … past + n - 1``. With ``rotary``, q and k are rotated by those positions (RoPE;
    never v). With a ``cache``, k and v are appended to the ``past`` cached ones and the mask
    becomes :func:`cached_mask`'s. Returns q, k, v ``(B, H_kv, past + n, d_k)`` and the mask.
    """
    if rotary:  # RoPE: rotate queries and keys by their positions T, T + 1, ..., never the values
        q = apply_rotary(q, torch.arange(past, past + q.size(2), device=q.device))  # (B, H, n, d_k)
        k = apply_rotary(k, torch.arange(past, past + k.size(2), device=k.device))  # (B, H_kv, n, d_k)
    if cache is not None:  # decoding: attend to every cached position, causally within the chunk
        mask = cached_mask(mask, (*q.shape[:-1], past + k.size(2)), q.device)  # (n, T + n) or None
        k, v = cache.update(k, v)  # (B, H_kv, T + n, d_k)
    return q, k, v, mask
