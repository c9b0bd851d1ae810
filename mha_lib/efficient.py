"""Multi-head attention the way production code writes it (chapter 09).

Same maths and the same forward contract as :class:`~mha_lib.MultiHeadAttention`,
with two optimisations:

1. **Fused input projection.** ``W_q, W_k, W_v`` are stacked into one
   ``(D + 2·H_kv·d_k, D)`` weight (``(3·D, D)`` without grouped heads), so
   self-attention projects with one matrix multiplication and splits the result
   (nanoGPT's ``c_attn``, ``nn.MultiheadAttention``'s ``in_proj_weight``).
2. **Fused attention kernel.** :func:`torch.nn.functional.scaled_dot_product_attention`
   picks a flash / memory-efficient kernel where the device has one; such a kernel never
   stores the ``(B, H, Lq, Lk)`` weights. Where no fused kernel takes the inputs, PyTorch
   falls back to its explicit "math" kernel, which does: on the CPU (PyTorch 2.13) for a
   per-head ``(H, Lq, Lk)`` mask, for dropout > 0 in training, and for a float mask that
   requires grad (``tests/test_bench.py`` measures the memory). ``return_weights=True``
   uses the explicit :func:`~mha_lib.scaled_dot_product_attention`, which must store them.

It takes the teaching module's options too: grouped key/value heads (``num_kv_heads``, which
the kernel reads without copies through ``enable_gqa``), RoPE (``rotary``) and a
:class:`~mha_lib.KVCache` for decoding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import check_mask, scaled_dot_product_attention
from .heads import combine_heads, split_heads
from .inference import KVCache, check_cache, check_num_kv_heads, repeat_kv, rotate_and_cache
from .multi_head import MultiHeadAttention
from .positions import check_rotary
from .validation import check_heads, check_qkv

__all__ = ["EfficientMultiHeadAttention"]

# PyTorch 2.5 added enable_gqa: the kernel reads each key/value head for its group of query
# heads, without the copies repeat_kv makes.
SDPA_HAS_GQA = torch.__version__ >= "2.5"


def kernel_mask(
    mask: Tensor | None, scores_shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[Tensor | None, Tensor | None]:
    """mha_lib's mask as the fused kernel takes it, and the rows where a query may attend to no key.

    A query that may attend to no key must get a zero output, as in mha_lib. The fused kernels'
    online softmax can turn such a row into NaN on some devices (pytorch/pytorch#110213), so the
    row is unblocked for the kernel and zeroed after. Returns ``(mask, blocked)``, ``blocked``
    broadcastable to ``(B, H, Lq, 1)`` (None without a mask).
    """
    if mask is None:
        return None, None
    check_mask(mask, torch.Size(scores_shape))  # (B, H, Lq, Lk)
    if mask.dim() < 2:  # SDPA wants (..., Lq, Lk); a (Lk,) mask applies to every query
        mask = mask.reshape(1, -1)
    if mask.dtype == torch.bool:
        blocked = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
        return mask | blocked, blocked
    mask = mask.to(dtype)
    blocked = torch.isneginf(mask).all(dim=-1, keepdim=True)  # (..., Lq, 1)
    return mask.masked_fill(blocked, 0.0), blocked


def fused_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
    """One call of ``F.scaled_dot_product_attention``, with mha_lib's masks and grouped heads.

    q ``(B, H, Lq, d_k)``, k and v ``(B, H_kv, Lk, d_k)`` with ``H_kv`` dividing ``H``;
    returns ``(B, H, Lq, d_k)``.
    """
    n_rep = q.size(1) // k.size(1)
    if n_rep > 1 and not SDPA_HAS_GQA:  # an older PyTorch: copy each key/value head to its group
        k, v, n_rep = repeat_kv(k, n_rep), repeat_kv(v, n_rep), 1  # (B, H, Lk, d_k)
    gqa = {"enable_gqa": True} if n_rep > 1 else {}  # the kernel reads each key/value head for its group
    mask, blocked = kernel_mask(mask, (*q.shape[:-1], k.size(2)), q.dtype)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, **gqa)
    return heads if blocked is None else heads.masked_fill(blocked, 0.0)  # (B, H, Lq, d_k)


class EfficientMultiHeadAttention(nn.Module):
    """Multi-head attention with one fused input projection and a fused attention kernel.

    Args:
        d_model: width of the inputs and of the output.
        num_heads: number of heads ``H``; must divide ``d_model``.
        dropout: dropout on the attention weights, active in training mode only.
        bias: whether the projections have a bias.
        num_kv_heads: number of key/value heads ``H_kv`` (grouped-query attention); must
            divide ``num_heads``; defaults to ``num_heads``.
        rotary: rotate each head's queries and keys by their positions (RoPE), as the teaching module.

    Attributes:
        W_qkv: ``nn.Linear(d_model, d_model + 2 * num_kv_heads * d_k)``; its weight is
            ``cat([W_q.weight, W_k.weight, W_v.weight])`` of the teaching module.
        W_o: ``nn.Linear(d_model, d_model)``, the output projection.
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
        self.d_k = d_model // num_heads
        self.num_kv_heads = check_num_kv_heads(num_heads, num_kv_heads)  # H_kv
        self.rotary = bool(rotary)
        if self.rotary:
            check_rotary(self.d_k)
        self.dropout = dropout
        kv_features = self.num_kv_heads * self.d_k
        self.qkv_sizes = [d_model, kv_features, kv_features]  # the rows of W_q, W_k, W_v in W_qkv
        self.W_qkv = nn.Linear(d_model, sum(self.qkv_sizes), bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_module(cls, mha: MultiHeadAttention) -> EfficientMultiHeadAttention:
        """A copy of ``mha``'s weights (dtype, device, train/eval mode and head counts too), fused.

        Both modules then compute the same function: ``new(q, k, v, mask) == mha(q, k, v, mask)``
        up to rounding.
        """
        if not isinstance(mha, MultiHeadAttention):
            raise TypeError(
                f"from_module expects a mha_lib.MultiHeadAttention, got {type(mha).__name__}"
            )
        bias = mha.W_q.bias is not None
        new = cls(mha.d_model, mha.num_heads, dropout=mha.dropout, bias=bias,
                  num_kv_heads=mha.num_kv_heads, rotary=mha.rotary)
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
        cache: KVCache | None = None,
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
            cache: a :class:`~mha_lib.KVCache` for decoding, as in :class:`MultiHeadAttention`.

        Returns:
            output ``(B, Lq, d_model)``, or ``(output, weights)``.
        """
        check_qkv(query, key, value, self.d_model, weight=self.W_o.weight, mask=mask)  # as the teaching module
        past = check_cache(cache, query, key, value)  # T, the positions already cached (0 without a cache)

        # 1) project: one matmul for self-attention; then 2) split into heads (views, no copies)
        q, k, v = self._project(query, key, value)  # (B, Lq, D), (B, Lk, H_kv·d_k) x 2
        q = split_heads(q, self.num_heads)  # (B, H, Lq, d_k)
        k = split_heads(k, self.num_kv_heads)  # (B, H_kv, Lk, d_k)
        v = split_heads(v, self.num_kv_heads)  # (B, H_kv, Lk, d_k)
        # RoPE on q and k (rotary=True); with a cache, append k and v and see the past (chapters 06, 10)
        q, k, v, mask = rotate_and_cache(q, k, v, mask, rotary=self.rotary, cache=cache, past=past)

        # 3) attend: the fused kernel, or the explicit path when the weights must exist to be returned
        dropout_p = self.dropout if self.training else 0.0
        if return_weights:
            n_rep = self.num_heads // self.num_kv_heads
            heads, weights = scaled_dot_product_attention(
                q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask, dropout_p
            )  # (B, H, Lq, d_k), (B, H, Lq, Lk)
        else:
            heads = fused_attention(q, k, v, mask, dropout_p)  # (B, H, Lq, d_k)

        # 4) concatenate the heads and 5) mix them
        output = self.W_o(combine_heads(heads))  # (B, Lq, D)
        return (output, weights) if return_weights else output

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, ...]:
        """``W_q query, W_k key, W_v value``: one matmul for self-attention, three otherwise."""
        if query is key and key is value:  # self-attention: one fused matmul, then split
            return self.W_qkv(query).split(self.qkv_sizes, dim=-1)
        weights = self.W_qkv.weight.split(self.qkv_sizes)  # (D, D), (H_kv·d_k, D) x 2
        biases = [None] * 3 if self.W_qkv.bias is None else self.W_qkv.bias.split(self.qkv_sizes)
        return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))

    def extra_repr(self) -> str:
        grouped = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        rotary = ", rotary=True" if self.rotary else ""  # the defaults stay unsaid, as before
        return f"d_model={self.d_model}, num_heads={self.num_heads}{grouped}, d_k={self.d_k}, dropout={self.dropout}{rotary}"
