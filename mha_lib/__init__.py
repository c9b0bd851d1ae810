"""mha_lib: the multi-head attention course's small, tested library.

Each chapter derives a piece and the next chapters import it from here:

- :func:`scaled_dot_product_attention` (chapter 01)
- :func:`causal_mask`, :func:`padding_mask` (chapters 01, 04)
- :class:`AttentionHead` (chapter 02)
- :func:`split_heads`, :func:`combine_heads`, :class:`MultiHeadAttention` (chapter 03)
- :func:`sinusoidal_positions`, :func:`apply_rotary`, :func:`rotary_permutation`, :func:`alibi_bias`,
  :func:`relative_position_buckets` (chapter 06, positions inside attention)
- :class:`EncoderLayer` and :mod:`mha_lib.sentiment` (chapter 07)
- :mod:`mha_lib.induction`: induction heads in an attention-only transformer (chapter 08)
- :class:`EfficientMultiHeadAttention` and ``python -m mha_lib.bench`` (chapter 10)
- :class:`KVCache`, :func:`kv_cache_bytes`, :func:`repeat_kv`, :func:`sliding_window_mask` (chapter 11, attention at inference)
- :class:`MultiHeadLatentAttention`, :class:`LatentCache`, :func:`latent_cache_bytes` (chapter 11, latent attention)
- :mod:`mha_lib.checks`: the exercises' self-graded checks
- :mod:`mha_lib.textlm`: a small language model of real text, its tokenizer and its heads' scores (chapter 09)
- :func:`attention_explorer`: every head of a causal model on one text, interactive (chapter 09)
- :func:`get_device`, :func:`seed_everything`, :func:`plot_attention` (everywhere)

``import mha_lib`` imports PyTorch and Matplotlib. The learner's commands (``make exercise``,
``make progress``) are a package apart, :mod:`mha_course`, which never imports this one.
"""

from .attention import scaled_dot_product_attention
from .device import get_device, seed_everything
from .efficient import EfficientMultiHeadAttention
from .encoder import EncoderLayer
from .explorer import attention_explorer
from .heads import combine_heads, split_heads
from .inference import KVCache, kv_cache_bytes, repeat_kv
from .latent import LatentCache, MultiHeadLatentAttention, latent_cache_bytes
from .masks import causal_mask, padding_mask, sliding_window_mask
from .multi_head import MultiHeadAttention
from .plotting import plot_attention
from .positions import alibi_bias, apply_rotary, relative_position_buckets, rotary_permutation, sinusoidal_positions
from .single_head import AttentionHead

# The course's subpackages, so that `import mha_lib` gives mha_lib.sentiment and the rest;
# last, so that they may import the names above from mha_lib.
from . import bench, checks, induction, sentiment, textlm

__version__ = "0.1.0"

__all__ = [
    "AttentionHead",
    "EfficientMultiHeadAttention",
    "EncoderLayer",
    "KVCache",
    "LatentCache",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "alibi_bias",
    "apply_rotary",
    "attention_explorer",
    "causal_mask",
    "combine_heads",
    "get_device",
    "kv_cache_bytes",
    "latent_cache_bytes",
    "padding_mask",
    "plot_attention",
    "relative_position_buckets",
    "repeat_kv",
    "rotary_permutation",
    "scaled_dot_product_attention",
    "seed_everything",
    "sinusoidal_positions",
    "sliding_window_mask",
    "split_heads",
]
