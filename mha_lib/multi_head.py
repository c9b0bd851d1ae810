"""Multi-head attention as a module: project, split, attend, combine, project.

The attribute names ``W_q, W_k, W_v, W_o`` follow the listing in
*Transformers in Action* (listing 2.4), with its bug fixed: the listing splits
the values with ``self.d_v``, which it never defines. Every head's keys and
values have the same size here, ``d_k = d_model // num_heads``.
"""

from __future__ import annotations

from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .heads import combine_heads, split_heads
from .inference import KVCache, check_cache, check_num_kv_heads, repeat_kv, rotate_and_cache
from .positions import check_rotary
from .validation import check_heads, check_qkv  # check_qkv: also importable from here, as before

__all__ = ["MultiHeadAttention", "check_qkv"]


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
        d_model, num_heads, dropout = check_heads(d_model, num_heads, dropout)
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
            mask: optional, broadcastable to the scores ``(B, H, Lq, Lk)``; bool
                ``True`` = may attend, or float added to the scores (0/-inf or a
                bias; 0s and 1s are refused: use ``.bool()``). Aligned from the
                right: ``(Lq, Lk)`` applies to everything (``causal_mask``),
                ``(H, Lq, Lk)`` per head, ``(B, 1, 1, Lk)`` per sequence's keys
                (:func:`~mha_lib.padding_mask`), ``(B, 1, Lq, Lk)`` per sequence.
                A 2-D mask is always ``(Lq, Lk)`` and a 3-D one ``(H, Lq, Lk)``,
                also when ``B == Lq`` or ``B == H`` (:mod:`mha_lib.validation`).
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
        check_qkv(query, key, value, self.d_model, weight=self.W_q.weight, mask=mask)
        past = check_cache(cache, query, key, value)  # T, the positions already cached (0 without a cache)

        # 1) project, then 2) split the d_model features into H heads of d_k
        q = split_heads(self.W_q(query), self.num_heads)  # (B, H, Lq, d_k)
        k = split_heads(self.W_k(key), self.num_kv_heads)  # (B, H_kv, Lk, d_k)
        v = split_heads(self.W_v(value), self.num_kv_heads)  # (B, H_kv, Lk, d_k)
        # RoPE on q and k (rotary=True); with a cache, append k and v and see the past (chapters 06, 10)
        q, k, v, mask = rotate_and_cache(q, k, v, mask, rotary=self.rotary, cache=cache, past=past)

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
