"""Multi-head attention as a module: project, split, attend, combine, project.

The attribute names ``W_q, W_k, W_v, W_o`` follow the listing in
*Transformers in Action* (listing 2.4), with its bug fixed: the listing splits
the values with ``self.d_v``, which it never defines. Every head's keys and
values have the same size here, ``d_k = d_model // num_heads``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .heads import combine_heads, split_heads
from .inference import KVCache, cached_mask, check_cache, check_num_kv_heads, repeat_kv
from .positions import apply_rotary, check_rotary

__all__ = ["MultiHeadAttention", "check_qkv"]


def check_qkv(query: Tensor, key: Tensor, value: Tensor, d_model: int) -> None:
    """Raise a clear error unless query ``(B, Lq, d_model)``, key and value ``(B, Lk, d_model)`` fit.

    Shared by the attention modules (:class:`MultiHeadAttention`, :class:`~mha_lib.AttentionHead`,
    :class:`~mha_lib.EfficientMultiHeadAttention`), so that they refuse bad input alike.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.size(-1) != d_model:
            raise ValueError(f"{name} must have shape (B, L, d_model={d_model}), got {tuple(x.shape)}")
    if not query.size(0) == key.size(0) == value.size(0):
        raise ValueError(
            f"query, key and value must have the same batch size, got "
            f"{query.size(0)}, {key.size(0)}, {value.size(0)}"
        )
    if key.size(1) != value.size(1):
        raise ValueError(f"key and value must have the same length Lk, got {key.size(1)} and {value.size(1)}")


class MultiHeadAttention(nn.Module):
    """Multi-head attention with ``num_heads`` heads of size ``d_model // num_heads``.

    Args:
        d_model: width of the inputs and of the output.
        num_heads: number of heads ``H``; must divide ``d_model``.
        dropout: dropout on the attention weights, active in training mode only.
        bias: whether the four projections have a bias.
        num_kv_heads: number of key/value heads ``H_kv``; must divide ``num_heads`` (default:
            ``num_heads``). Each group of ``num_heads // num_kv_heads`` consecutive query heads
            shares one key/value head (grouped-query attention; ``1`` is multi-query attention),
            and ``W_k``, ``W_v`` map to ``num_kv_heads * d_k`` features only.
        rotary: rotate each head's queries and keys by their positions (RoPE,
            :func:`~mha_lib.apply_rotary`) after :func:`~mha_lib.split_heads`; needs an even ``d_k``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        num_kv_heads: int | None = None,
        rotary: bool = False,
    ) -> None:
        super().__init__()
        if num_heads < 1 or d_model < 1:
            raise ValueError(f"d_model and num_heads must be positive, got d_model={d_model}, num_heads={num_heads}")
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}: "
                f"every head needs the same share of the {d_model} features"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads  # per head; the paper's d_k = d_v = d_model / h
        self.num_kv_heads = check_num_kv_heads(num_heads, num_kv_heads)  # H_kv
        self.rotary = bool(rotary)
        if self.rotary:
            check_rotary(self.d_k)
        self.dropout = dropout
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, self.num_kv_heads * self.d_k, bias=bias)
        self.W_v = nn.Linear(d_model, self.num_kv_heads * self.d_k, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        return_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``. For self-attention pass the same tensor
                three times; for cross-attention ``Lq`` may differ from ``Lk``.
            mask: optional, broadcastable to ``(B, H, Lq, Lk)``; bool ``True`` =
                may attend, or float added to the scores. Broadcasting aligns
                from the right: ``(Lq, Lk)`` applies to everything,
                ``(H, Lq, Lk)`` per head, ``(B, 1, 1, Lk)`` per sequence (as
                :func:`~mha_lib.padding_mask` returns).
            return_weights: also return the attention weights.
            cache: a :class:`~mha_lib.KVCache` for decoding (self-attention only). The ``n``
                new tokens' keys and values are appended to the ``T`` cached ones, the new
                queries attend to all ``T + n`` positions and causally among themselves (``mask``,
                if given, must broadcast to ``(B, H, n, T + n)`` and is combined with that), and
                RoPE positions continue at ``T``. Token by token or in chunks, this equals the
                full forward with :func:`~mha_lib.causal_mask`.

        Returns:
            output ``(B, Lq, d_model)``, or ``(output, weights)`` with weights
            ``(B, H, Lq, Lk)`` (``Lk = T + n`` with a cache) when ``return_weights`` is True.
        """
        check_qkv(query, key, value, self.d_model)
        past = check_cache(cache, query, key, value)  # T, the positions already cached (0 without a cache)

        # 1) project, then 2) split the d_model features into H heads of d_k
        q = split_heads(self.W_q(query), self.num_heads)  # (B, H, Lq, d_k)
        k = split_heads(self.W_k(key), self.num_kv_heads)  # (B, H_kv, Lk, d_k)
        v = split_heads(self.W_v(value), self.num_kv_heads)  # (B, H_kv, Lk, d_k)
        if self.rotary:  # RoPE: rotate queries and keys by their positions T, T + 1, ..., never the values
            q = apply_rotary(q, torch.arange(past, past + q.size(2), device=q.device))  # (B, H, Lq, d_k)
            k = apply_rotary(k, torch.arange(past, past + k.size(2), device=k.device))  # (B, H_kv, Lk, d_k)
        if cache is not None:  # decoding: attend to every cached position, causally within the chunk
            mask = cached_mask(mask, (*q.shape[:-1], past + k.size(2)), q.device)  # (n, T + n) or None
            k, v = cache.update(k, v)  # (B, H_kv, T + n, d_k)

        # 3) every head attends on its own, in one batched call; a group of
        #    H // H_kv query heads shares each key/value head
        n_rep = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, Lk, d_k)
        dropout_p = self.dropout if self.training else 0.0
        heads, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)  # (B, H, Lq, d_k)

        # 4) concatenate the heads and 5) mix them with the output projection
        output = self.W_o(combine_heads(heads))  # (B, Lq, d_model)
        return (output, weights) if return_weights else output

    def extra_repr(self) -> str:
        grouped = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        rotary = ", rotary=True" if self.rotary else ""  # the defaults stay unsaid, as before
        return f"d_model={self.d_model}, num_heads={self.num_heads}{grouped}, d_k={self.d_k}, dropout={self.dropout}{rotary}"
