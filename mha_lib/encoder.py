"""A transformer encoder layer: multi-head self-attention, then a feed-forward network.

Each of the two sublayers is wrapped the same way (pre-norm):

    x = x + Dropout(MultiHeadAttention(LayerNorm(x)))
    x = x + Dropout(FeedForward(LayerNorm(x)))

*Transformers in Action* (section 2.2.1) describes the original, post-norm order,
``x = LayerNorm(x + Dropout(Sublayer(x)))``. We normalize *before* each sublayer
instead (Xiong et al., 2020, "On Layer Normalization in the Transformer
Architecture"): the residual path then carries ``x`` through the layer untouched,
the gradients stay well scaled, and training is stable without a learning-rate
warm-up. It is ``nn.TransformerEncoderLayer(..., norm_first=True)``; a stack of
pre-norm layers needs one final ``LayerNorm`` after the last layer.
"""

from __future__ import annotations

from torch import Tensor, nn

from .multi_head import MultiHeadAttention
from .validation import check_dropout, check_flag, check_positive_int, check_sequence

__all__ = ["EncoderLayer"]


class EncoderLayer(nn.Module):
    """One pre-norm encoder layer: self-attention and a position-wise feed-forward network.

    Args:
        d_model: width of the token vectors, in and out.
        num_heads: number of attention heads; must divide ``d_model``.
        d_ff: hidden width of the feed-forward network (the paper: ``4 * d_model``).
        dropout: dropout on the attention weights, inside the feed-forward network
            and on each sublayer's output before it is added back; active in
            training mode only.

    Attributes:
        self_attn: the :class:`~mha_lib.MultiHeadAttention` module.
        feed_forward: ``Linear(d_model, d_ff) -> ReLU -> Dropout -> Linear(d_ff, d_model)``,
            applied to every position on its own.
        norm1, norm2: the layer norms before the attention and the feed-forward sublayers.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        d_ff, dropout = check_positive_int(d_ff, "d_ff"), check_dropout(dropout)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)  # checks d_model, num_heads
        self.d_model = d_model = self.self_attn.d_model  # a plain int, also for np.int64(8)
        self.feed_forward = nn.Sequential(
            nn.Linear(d_model, d_ff),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(d_ff, d_model),
        )
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, return_weights: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Let every token attend to the sequence, then transform each token on its own.

        Args:
            x: ``(B, L, d_model)``.
            mask: optional, broadcastable to ``(B, H, L, L)``; bool ``True`` = may
                attend (e.g. :func:`~mha_lib.padding_mask`'s ``(B, 1, 1, L)``, or a
                per-head ``(H, L, L)``), or float added to the scores; the shapes
                :class:`~mha_lib.MultiHeadAttention` accepts.
            return_weights: also return the attention weights.

        Returns:
            ``(B, L, d_model)``, or ``(output, weights)`` with weights ``(B, H, L, L)``.
        """
        check_sequence(x, "x", self.d_model, weight=self.norm1.weight)  # the attention checks the mask
        return_weights = check_flag(return_weights, "return_weights")

        # 1) attention sublayer: normalize, attend, drop out, add back
        h = self.norm1(x)  # (B, L, D)
        attended, weights = self.self_attn(h, h, h, mask=mask, return_weights=True)  # (B, L, D), (B, H, L, L)
        x = x + self.dropout(attended)  # (B, L, D)

        # 2) feed-forward sublayer: the same two-layer network at every position
        x = x + self.dropout(self.feed_forward(self.norm2(x)))  # (B, L, D)
        return (x, weights) if return_weights else x

    def extra_repr(self) -> str:
        return "norm_first=True"
