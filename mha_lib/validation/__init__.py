"""The input checks of the attention code, in one place.

Every attention module (:class:`~mha_lib.AttentionHead`, :class:`~mha_lib.MultiHeadAttention`,
:class:`~mha_lib.EfficientMultiHeadAttention`) and :func:`~mha_lib.scaled_dot_product_attention`
call these first, so that their own code reads as the maths. An error says what was given,
what was expected and how to fix it, before PyTorch fails with a message about its internals
(or, worse, computes something wrong without failing).

Masks (True = may attend, or float = added to the scores) are matched against the scores
``(..., Lq, Lk)`` by broadcasting, aligned from the right. For the modules' scores
``(B, H, Lq, Lk)`` that means:

==================  ==============================================================
mask shape          meaning
==================  ==============================================================
``(Lk,)``           which keys every query may see
``(Lq, Lk)``        one pattern for every sequence and head (``causal_mask(L)``)
``(H, Lq, Lk)``     one pattern per head, shared by the sequences (chapter 06)
``(1, H, Lq, Lk)``  the same, written out
``(B, 1, 1, Lk)``   which keys each sequence may see (``padding_mask(lengths)``)
``(B, 1, Lq, Lk)``  one pattern per sequence, shared by the heads
``(B, H, Lq, Lk)``  one pattern per sequence and head
==================  ==============================================================

Broadcasting can't tell two shapes apart when their sizes coincide: a 2-D mask is always
``(Lq, Lk)``, also when ``B == Lq`` (a key-padding mask ``(B, Lk)`` must be given as
``(B, 1, 1, Lk)``), and a 3-D mask is always ``(H, Lq, Lk)``, also when ``B == H`` (one
pattern per sequence must be given as ``(B, 1, Lq, Lk)``). Where the sizes differ, such a
mask fails to broadcast and the error names the shape to use instead.
"""

from .masks import check_mask, check_mask_kind
from .sizes import (
    as_index,
    broadcast_shapes,
    check_base,
    check_device,
    check_dropout,
    check_flag,
    check_heads,
    check_num_kv_heads,
    check_positive_int,
    check_positive_number,
    check_rotary,
    check_whole,
    describe,
)
from .tensors import (check_attention_inputs, check_cache, check_forward, check_positions, check_qkv, check_sequence,
                      check_sinks, same_tensor)

__all__ = ["as_index", "broadcast_shapes", "check_attention_inputs", "check_base", "check_cache", "check_device",
           "check_dropout", "check_flag", "check_forward", "check_heads", "check_mask", "check_mask_kind",
           "check_num_kv_heads", "check_positive_int", "check_positive_number", "check_positions", "check_qkv",
           "check_rotary", "check_sequence", "check_sinks", "check_whole", "describe", "same_tensor"]
