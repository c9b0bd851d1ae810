"""Multi-head attention the way production code writes it (chapter 07).

Same maths and the same forward contract as :class:`~mha_lib.MultiHeadAttention`,
with two optimisations:

1. **Fused input projection.** ``W_q, W_k, W_v`` are stacked into one
   ``(3·d_model, d_model)`` weight, so self-attention projects with one
   matrix multiplication and splits the result (nanoGPT's ``c_attn``,
   ``nn.MultiheadAttention``'s ``in_proj_weight``).
2. **Fused attention kernel.** :func:`torch.nn.functional.scaled_dot_product_attention`
   picks a flash / memory-efficient kernel where the device has one, and never
   stores the ``(B, H, Lq, Lk)`` weights. ``return_weights=True`` falls back to
   the explicit :func:`~mha_lib.scaled_dot_product_attention`, which must store them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import check_mask, scaled_dot_product_attention
from .multi_head import MultiHeadAttention
from .validation import check_heads, check_qkv

__all__ = ["EfficientMultiHeadAttention"]


class EfficientMultiHeadAttention(nn.Module):
    """Multi-head attention with one fused input projection and a fused attention kernel.

    Args:
        d_model: width of the inputs and of the output.
        num_heads: number of heads ``H``; must divide ``d_model``.
        dropout: dropout on the attention weights, active in training mode only.
        bias: whether the projections have a bias.

    Attributes:
        W_qkv: ``nn.Linear(d_model, 3 * d_model)``; its weight is
            ``cat([W_q.weight, W_k.weight, W_v.weight])`` of the teaching module.
        W_o: ``nn.Linear(d_model, d_model)``, the output projection.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        d_model, num_heads, dropout = check_heads(d_model, num_heads, dropout)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.dropout = dropout
        self.W_qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_module(cls, mha: MultiHeadAttention) -> EfficientMultiHeadAttention:
        """A copy of ``mha``'s weights (dtype, device and train/eval mode too), fused.

        Both modules then compute the same function: ``new(q, k, v, mask) == mha(q, k, v, mask)``
        up to rounding.
        """
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(
                f"from_module expects a mha_lib.MultiHeadAttention, got {type(mha).__name__}"
            )
        bias = mha.W_q.bias is not None
        new = cls(mha.d_model, mha.num_heads, dropout=mha.dropout, bias=bias)
        new.to(device=mha.W_q.weight.device, dtype=mha.W_q.weight.dtype)
        with torch.no_grad():
            new.W_qkv.weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
            new.W_o.weight.copy_(mha.W_o.weight)
            if bias:
                new.W_qkv.bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
                new.W_o.bias.copy_(mha.W_o.bias)
        return new.train(mha.training)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``; the contract of :class:`MultiHeadAttention`.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``. Pass the same tensor three times for
                self-attention (one matmul projects all three).
            mask: optional, broadcastable to ``(B, H, Lq, Lk)``; bool ``True`` =
                may attend, or float added to the scores; the shapes of
                :class:`MultiHeadAttention` (:mod:`mha_lib.validation`).
            return_weights: also return the ``(B, H, Lq, Lk)`` attention weights
                (computed by the explicit path, which stores them).

        Returns:
            output ``(B, Lq, d_model)``, or ``(output, weights)``.
        """
        check_qkv(query, key, value, self.d_model, weight=self.W_o.weight, mask=mask)  # as the teaching module
        B, Lq, D = query.shape
        Lk = key.size(1)
        H, d_k = self.num_heads, self.d_k

        # 1) project: one matmul when query, key and value are one tensor
        q, k, v = self._project(query, key, value)  # 3 x (B, L, D)
        # 2) split into heads: views, no copies
        q = q.view(B, Lq, H, d_k).transpose(1, 2)  # (B, H, Lq, d_k)
        k = k.view(B, Lk, H, d_k).transpose(1, 2)  # (B, H, Lk, d_k)
        v = v.view(B, Lk, H, d_k).transpose(1, 2)  # (B, H, Lk, d_k)

        # 3) attend
        dropout_p = self.dropout if self.training else 0.0
        if return_weights:  # the explicit path: the weights must exist to be returned
            heads, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)  # (B, H, Lq, d_k)
        else:
            heads = self._fused_attention(q, k, v, mask, dropout_p)  # (B, H, Lq, d_k)

        # 4) concatenate the heads and 5) mix them
        output = self.W_o(heads.transpose(1, 2).reshape(B, Lq, D))  # (B, Lq, D)
        return (output, weights) if return_weights else output

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``W_q query, W_k key, W_v value`` with as few matmuls as the inputs allow."""
        D = self.d_model
        if query is key and key is value:  # self-attention
            return self.W_qkv(query).split(D, dim=-1)
        w_q, w_kv = self.W_qkv.weight.split([D, 2 * D])  # (D, D), (2D, D)
        b_q, b_kv = (None, None) if self.W_qkv.bias is None else self.W_qkv.bias.split([D, 2 * D])
        q = F.linear(query, w_q, b_q)  # (B, Lq, D)
        if key is value:  # cross-attention to one memory: keys and values in one matmul
            k, v = F.linear(key, w_kv, b_kv).split(D, dim=-1)
            return q, k, v
        w_k, w_v = w_kv.split(D)
        b_k, b_v = (None, None) if b_kv is None else b_kv.split(D)
        return q, F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

    @staticmethod
    def _fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
        """``F.scaled_dot_product_attention`` with mha_lib's masks and fully-masked-row rule."""
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        check_mask(mask, q.shape[:-1] + k.shape[-2:-1])  # (B, H, Lq, Lk)
        if mask.dim() < 2:  # SDPA wants (..., Lq, Lk); a (Lk,) mask applies to every query
            mask = mask.reshape(1, -1)
        # A query that may attend to no key must get a zero output, as in mha_lib. The
        # fused kernels' online softmax can turn such a row into NaN on some devices
        # (pytorch/pytorch#110213), so unblock the row for the kernel and zero it after.
        if mask.dtype == torch.bool:
            blocked = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
            mask = mask | blocked
        else:
            mask = mask.to(q.dtype)
            blocked = torch.isneginf(mask).all(dim=-1, keepdim=True)  # (..., Lq, 1)
            mask = mask.masked_fill(blocked, 0.0)
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return heads.masked_fill(blocked, 0.0)  # (B, H, Lq, d_k)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, d_k={self.d_k}, dropout={self.dropout}"
