"""mha_lib: the multi-head attention course's small, tested library.

Each chapter derives a piece and the next chapters import it from here:

- :func:`scaled_dot_product_attention` (chapter 01)
- :func:`causal_mask`, :func:`padding_mask` (chapters 01, 04)
- :class:`AttentionHead` (chapter 02)
- :func:`split_heads`, :func:`combine_heads`, :class:`MultiHeadAttention` (chapter 03)
- :func:`sinusoidal_positions`, :func:`apply_rotary` (chapter 06, positions inside attention)
- :class:`EncoderLayer` and :mod:`mha_lib.sentiment` (chapter 07)
- :mod:`mha_lib.induction`: induction heads in an attention-only transformer (chapter 08)
- :class:`EfficientMultiHeadAttention` and ``python -m mha_lib.bench`` (chapter 09)
- :class:`KVCache`, :func:`kv_cache_bytes`, :func:`repeat_kv`, :func:`sliding_window_mask` (chapter 10, attention at inference)
- :mod:`mha_lib.checks`: the exercises' self-graded checks
- :func:`get_device`, :func:`seed_everything`, :func:`plot_attention` (everywhere)

The names are loaded on first use (PEP 562): ``import mha_lib`` alone imports neither
PyTorch nor Matplotlib, so that ``python -m mha_lib start 01`` answers at once.
``from mha_lib import MultiHeadAttention`` and ``mha_lib.MultiHeadAttention`` work as usual;
so do submodules, e.g. ``mha_lib.sentiment`` after ``import mha_lib``.

To export a new name, add it in three places: ``_EXPORTS`` (name -> the submodule that
defines it), ``__all__``, and the ``TYPE_CHECKING`` imports, which tell type checkers and
IDEs what it is (tests/test_lazy_import.py checks that the three agree).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Every public name, and the submodule (mha_lib/<module>.py) that defines it.
_EXPORTS: dict[str, str] = {
    "scaled_dot_product_attention": "attention",
    "get_device": "device",
    "seed_everything": "device",
    "EfficientMultiHeadAttention": "efficient",
    "EncoderLayer": "encoder",
    "combine_heads": "heads",
    "split_heads": "heads",
    "KVCache": "inference",
    "kv_cache_bytes": "inference",
    "repeat_kv": "inference",
    "causal_mask": "masks",
    "padding_mask": "masks",
    "sliding_window_mask": "masks",
    "MultiHeadAttention": "multi_head",
    "plot_attention": "plotting",
    "apply_rotary": "positions",
    "sinusoidal_positions": "positions",
    "AttentionHead": "single_head",
}

# A literal list, as type checkers need it for `from mha_lib import *`.
__all__ = [
    "AttentionHead",
    "EfficientMultiHeadAttention",
    "EncoderLayer",
    "KVCache",
    "MultiHeadAttention",
    "apply_rotary",
    "causal_mask",
    "combine_heads",
    "get_device",
    "kv_cache_bytes",
    "padding_mask",
    "plot_attention",
    "repeat_kv",
    "scaled_dot_product_attention",
    "seed_everything",
    "sinusoidal_positions",
    "sliding_window_mask",
    "split_heads",
]

if TYPE_CHECKING:  # what type checkers see; at run time, __getattr__ (_load) loads these on first use
    from .attention import scaled_dot_product_attention as scaled_dot_product_attention
    from .device import get_device as get_device
    from .device import seed_everything as seed_everything
    from .efficient import EfficientMultiHeadAttention as EfficientMultiHeadAttention
    from .encoder import EncoderLayer as EncoderLayer
    from .heads import combine_heads as combine_heads
    from .heads import split_heads as split_heads
    from .inference import KVCache as KVCache
    from .inference import kv_cache_bytes as kv_cache_bytes
    from .inference import repeat_kv as repeat_kv
    from .masks import causal_mask as causal_mask
    from .masks import padding_mask as padding_mask
    from .masks import sliding_window_mask as sliding_window_mask
    from .multi_head import MultiHeadAttention as MultiHeadAttention
    from .plotting import plot_attention as plot_attention
    from .positions import apply_rotary as apply_rotary
    from .positions import sinusoidal_positions as sinusoidal_positions
    from .single_head import AttentionHead as AttentionHead


def _load(name: str) -> Any:
    """Load ``name`` from its submodule on first use, then keep it as a module attribute."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif not name.startswith("_"):
        try:  # a submodule: mha_lib.sentiment, mha_lib.checks, ...
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise  # the submodule exists, but something it imports is missing
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if not TYPE_CHECKING:  # type checkers would take a module __getattr__ to accept any name, typos too
    __getattr__ = _load
