"""Multi-head attention the way production code writes it (chapter 10).

:class:`EfficientMultiHeadAttention` is :class:`~mha_lib.MultiHeadAttention` (same arguments,
forward, checks, RoPE and cache) with two of its methods replaced:

1. **project** (steps 1 and 2): ``W_q, W_k, W_v`` stacked into one ``(D + 2·H_kv·d_k, D)`` weight
   ``W_qkv`` (``(3·D, D)`` without grouped heads), so that self-attention projects with one
   matrix multiplication (nanoGPT's ``c_attn``, ``nn.MultiheadAttention``'s ``in_proj_weight``)
   and cuts its output into the heads of ``q``, ``k`` and ``v`` at once (a view, a transpose and a
   split: views, no copies);
2. **attend**: :func:`torch.nn.functional.scaled_dot_product_attention`, which picks a flash /
   memory-efficient kernel where the device has one; such a kernel never stores the
   ``(B, H, Lq, Lk)`` weights, and reads each key/value head for its group of query heads
   (``enable_gqa``) without copies. Where no fused kernel takes the inputs, PyTorch falls back
   to its explicit "math" kernel, which does store them: on the CPU (PyTorch 2.13) for dropout
   > 0 in training, for a float mask that requires grad, and for a mask of 3 dimensions (the
   CPU's fused kernel takes a mask of 2 or 4). So the module gives the kernel every mask with 4
   dimensions (``(H, Lq, Lk)`` as ``(1, H, Lq, Lk)``, a view): per-head masks and biases such as
   ALiBi's run the fused kernel (``tests/test_efficient.py`` reads the kernel from the autograd graph,
   ``tests/test_bench.py`` measures the memory). ``return_weights=True`` takes the teaching
   module's explicit path, which must store them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .multi_head import MultiHeadAttention
from .validation import same_tensor

__all__ = ["EfficientMultiHeadAttention"]


class EfficientMultiHeadAttention(MultiHeadAttention):
    """Multi-head attention with one fused input projection and a fused attention kernel.

    Takes the arguments of :class:`~mha_lib.MultiHeadAttention` and computes the same function.

    Attributes:
        W_qkv: ``nn.Linear(d_model, d_model + 2 * num_kv_heads * d_k)``; its weight is
            ``cat([W_q.weight, W_k.weight, W_v.weight])`` of the teaching module.
        W_o: ``nn.Linear(d_model, d_model)``, the output projection.
    """

    def make_projections(self, bias: bool) -> None:
        kv_features = self.num_kv_heads * self.d_k
        self.qkv_sizes = [self.d_model, kv_features, kv_features]  # the rows of W_q, W_k, W_v in W_qkv
        self.qkv_heads = [self.num_heads, self.num_kv_heads, self.num_kv_heads]  # the same rows, in heads of d_k
        self.W_qkv = nn.Linear(self.d_model, sum(self.qkv_sizes), bias=bias)
        self.W_o = nn.Linear(self.d_model, self.d_model, bias=bias)

    @classmethod
    def from_module(cls, mha: MultiHeadAttention) -> EfficientMultiHeadAttention:
        """A copy of ``mha``'s weights (dtype, device, train/eval mode and head counts too), fused.

        Both modules then compute the same function: ``new(q, k, v, mask) == mha(q, k, v, mask)``
        up to rounding.
        """
        if not isinstance(mha, MultiHeadAttention) or isinstance(mha, EfficientMultiHeadAttention):
            raise TypeError(f"from_module expects a mha_lib.MultiHeadAttention (with W_q, W_k, W_v), "
                            f"got {type(mha).__name__}")
        if getattr(mha, "sinks", None) is not None:
            raise ValueError("from_module: this module has learned sinks (sinks=True), which the fused kernel cannot "
                             "take; keep the teaching module for it")
        bias = mha.W_q.bias is not None
        rope = {"rope_base": mha.rope_base, "rope_interleaved": mha.rope_interleaved} if mha.rotary else {}
        new = cls(mha.d_model, mha.num_heads, dropout=mha.dropout, bias=bias,
                  num_kv_heads=mha.num_kv_heads, rotary=mha.rotary, qk_norm=mha.qk_norm, **rope)
        new.to(device=mha.W_q.weight.device, dtype=mha.W_q.weight.dtype)
        with torch.no_grad():
            if mha.qk_norm:
                new.q_norm.load_state_dict(mha.q_norm.state_dict())
                new.k_norm.load_state_dict(mha.k_norm.state_dict())
            new.W_qkv.weight.copy_(torch.cat([mha.W_q.weight, mha.W_k.weight, mha.W_v.weight]))
            new.W_o.weight.copy_(mha.W_o.weight)
            if bias:
                new.W_qkv.bias.copy_(torch.cat([mha.W_q.bias, mha.W_k.bias, mha.W_v.bias]))
                new.W_o.bias.copy_(mha.W_o.bias)
        return new.train(mha.training)

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Steps 1 and 2. Self-attention: one matrix multiplication, whose output is cut into all
        ``H + 2·H_kv`` heads at once (three operations where separating ``q, k, v`` first and then
        splitting each takes seven). Otherwise: three slices of ``W_qkv``, then :meth:`split`."""
        if same_tensor(query, key) and same_tensor(key, value):
            B, L, _ = query.shape
            heads = self.W_qkv(query).view(B, L, sum(self.qkv_heads), self.d_k).transpose(1, 2)  # (B, H + 2·H_kv, L, d_k)
            # views (B, H, L, d_k), (B, H_kv, L, d_k) x 2; split_with_sizes is .split's op without its 2 µs of Python
            return heads.split_with_sizes(self.qkv_heads, dim=1)
        weights = self.W_qkv.weight.split(self.qkv_sizes)  # (D, D), (H_kv·d_k, D) x 2
        biases = [None] * 3 if self.W_qkv.bias is None else self.W_qkv.bias.split(self.qkv_sizes)
        q, k, v = (F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))
        return self.split(q, k, v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
               return_weights: bool) -> tuple[Tensor, Tensor | None]:
        """Step 3: one call of the fused kernel (the explicit path when the weights are wanted).

        A query that may attend to no key gets a zero output, as in the teaching module: the
        fused kernels' online softmax can turn such a row into NaN on some devices
        (pytorch/pytorch#110213), so the row is unblocked for the kernel and zeroed after.
        """
        if return_weights:
            return super().attend(q, k, v, mask, return_weights)
        blocked = None
        if mask is not None:
            # (B, H, Lq, Lk), a view: the CPU's fused kernel takes a 2-D or a 4-D mask only, and sends a
            # 3-D (H, Lq, Lk) one to the math kernel, which stores the weights; a (Lk,) mask applies to every query
            mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
            if mask.dtype == torch.bool:
                blocked = ~mask.any(dim=-1, keepdim=True)  # (..., Lq, 1)
                mask = mask | blocked
            else:
                blocked = torch.isneginf(mask).all(dim=-1, keepdim=True)  # (..., Lq, 1)
                mask = mask.to(q.dtype).masked_fill(blocked, 0.0)
        grouped = self.num_kv_heads != self.num_heads  # the kernel reads each key/value head for its group
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped,
                                               dropout_p=self.dropout if self.training else 0.0)
        return (heads if blocked is None else heads.masked_fill(blocked, 0.0)), None  # (B, H, Lq, d_k)
