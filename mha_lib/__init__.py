"""mha_lib: the multi-head attention course's small, tested library.

Each chapter derives a piece and the next chapters import it from here:

- :func:`scaled_dot_product_attention` (chapter 01)
- :func:`causal_mask`, :func:`padding_mask` (chapters 01, 04)
- :class:`AttentionHead` (chapter 02)
- :func:`split_heads`, :func:`combine_heads`, :class:`MultiHeadAttention` (chapter 03)
- :class:`EncoderLayer` and :mod:`mha_lib.sentiment` (chapter 06)
- :class:`EfficientMultiHeadAttention` and ``python -m mha_lib.bench`` (chapter 07)
- :mod:`mha_lib.checks`: the exercises' self-graded checks
- :func:`get_device`, :func:`seed_everything`, :func:`plot_attention` (everywhere)
"""

from .attention import scaled_dot_product_attention
from .device import get_device, seed_everything
from .efficient import EfficientMultiHeadAttention
from .encoder import EncoderLayer
from .heads import combine_heads, split_heads
from .masks import causal_mask, padding_mask
from .multi_head import MultiHeadAttention
from .plotting import plot_attention
from .single_head import AttentionHead

__version__ = "0.1.0"

__all__ = [
    "AttentionHead",
    "EfficientMultiHeadAttention",
    "EncoderLayer",
    "MultiHeadAttention",
    "causal_mask",
    "combine_heads",
    "get_device",
    "padding_mask",
    "plot_attention",
    "scaled_dot_product_attention",
    "seed_everything",
    "split_heads",
]
