"""Positions for attention: sinusoidal encodings added to the input, rotary ones inside each head.

Attention alone is permutation-equivariant: shuffle the tokens and the outputs shuffle with
them. Three ways to tell it where each token sits:

- :func:`sinusoidal_positions` (Vaswani et al., 2017) makes a ``(L, d_model)`` table that is
  *added* to the token embeddings once, before the first layer.
- :func:`apply_rotary` (RoPE, Su et al., 2021) *rotates* every head's queries and keys by an
  angle proportional to their position, inside every layer. The score ``q_i · k_j`` then
  depends on the positions only through the offset ``i - j``; the values are left alone.
- :func:`alibi_bias` (Press et al., 2022) and :func:`relative_position_buckets` (T5, Raffel et
  al., 2020) make a bias *added to the scores*, one ``(L, L)`` pattern per head that depends
  on ``i - j`` only: a float mask ``(H, L, L)`` that the attention modules take as it is.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .validation import check_base, check_device, check_flag, check_positive_int, describe

__all__ = ["sinusoidal_positions", "apply_rotary", "rotary_permutation", "alibi_slopes", "alibi_bias", "relative_position_buckets"]


def sinusoidal_positions(seq_len: int, d_model: int, device: torch.device | str | None = None) -> Tensor:
    """The sinusoidal position encodings of *Attention Is All You Need* (section 3.5).

        PE[pos, 2i]     = sin(pos / 10000^(2i / d_model))
        PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))

    Each pair of features ``(2i, 2i + 1)`` is a point on a circle turning with the position,
    fast for small ``i``, slowly for large ``i``. An odd ``d_model`` is allowed: its last
    feature is the sine of one more frequency, whose cosine has no room.

    Returns:
        float32 ``(seq_len, d_model)``; row ``pos`` is added to the embedding of token ``pos``.
    """
    seq_len, d_model = check_positive_int(seq_len, "seq_len"), check_positive_int(d_model, "d_model")
    device = check_device(device)
    pos = torch.arange(seq_len, dtype=torch.float64, device=device)[:, None]  # (L, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # (ceil(D/2),)
    angles = pos / 10000.0 ** (two_i / d_model)  # (L, ceil(D/2))
    table = torch.empty(seq_len, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = angles.sin()  # even features, ceil(D/2) of them
    table[:, 1::2] = angles[:, : d_model // 2].cos()  # odd features, floor(D/2) of them
    return table.float()  # (L, D)


def apply_rotary(x: Tensor, positions: Tensor | None = None, base: float = 10000.0,
                 interleaved: bool = False) -> Tensor:
    """Rotate queries or keys by their positions (RoPE); ``(..., L, d_k) -> (..., L, d_k)``.

    The ``d_k`` features of each head form ``d_k / 2`` pairs; pair ``i`` at position ``m``
    is rotated by the angle ``m · θ_i`` with ``θ_i = base^(-2i / d_k)``:

        (a, b) -> (a cos(mθ_i) - b sin(mθ_i),  a sin(mθ_i) + b cos(mθ_i))

    A rotation keeps every vector's length, and position 0 is left unchanged. Since rotating
    ``q`` by ``iθ`` and ``k`` by ``jθ`` rotates their dot product by ``(i - j)θ``, the score
    ``q_i · k_j`` depends on the positions only through the offset ``i - j``.

    Pairing convention: by default **half-split**, pair ``i`` is features ``(i, i + d_k/2)``,
    as in GPT-NeoX and Hugging Face's LLaMA/Mistral/Qwen (``rotate_half``), the code a learner
    is most likely to read. ``interleaved=True`` pairs neighbours ``(2i, 2i + 1)``, as the
    RoFormer paper, GPT-J and Meta's original LLaMA code do. The two differ only by a fixed
    permutation of each head's features (evens first, then odds), the same one applied to the
    rows of ``W_q`` and ``W_k`` when a checkpoint is converted between them; both give the
    offset property, but weights trained with one are wrong with the other.

    Args:
        x: ``(..., L, d_k)`` with even ``d_k``, usually a ``(B, H, L, d_k)`` tensor of queries
            or keys right after :func:`~mha_lib.split_heads`. Never apply it to the values.
        positions: integer tensor, the position of each of the ``L`` rows: ``(L,)`` for every
            sequence alike (or ``(1, L)``, as Hugging Face's ``position_ids`` often come), or
            ``(B, L)`` per sequence (``x`` then has ``B`` as its first
            dimension: ``(B, L, d_k)`` or ``(B, H, L, d_k)``), e.g. a left-padded batch whose
            real tokens start at different offsets. Defaults to ``arange(L)``. A decoder with a
            cache of ``T`` tokens passes ``arange(T, T + L)``. Moved to ``x``'s device.
        base: the wavelength scale; 10000 as in the paper (500000 in LLaMA 3).
        interleaved: pair neighbours ``(2i, 2i + 1)`` instead of ``(i, i + d_k/2)``.

    Returns:
        the rotated tensor, same shape and dtype as ``x``.
    """
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ValueError(f"apply_rotary expects (..., L, d_k), got {describe(x)}")
    if not x.is_floating_point():
        raise TypeError(f"apply_rotary rotates floating-point queries or keys, got dtype {x.dtype}; e.g. x.float()")
    L, d_k = x.shape[-2:]
    if d_k % 2 != 0:
        raise ValueError(f"apply_rotary needs an even d_k (features are rotated in pairs), got d_k={d_k}")
    if positions is None:
        positions = torch.arange(L, device=x.device)
    if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.is_complex() \
            or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor (L,), (1, L) or (B, L), "
                        f"got {getattr(positions, 'dtype', type(positions).__name__)!r}")
    if positions.shape == (1, L):
        positions = positions[0]  # one row shared by every sequence: the same as (L,)
    if positions.dim() == 2 and x.dim() >= 3 and positions.shape == (x.size(0), L):
        positions = positions.reshape(x.size(0), *[1] * (x.dim() - 3), L)  # (B, 1, ..., L): per sequence
    elif positions.shape != (L,):
        per_sequence = f" or (B, L) = ({x.size(0)}, {L})" if x.dim() >= 3 else ""
        raise ValueError(f"positions must have shape (L,) = ({L},), (1, L){per_sequence} for x of shape {tuple(x.shape)}, "
                         f"got {tuple(positions.shape)}")
    base = check_base(base)
    interleaved = check_flag(interleaved, "interleaved")

    dtype = torch.promote_types(x.dtype, torch.float32)  # angles in at least float32
    half = d_k // 2
    theta = base ** (-torch.arange(half, dtype=dtype, device=x.device) * 2 / d_k)  # (d_k/2,)
    angles = positions.to(device=x.device, dtype=dtype)[..., None] * theta  # (L, d_k/2) or (B, 1, ..., L, d_k/2)
    cos, sin = angles.cos(), angles.sin()  # broadcast over (...)
    if interleaved:  # neighbours (2i, 2i + 1)
        a, b = x[..., 0::2].to(dtype), x[..., 1::2].to(dtype)  # (..., L, d_k/2) each
        rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)  # (..., L, d_k)
    else:  # halves (i, i + d_k/2)
        a, b = x.to(dtype).split(half, dim=-1)  # (..., L, d_k/2) each: the pairs (a_i, b_i)
        rotated = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)  # (..., L, d_k)
    return rotated.to(x.dtype)


def rotary_permutation(d_k: int) -> Tensor:
    """The permutation of one head's features that turns neighbour pairing into half-split pairing.

    ``perm = [0, 2, 4, …, d_k - 2, 1, 3, …, d_k - 1]`` (evens first, then odds), int64 ``(d_k,)``:
    ``apply_rotary(x, interleaved=True)[..., perm] == apply_rotary(x[..., perm])``. A checkpoint
    trained with neighbour pairing runs with half-split pairing after ``W[perm]`` on each head's
    rows of ``W_q`` and ``W_k`` (and their biases); the scores are then unchanged, since a dot
    product ignores an order of features that its two sides share. ``argsort(perm)`` goes back.
    """
    d_k = check_positive_int(d_k, "d_k")
    if d_k % 2 != 0:
        raise ValueError(f"rotary_permutation needs an even d_k (features are rotated in pairs), got d_k={d_k}")
    return torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's slope per head: ``(H,)``, a geometric sequence that starts at ``2^(-8/H)``.

    For ``H`` a power of two, head ``h`` (from 1) gets ``2^(-8h/H)``: 8 heads get
    ``1/2, 1/4, …, 1/256``. Otherwise, as in the paper's code: the slopes of the largest power
    of two ``n < H``, then every other slope of ``2n`` heads.
    """
    num_heads = check_positive_int(num_heads, "num_heads")

    def powers_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    n = 2 ** (num_heads.bit_length() - 1)  # the largest power of two <= H
    slopes = powers_of_two(n) + powers_of_two(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(num_heads: int, seq_len: int, device: torch.device | str | None = None) -> Tensor:
    """ALiBi (Press et al., 2022): ``bias[h, i, j] = -m_h · |i - j|``, float32 ``(H, L, L)``.

    Added to the scores (pass it as the ``mask``, or add it to a float mask), it lowers each
    score in proportion to the distance, more steeply in the heads with larger slopes
    (:func:`alibi_slopes`). The paper's decoders use it with a causal mask, where ``|i - j|``
    is ``i - j``; no position is added to the embeddings.
    """
    seq_len, device = check_positive_int(seq_len, "seq_len"), check_device(device)
    positions = torch.arange(seq_len, device=device)
    distance = (positions[:, None] - positions[None, :]).abs().float()  # (L, L)
    return 0.0 - alibi_slopes(num_heads).to(device)[:, None, None] * distance  # (H, L, L); 0.0 -: no -0.0


def relative_position_buckets(seq_len: int, num_buckets: int = 32, max_distance: int = 128,
                              bidirectional: bool = True, device: torch.device | str | None = None) -> Tensor:
    """T5's relative-position buckets: ``bucket[i, j]`` for the offset ``j - i``, int64 ``(L, L)``.

    Each bucket owns one learned scalar per head (``nn.Embedding(num_buckets, H)``), and the
    bias added to the scores is that table looked up here: ``table(buckets).permute(2, 0, 1)``,
    ``(H, L, L)``. Small offsets get a bucket each, larger ones share buckets whose width grows
    logarithmically up to ``max_distance``; farther offsets share the last bucket. With
    ``bidirectional``, keys before and after the query use separate halves of the buckets
    (an encoder); otherwise keys after the query all fall in bucket 0 (a causal decoder masks them).
    """
    seq_len, num_buckets = check_positive_int(seq_len, "seq_len"), check_positive_int(num_buckets, "num_buckets")
    max_distance, device = check_positive_int(max_distance, "max_distance"), check_device(device)
    bidirectional = check_flag(bidirectional, "bidirectional")
    positions = torch.arange(seq_len, device=device)
    relative = positions[None, :] - positions[:, None]  # (L, L): key minus query, as in T5
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0).long() * num_buckets  # keys after the query: the upper half
        relative = relative.abs()
    else:
        relative = (-relative).clamp(min=0)  # distance to an earlier key; later keys count as 0
    exact = max(num_buckets // 2, 1)  # offsets below this get a bucket each
    logarithmic = exact + (
        torch.log(relative.float().clamp(min=1) / exact) / math.log(max(max_distance / exact, 1 + 1e-9))
        * (num_buckets - exact)
    ).long()
    logarithmic = logarithmic.clamp(max=num_buckets - 1)
    return buckets + torch.where(relative < exact, relative, logarithmic)  # (L, L)
