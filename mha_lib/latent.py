"""Multi-head latent attention (MLA): cache one small latent per token instead of keys and values.

DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
Model" (2024, arXiv 2405.04434), section 2.1. Each token's input ``x`` is compressed into one
**latent** ``c = W_dkv x`` of ``d_latent`` features, shared by all heads; every head's key and
value are rebuilt from it, ``k_h = W_uk[h] c`` and ``v_h = W_uv[h] c``. A decoder caches only
the latents: ``d_latent`` numbers per token and layer, against ``2 · H · d_k`` for multi-head
attention.

**Absorption.** ``q_h · k_h = q_h · (W_uk[h] c) = (W_uk[h]ᵀ q_h) · c``: with ``W_uk[h]`` moved to
the query side, every head scores the cached latents directly; and since a head's output
``Σ_j w_j W_uv[h] c_j = W_uv[h] (Σ_j w_j c_j)``, ``W_uv[h]`` folds into ``W_o``. The cache is then
never up-projected: a decoding step reads ``(B, T, d_latent)`` once for all heads, like
multi-query attention whose one key and value are the latent (``forward(..., absorb=True)``).

**Why plain RoPE breaks absorption.** RoPE rotates a key after ``W_uk``, by its position ``j``,
and the query by its position ``i``: the score becomes ``q_iᵀ R_iᵀ R_j W_uk c_j = q_iᵀ R_{j-i} W_uk c_j``.
The matrix between query and latent now depends on the offset ``j - i``, so no single matrix can
be folded into the queries, and every cached key would have to be rebuilt (or cached, which is
what MLA avoids). DeepSeek-V2's **decoupled RoPE** leaves the latent path position-free and adds
a few rotary features: per head a rotary query ``RoPE(W_qr x)`` of ``d_rope`` features, and one
rotary key ``RoPE(W_kr x)`` of ``d_rope`` features shared by all heads and cached, already
rotated, beside the latent. A head's score is ``(q_h · k_h + q_h^R · k^R) / √(d_k + d_rope)``.
``d_rope > 0`` implements it (DeepSeek-V2: ``d_latent = 512``, ``d_rope = 64``, 128 heads of 128).

Not implemented: DeepSeek-V2 also compresses the queries (a low-rank ``W_q``, which saves
activation memory in training, not cache), normalises the latents (RMSNorm), and uses other
head sizes for values than for keys.
"""

from __future__ import annotations

import math
import weakref

import torch
from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .heads import _split_heads, combine_heads
from .inference import new_queries_mask
from .positions import apply_rotary
from .validation import check_flag, check_forward, check_heads, check_positive_int, check_whole, describe, same_tensor

__all__ = ["LatentCache", "MultiHeadLatentAttention", "latent_cache_bytes"]


class LatentCache:
    """The latents one :class:`MultiHeadLatentAttention` layer has seen so far, for decoding.

    The API of :class:`~mha_lib.KVCache` (``len``, ``nbytes``, ``update``, ``extend``, ``reset``;
    one cache per layer), holding what MLA keeps instead of keys and values.

    Attributes:
        latent: ``(B, T, d_latent)``, ``W_dkv x`` of every token so far, or None while empty.
        rope_keys: ``(B, T, d_rope)``, the rotary keys shared by all heads, already rotated; None
            for a layer without decoupled RoPE.

    ``cache.nbytes`` is ``B · T · (d_latent + d_rope) · bytes per element``, the same for any
    number of heads.
    """

    def __init__(self) -> None:
        self.latent: Tensor | None = None
        self.rope_keys: Tensor | None = None
        self._owner: weakref.ref | None = None  # the layer that filled it

    def __len__(self) -> int:
        return 0 if self.latent is None else self.latent.size(1)

    @property
    def nbytes(self) -> int:
        """Bytes held by the latents and the rotary keys."""
        return sum(t.nbytes for t in (self.latent, self.rope_keys) if t is not None)

    def update(self, latent: Tensor, rope_keys: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Append ``n`` new latents ``(B, n, d_latent)`` (and rotary keys ``(B, n, d_rope)``); return all ``T + n``."""
        if not isinstance(latent, Tensor) or latent.dim() != 3 or not (
                rope_keys is None or (isinstance(rope_keys, Tensor) and rope_keys.shape[:2] == latent.shape[:2])):
            raise ValueError(f"LatentCache.update expects latents (B, n, d_latent) and rotary keys (B, n, d_rope) "
                             f"or None, got {describe(latent)} and {describe(rope_keys)}: a LatentCache serves "
                             "MultiHeadLatentAttention (MultiHeadAttention takes a KVCache)")
        if self.latent is None:
            self.latent, self.rope_keys = latent, rope_keys
            return latent, rope_keys
        held = (self.latent.size(0), self.latent.size(2), None if self.rope_keys is None else self.rope_keys.size(2),
                self.latent.dtype, self.latent.device)
        new = (latent.size(0), latent.size(2), None if rope_keys is None else rope_keys.size(2), latent.dtype,
               latent.device)
        if held != new:
            raise ValueError(f"this LatentCache holds (B, d_latent, d_rope, dtype, device) = {held}, the new latents "
                             f"are {new}: use one cache per layer and per batch, and reset() it before a new sequence")
        self.latent = torch.cat([self.latent, latent], dim=1)  # (B, T + n, d_latent)
        if self.rope_keys is not None and rope_keys is not None:
            self.rope_keys = torch.cat([self.rope_keys, rope_keys], dim=1)  # (B, T + n, d_rope)
        return self.latent, self.rope_keys

    def extend(self, latent: Tensor, rope_keys: Tensor | None,
               mask: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """One decoding step: append ``n`` latents, and the mask of the ``n`` new queries.

        As :meth:`KVCache.extend <mha_lib.KVCache.extend>`: new query ``r`` (position ``T + r``)
        sees every cached position and the new ones up to itself, combined with ``mask`` (bool or
        float, broadcastable to ``(B, H, n, T + n)``). Returns the latents ``(B, T + n, d_latent)``,
        the rotary keys ``(B, T + n, d_rope)`` or None, and the mask (None for one token and no mask).
        """
        n = latent.size(1) if isinstance(latent, Tensor) and latent.dim() == 3 else 0
        latent, rope_keys = self.update(latent, rope_keys)
        return latent, rope_keys, new_queries_mask(mask, n, latent.size(1), latent.device)

    def reset(self) -> None:
        """Forget everything, to decode a new sequence (with any layer)."""
        self.latent = self.rope_keys = None
        self._owner = None

    def claim(self, layer: object) -> None:
        """Remember ``layer`` as the one this cache serves; a clear error if another filled it."""
        owner = None if self._owner is None else self._owner()
        if self.latent is not None and owner is not None and owner is not layer:
            raise ValueError("this LatentCache holds another layer's latents: use one LatentCache per layer, "
                             "and reset() them before a new sequence")
        self._owner = weakref.ref(layer)

    def __repr__(self) -> str:
        shape = None if self.latent is None else tuple(self.latent.shape)
        return f"LatentCache(len={len(self)}, latent={shape}, nbytes={self.nbytes})"


class MultiHeadLatentAttention(nn.Module):
    """Multi-head attention whose keys and values are rebuilt from one cached latent per token.

    Args:
        d_model: width of the inputs and of the output.
        num_heads: number of heads ``H``, each of ``d_k = d_model // num_heads`` features.
        d_latent: size of the latent ``c = W_dkv x``, the only thing cached (with ``d_rope``).
        dropout: dropout on the attention weights, in training mode only.
        bias: whether ``W_q``, ``W_dkv`` and ``W_o`` have a bias. ``W_uk`` and ``W_uv`` never do,
            as in DeepSeek-V2: a key bias adds one number to every score of a row (which the
            softmax ignores), and a value bias would not fold into ``W_o`` for a fully masked query.
        d_rope: features of DeepSeek-V2's decoupled RoPE (0: none; even): a rotary query of
            ``d_rope`` per head (``W_qr``) and one rotary key of ``d_rope`` shared by the heads
            (``W_kr``), cached beside the latent.

    Projections: ``W_q: d_model → H·d_k``, ``W_dkv: d_model → d_latent``, ``W_uk, W_uv: d_latent → H·d_k``,
    ``W_o: H·d_k → d_model``; with ``d_rope``: ``W_qr: d_model → H·d_rope``, ``W_kr: d_model → d_rope``.
    """

    def __init__(self, d_model: int, num_heads: int, d_latent: int, dropout: float = 0.0, bias: bool = True,
                 d_rope: int = 0) -> None:
        super().__init__()
        self.d_model, self.num_heads, self.dropout = check_heads(d_model, num_heads, dropout)
        self.d_k = self.d_model // self.num_heads
        self.d_latent = check_positive_int(d_latent, "d_latent")
        self.d_rope = check_whole(d_rope, "d_rope", "an even int >= 0")
        if self.d_rope < 0 or self.d_rope % 2:
            raise ValueError(f"d_rope must be an even int >= 0 (RoPE rotates features in pairs; 0: no rotary "
                             f"features), got {self.d_rope}")
        bias = check_flag(bias, "bias")
        self.W_q = nn.Linear(self.d_model, self.d_model, bias=bias)
        self.W_dkv = nn.Linear(self.d_model, self.d_latent, bias=bias)  # down: the latent, cached
        self.W_uk = nn.Linear(self.d_latent, self.d_model, bias=False)  # up: every head's keys
        self.W_uv = nn.Linear(self.d_latent, self.d_model, bias=False)  # up: every head's values
        self.W_o = nn.Linear(self.d_model, self.d_model, bias=bias)
        if self.d_rope:
            self.W_qr = nn.Linear(self.d_model, self.num_heads * self.d_rope, bias=False)
            self.W_kr = nn.Linear(self.d_model, self.d_rope, bias=False)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None,
                return_weights: bool = False, cache: LatentCache | None = None,
                absorb: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to the latents of ``key`` (which must be ``value``).

        Args:
            query: ``(B, Lq, d_model)``.
            key, value: ``(B, Lk, d_model)``, one tensor (one latent gives both keys and values):
                ``x, x, x`` for self-attention, ``query, memory, memory`` for cross-attention.
            mask: as for :class:`~mha_lib.MultiHeadAttention`, broadcastable to ``(B, H, Lq, Lk)``,
                bool ``True`` = may attend or float added to the scores.
            return_weights: also return the attention weights ``(B, H, Lq, Lk)``.
            cache: a :class:`LatentCache` for decoding (self-attention, one per layer): the new
                tokens' latents are appended to the ``T`` cached ones, the new queries see all
                ``T + n`` positions and causally among themselves, RoPE positions continue at ``T``;
                equal to the full forward with :func:`~mha_lib.causal_mask`.
            absorb: ``W_uk`` folded into the queries and ``W_uv`` into ``W_o`` (see the module's
                docstring): the same outputs, without rebuilding keys and values.

        Returns:
            output ``(B, Lq, d_model)``, or ``(output, weights)`` (``Lk = T + n`` with a cache).
        """
        if cache is not None and not isinstance(cache, LatentCache):
            raise TypeError(f"cache must be a mha_lib.LatentCache (latent attention caches latents, not keys and "
                            f"values), got {type(cache).__name__}")
        past = check_forward(self, query, key, value, mask, cache, return_weights)  # T cached positions
        if not same_tensor(key, value):
            raise ValueError("MultiHeadLatentAttention builds keys and values from one latent: pass one tensor as "
                             "key and value (x, x, x for self-attention; query, memory, memory for cross-attention)")
        absorb = check_flag(absorb, "absorb")
        q = _split_heads(self.W_q(query), self.num_heads)  # 1) queries (B, H, Lq, d_k)
        latent = self.W_dkv(key)  # 2) compress: (B, Lk, d_latent)
        q_rope, k_rope = self.rotary_parts(query, key, start=past)  # (B, H, Lq, d_rope), (B, Lk, d_rope) or None
        if cache is not None:  # decoding: the cached latents, and the new ones
            latent, k_rope, mask = cache.extend(latent, k_rope, mask)  # (B, T + Lk, d_latent)
        attend = self.attend_absorbed if absorb else self.attend  # 3) attend, 4) combine, 5) project
        output, weights = attend(q, q_rope, latent, k_rope, mask)  # (B, Lq, d_model), (B, H, Lq, Lk)
        return (output, weights) if return_weights else output

    def rotary_parts(self, query: Tensor, key: Tensor, start: int) -> tuple[Tensor | None, Tensor | None]:
        """Decoupled RoPE: rotary queries ``(B, H, Lq, d_rope)`` and the shared rotary keys
        ``(B, Lk, d_rope)``, rotated by their positions ``start, start + 1, ...``; None without ``d_rope``."""
        if not self.d_rope:
            return None, None
        q_rope = _split_heads(self.W_qr(query), self.num_heads)  # (B, H, Lq, d_rope)
        k_rope = self.W_kr(key)  # (B, Lk, d_rope): one for all heads
        q_positions = torch.arange(start, start + query.size(1), device=query.device)
        k_positions = torch.arange(start, start + key.size(1), device=key.device)
        return apply_rotary(q_rope, q_positions), apply_rotary(k_rope, k_positions)

    def attend(self, q: Tensor, q_rope: Tensor | None, latent: Tensor, k_rope: Tensor | None,
               mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Rebuild every head's keys and values from the latents, then attend as multi-head attention."""
        k = _split_heads(self.W_uk(latent), self.num_heads)  # (B, H, Lk, d_k): every cached token up-projected
        v = _split_heads(self.W_uv(latent), self.num_heads)  # (B, H, Lk, d_k)
        if q_rope is not None and k_rope is not None:  # append the rotary features: √(d_k + d_rope) scale
            q = torch.cat([q, q_rope], dim=-1)  # (B, H, Lq, d_k + d_rope)
            k = torch.cat([k, k_rope[:, None].expand(-1, self.num_heads, -1, -1)], dim=-1)  # (B, H, Lk, d_k + d_rope)
        heads, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout if self.training else 0.0)
        return self.W_o(combine_heads(heads)), weights  # (B, Lq, d_model), (B, H, Lq, Lk)

    def absorbed_weights(self) -> tuple[Tensor, Tensor]:
        """``W_uk`` per head, ``(H, d_k, d_latent)``, to fold into the queries (``q_h @ W_uk[h]``), and
        ``W_o`` with ``W_uv`` folded in, ``(d_model, H, d_latent)``: ``W_ov[:, h] = W_o[:, h] @ W_uv[h]``,
        where ``W_o[:, h]`` is the ``(d_model, d_k)`` block that reads head ``h``. Costs no sequence length."""
        H, d_k = self.num_heads, self.d_k
        W_uk = self.W_uk.weight.view(H, d_k, self.d_latent)  # k_h = W_uk[h] c
        W_uv = self.W_uv.weight.view(H, d_k, self.d_latent)  # v_h = W_uv[h] c
        W_o = self.W_o.weight.view(self.d_model, H, d_k)  # output = Σ_h W_o[:, h] head_h
        return W_uk, torch.einsum("mhk,hkc->mhc", W_o, W_uv)

    def attend_absorbed(self, q: Tensor, q_rope: Tensor | None, latent: Tensor, k_rope: Tensor | None,
                        mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The same outputs, attending over the latents themselves: no key or value is ever built."""
        W_uk, W_ov = self.absorbed_weights()  # (H, d_k, d_latent), (d_model, H, d_latent)
        q_latent = q @ W_uk  # (B, H, Lq, d_latent): W_uk[h]ᵀ q_h, each head's query in latent space
        keys = latent[:, None]  # (B, 1, Lk, d_latent): one key per token, for every head
        if q_rope is not None and k_rope is not None:
            q_latent = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, Lq, d_latent + d_rope)
            keys = torch.cat([keys, k_rope[:, None]], dim=-1)  # (B, 1, Lk, d_latent + d_rope)
        # The scores must be divided by √(d_k + d_rope), as in attend(); the function divides by √(width of keys).
        q_latent = q_latent * math.sqrt(keys.size(-1) / (self.d_k + self.d_rope))
        mixed, weights = scaled_dot_product_attention(q_latent, keys, latent[:, None], mask,
                                                      self.dropout if self.training else 0.0)  # (B, H, Lq, d_latent)
        output = torch.einsum("bhqc,mhc->bqm", mixed, W_ov)  # (B, Lq, d_model): Σ_h W_ov[:, h] mixed_h
        return (output if self.W_o.bias is None else output + self.W_o.bias), weights

    def extra_repr(self) -> str:
        rope = f", d_rope={self.d_rope}" if self.d_rope else ""
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, d_k={self.d_k}, d_latent={self.d_latent}"
                f"{rope}, dropout={self.dropout}")


def latent_cache_bytes(num_layers: int, d_latent: int, seq_len: int, batch: int = 1, d_rope: int = 0,
                       bytes_per_element: int = 2) -> int:
    """A latent-attention decoder's cache by arithmetic: ``num_layers · batch · seq_len · (d_latent +
    d_rope) · bytes_per_element``, to set beside :func:`~mha_lib.kv_cache_bytes`. DeepSeek-V2 (60
    layers, ``d_latent = 512``, ``d_rope = 64``) caches 576 numbers per token and layer, where
    multi-head attention with its 128 heads of 128 would cache 32 768."""
    names = ("num_layers", "d_latent", "seq_len", "batch", "d_rope", "bytes_per_element")
    sizes = [check_whole(n, name, "an int >= 0")
             for n, name in zip((num_layers, d_latent, seq_len, batch, d_rope, bytes_per_element), names)]
    if negative := [name for name, n in zip(names, sizes) if n < 0]:
        raise ValueError(f"latent_cache_bytes expects sizes >= 0, got {dict(zip(names, sizes))}; negative: {negative}")
    num_layers, d_latent, seq_len, batch, d_rope, bytes_per_element = sizes
    return num_layers * batch * seq_len * (d_latent + d_rope) * bytes_per_element
