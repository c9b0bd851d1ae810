"""One attention head as a module: project, then attend.

Trainable projections ``W_q, W_k, W_v`` turn every token's embedding into its
query (what it looks for), key (what it offers) and value (what it hands over);
scaled dot-product attention then blends the values (chapter 02). A multi-head
module is ``H`` such heads side by side, followed by an output projection
(chapter 03).
"""

from __future__ import annotations

from torch import Tensor, nn

from .attention import scaled_dot_product_attention
from .validation import check_flag, check_positive_int, check_qkv

__all__ = ["AttentionHead"]


class AttentionHead(nn.Module):
    """A single attention head.

    Args:
        d_model: width of the inputs (the token embeddings).
        d_k: width of the queries and keys.
        d_v: width of the values, and so of the output; default ``d_k``.
        bias: whether the three projections have a bias.

    Attributes:
        W_q, W_k: ``nn.Linear(d_model, d_k)``; their ``.weight`` is ``(d_k, d_model)``.
        W_v: ``nn.Linear(d_model, d_v)``; its ``.weight`` is ``(d_v, d_model)``.
    """

    def __init__(self, d_model: int, d_k: int, d_v: int | None = None, bias: bool = True) -> None:
        super().__init__()
        d_model, d_k = check_positive_int(d_model, "d_model"), check_positive_int(d_k, "d_k")
        d_v = d_k if d_v is None else check_positive_int(d_v, "d_v")
        bias = check_flag(bias, "bias")  # bias="no" would count as true
        self.d_model = d_model
        self.d_k = d_k
        self.d_v = d_v
        self.W_q = nn.Linear(d_model, d_k, bias=bias)
        self.W_k = nn.Linear(d_model, d_k, bias=bias)
        self.W_v = nn.Linear(d_model, d_v, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(B, Lq, d_model)``.
            key: ``(B, Lk, d_model)``.
            value: ``(B, Lk, d_model)``. For self-attention pass the same tensor
                three times; for cross-attention ``Lq`` may differ from ``Lk``.
            mask: optional, broadcastable to the scores ``(B, Lq, Lk)``; bool
                ``True`` = may attend, or float added to the scores (0/-inf or a
                bias; 0s and 1s are refused: use ``.bool()``). ``(Lq, Lk)``
                applies to every sequence, e.g. ``causal_mask(L)``; ``(B, 1, Lk)``
                masks each sequence's keys, e.g. ``padding_mask(lengths)[:, 0]``;
                ``(B, Lq, Lk)`` is one pattern per sequence. A 2-D mask is always
                ``(Lq, Lk)``, also when ``B == Lq``.
            return_weights: also return the attention weights.

        Returns:
            output ``(B, Lq, d_v)``, or ``(output, weights)`` with weights
            ``(B, Lq, Lk)`` when ``return_weights`` is True.
        """
        self._check_inputs(query, key, value, mask)
        return_weights = check_flag(return_weights, "return_weights")
        q = self.W_q(query)  # (B, Lq, d_k): what each token looks for
        k = self.W_k(key)  # (B, Lk, d_k): what each token offers
        v = self.W_v(value)  # (B, Lk, d_v): what each token hands over
        output, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, Lq, d_v), (B, Lq, Lk)
        return (output, weights) if return_weights else output

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> None:
        check_qkv(query, key, value, self.d_model, weight=self.W_q.weight, mask=mask)
        if isinstance(mask, Tensor) and mask.dim() > 3:
            raise ValueError(
                f"a single head's scores are (B, Lq, Lk), so its mask may have at most 3 "
                f"dimensions, got {tuple(mask.shape)}; for padding_mask(lengths), which is "
                f"(B, 1, 1, Lk), pass padding_mask(lengths)[:, 0]"
            )

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_k={self.d_k}, d_v={self.d_v}"
