"""The task: random tokens in which a random segment reappears later, at a varying offset.

:func:`repeated_segments` draws a batch in one go, with tensor operations only. Each row is
uniform random tokens; a segment of ``length`` tokens starting at ``first`` is copied to
``second``, after the first copy has ended. Once the second copy has begun, every next token
is determined by the earlier copy: those positions are ``predictable``. Nothing else is.

The offset ``second - first`` varies from row to row, so no model can find the copy by
position alone: it must look for the earlier occurrence of the current token.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from ..validation import check_positive_int

__all__ = ["RepeatBatch", "check_task", "repeated_segments"]


@dataclass(frozen=True)
class RepeatBatch:
    """A batch of :func:`repeated_segments`.

    Attributes:
        tokens: ``(B, L)`` long, the token ids.
        predictable: ``(B, L)`` bool, True at the tokens the earlier copy determines: the
            second copy except its first token, positions ``second + 1 ... second + length - 1``.
        first: ``(B,)`` long, where the first copy starts.
        second: ``(B,)`` long, where the second copy starts (``>= first + length``).
        length: ``(B,)`` long, the segment's length.
    """

    tokens: Tensor
    predictable: Tensor
    first: Tensor
    second: Tensor
    length: Tensor

    def to(self, device: torch.device | str) -> RepeatBatch:
        """The same batch on ``device``."""
        return RepeatBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def __len__(self) -> int:
        return self.tokens.size(0)


def check_task(seq_len: object, vocab_size: object, segment: object) -> tuple[int, int, tuple[int, int]]:
    """The task's sizes, checked: ``(seq_len, vocab_size, (shortest, longest))``.

    Both copies must fit one after the other, so the longest segment is at most half of
    ``seq_len``; a segment needs at least 2 tokens (else nothing is predictable) and the
    vocabulary at least 2 tokens (else everything is).
    """
    seq_len = check_positive_int(seq_len, "seq_len")
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2, got {vocab_size}: with one token every sequence is the same")
    if isinstance(segment, (str, bytes)) or not hasattr(segment, "__len__") or len(segment) != 2:  # type: ignore[arg-type]
        raise ValueError(f"segment must be a pair (shortest, longest) of segment lengths, e.g. (6, 10), got {segment!r}")
    shortest = check_positive_int(segment[0], "segment[0] (the shortest segment)")  # type: ignore[index]
    longest = check_positive_int(segment[1], "segment[1] (the longest segment)")  # type: ignore[index]
    if shortest > longest:
        raise ValueError(f"segment=({shortest}, {longest}): the shortest length is more than the longest; "
                         f"write ({longest}, {shortest})")
    if shortest < 2:
        raise ValueError(f"segment=({shortest}, {longest}): a segment needs at least 2 tokens, "
                         "else its copy holds no predictable token")
    if 2 * longest > seq_len:
        raise ValueError(f"segment=({shortest}, {longest}): two copies of {longest} tokens don't fit in "
                         f"seq_len={seq_len}; the longest segment can be at most seq_len // 2 = {seq_len // 2}")
    return seq_len, vocab_size, (shortest, longest)


def _randint_below(high: Tensor, generator: torch.Generator | None) -> Tensor:
    """One uniform int in ``[0, high[b])`` per row, ``high >= 1``, drawn on the CPU."""
    u = torch.rand(high.shape, generator=generator, dtype=torch.float64)
    return (u * high).long().clamp_max(high - 1)


def repeated_segments(
    batch_size: int,
    seq_len: int = 32,
    vocab_size: int = 64,
    segment: tuple[int, int] = (6, 10),
    *,
    generator: torch.Generator | None = None,
) -> RepeatBatch:
    """A batch of random token sequences, each with a segment that appears twice.

    Per row: ``length`` uniform in ``segment`` (both ends included), ``first`` uniform in
    ``[0, seq_len - 2 * length]``, ``second`` uniform in ``[first + length, seq_len - length]``,
    so the copies never overlap and the offset ``second - first`` varies. All other tokens
    are uniform over the vocabulary (a token can occur by chance elsewhere, too).

    Args:
        batch_size: ``B``.
        seq_len: ``L``, the length of every row.
        vocab_size: ``V``; tokens are ``0 ... V - 1``.
        segment: ``(shortest, longest)`` segment length.
        generator: a CPU ``torch.Generator`` (the numbers are the same on every device;
            move the batch with ``.to(device)``); None uses PyTorch's global generator.

    Returns:
        a :class:`RepeatBatch` on the CPU.
    """
    batch_size = check_positive_int(batch_size, "batch_size")
    seq_len, vocab_size, (shortest, longest) = check_task(seq_len, vocab_size, segment)
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator (so every device gets the same numbers), "
                         f"got one on {generator.device}")
    tokens = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)  # (B, L)
    length = shortest + _randint_below(torch.full((batch_size,), longest - shortest + 1), generator)  # (B,)
    first = _randint_below(seq_len - 2 * length + 1, generator)  # (B,) in [0, L - 2n]
    second = first + length + _randint_below(seq_len - 2 * length - first + 1, generator)  # (B,) in [f + n, L - n]

    position = torch.arange(seq_len)  # (L,)
    in_second = (position >= second[:, None]) & (position < (second + length)[:, None])  # (B, L)
    source = torch.where(in_second, position - (second - first)[:, None], position)  # (B, L)
    tokens = tokens.gather(1, source)  # the second copy reads the first one
    predictable = in_second & (position > second[:, None])  # (B, L), not the copy's first token
    return RepeatBatch(tokens, predictable, first, second, length)
