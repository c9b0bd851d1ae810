"""The biases that ALiBi's recipe and its usual mistakes give (for :mod:`mha_lib.checks.alibi`): each wrong
recipe, recomputed on the check's sizes, is compared with the learner's bias to name the mistake."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

SLOPES_RECIPE = ("For H a power of two the slopes are m_h = 2^(-8(h+1)/H), h = 0 .. H-1 (4 heads: 1/4, 1/16, 1/64, "
                 "1/256). Otherwise: the n slopes of n heads, n the largest power of two below H, then every other "
                 "slope of 2n heads (its 1st, 3rd, 5th, ...) until there are H (6 heads: 1/4, 1/16, 1/64, 1/256, "
                 "then 1/2, 1/8).")


def _geometric(n: int, *, first: int = 1, eight: float = 8.0) -> list[float]:
    """``n`` slopes ``2^(-eight·h/n)`` for ``h = first .. first + n - 1``: ALiBi's sequence for a power of two."""
    return [2.0 ** (-eight * h / n) for h in range(first, first + n)]


def _right_to_left(n: int) -> list[float]:
    """``2 ** (-8/n) ** h`` as Python reads it, ``2 ** ((-8/n) ** h)``: ``**`` binds right to left."""
    return [2.0 ** ((-8.0 / n) ** h) for h in range(1, n + 1)]


def alibi_slopes_variant(H: int, mistake: str = "") -> list[float]:
    """ALiBi's slopes (the paper's code, as :func:`mha_lib.alibi_slopes`), or those a mistake gives."""
    n = 2 ** (H.bit_length() - 1)  # the largest power of two <= H
    first = 0 if mistake == "from 0" else 1
    own, extra = _geometric(n, first=first), _geometric(2 * n, first=first)[0::2][: H - n]
    return {
        "": own + extra,
        "from 0": own + extra,
        "halves": [2.0 ** -(h + 1) for h in range(H)],
        "from 0, geometric": _geometric(H, first=0),
        "no 8": _geometric(H, eight=1.0),
        "geometric": _geometric(H),
        "first of 2n": _geometric(2 * n)[:H],
        "extra not every other": own + _geometric(2 * n)[: H - n],
        "extra [1::2]": own + _geometric(2 * n)[1::2][: H - n],
        "precedence": _right_to_left(n) + _right_to_left(2 * n)[0::2][: H - n],
    }[mistake]


def alibi(H: int, L: int, *, slopes: str = "", distance: str = "abs", sign: float = -1.0) -> Tensor:
    """``sign · m_h · distance(i, j)``, float64 ``(H, L, L)``; the defaults are ALiBi's bias.

    ``distance``: ``"abs"`` ``|i - j|``; ``"i - j"``, ``"j - i"`` (signed); ``"past"`` ``max(i - j, 0)``;
    ``"future"`` ``max(j - i, 0)``; ``"key"`` ``j`` (BLOOM's form, the key's position only)."""
    m = torch.tensor(alibi_slopes_variant(H, slopes), dtype=torch.float64)[:, None, None]  # (H, 1, 1)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    offset = {"abs": (i - j).abs(), "i - j": i - j, "j - i": j - i, "past": (i - j).clamp(min=0),
              "future": (j - i).clamp(min=0), "key": j.expand(L, L)}[distance].to(torch.float64)  # (L, L)
    return sign * m * offset  # (H, L, L)


def alibi_mistakes(H: int, L: int) -> list[tuple[str, Callable[[], Any], str]]:
    power_of_two = (H & (H - 1)) == 0
    mistakes = [
        ("the sign is flipped (+m·|i - j|): the farther the key, the larger its score", lambda: alibi(H, L, sign=1.0),
         "ALiBi is a penalty: bias = -m_h · |i - j|, 0 on the diagonal and more negative the farther the key."),
        ("the bias is -m·(i - j): the keys after the query (j > i) get a bonus instead of a penalty",
         lambda: alibi(H, L, distance="i - j"),
         "Use the distance |i - j|: ALiBi's bias is symmetric. In a decoder, the causal mask blocks the later keys "
         "separately (chapter 06, section 7)."),
        ("the bias is -m·(j - i): the keys before the query get a bonus instead of a penalty",
         lambda: [alibi(H, L, distance="j - i"), alibi(H, L, distance="i - j", sign=1.0)],
         "Use the distance |i - j|: every key, before or after the query, is penalised by its distance."),
        ("only the keys before the query are penalised (-m·max(i - j, 0)): those after it get 0",
         lambda: alibi(H, L, distance="past"),
         "alibi_bias is the bias alone, and symmetric: -m_h · |i - j|. A decoder adds its causal mask separately."),
        ("only the keys after the query are penalised (-m·max(j - i, 0))", lambda: alibi(H, L, distance="future"),
         "Use the distance |i - j|: rows are queries i, columns keys j, and every key is penalised by its distance."),
        ("+m·j, BLOOM's form (the slopes times the key's position j): it equals -m·(i - j) up to a constant per "
         "row (m·i), which the softmax ignores, so under a causal mask it attends as ALiBi does",
         lambda: alibi(H, L, distance="key", sign=1.0),
         "But the exercise asks for the bias itself, -m_h · |i - j|: 0 on the diagonal and symmetric, right without "
         "a causal mask too: distance = (pos[:, None] - pos[None, :]).abs()."),
        ("-m·j, the key's position times -m: up to a constant per row that is +m·(i - j), under a causal mask a "
         "bonus for the farther keys (the sign of BLOOM's +m·j flipped)", lambda: alibi(H, L, distance="key"),
         "The exercise asks for -m_h · |i - j| itself, 0 on the diagonal: distance = (pos[:, None] - pos[None, "
         ":]).abs()."),
    ]
    if not power_of_two:  # first: a learner who gets here was right for the powers of two
        mistakes += [
            (f"the slopes follow 2^(-8(h+1)/H), the formula for a power of two, but {H} is not one",
             lambda: alibi(H, L, slopes="geometric"),
             "The paper's code (and BLOOM's) builds other numbers of heads from powers of two. " + SLOPES_RECIPE),
            (f"the slopes are the first {H} of {2 * 2 ** (H.bit_length() - 1)} heads' slopes",
             lambda: alibi(H, L, slopes="first of 2n"),
             "Keep all n slopes of n heads first, then add every other slope of 2n heads. " + SLOPES_RECIPE),
            ("the extra slopes are the first ones of 2n heads, not every other one (1st, 3rd, 5th, ...)",
             lambda: alibi(H, L, slopes="extra not every other"),
             "The 2nd, 4th, 6th, ... slopes of 2n heads are the n heads' own slopes; the 1st, 3rd, 5th, ... "
             "([0::2]) lie between them: add those, in order. " + SLOPES_RECIPE),
            ("the extra slopes repeat ones the first n heads already have (taken with [1::2])",
             lambda: alibi(H, L, slopes="extra [1::2]"),
             "Take the 1st, 3rd, 5th ... of the 2n heads' slopes ([0::2]), not [1::2]: the 2nd, 4th, ... are the n "
             "heads' own slopes. " + SLOPES_RECIPE),
        ]
    mistakes += [
        ("the slopes are 1/2, 1/4, 1/8, ... (2^-(h+1)) whatever the number of heads: that is the sequence for "
         "8 heads only", lambda: alibi(H, L, slopes="halves"),
         "The slopes start at 2^(-8/H), and each is the one before times 2^(-8/H). " + SLOPES_RECIPE),
        ("the heads are counted from 0: the first head's slope is 2^0 = 1 instead of 2^(-8/H)",
         lambda: [alibi(H, L, slopes="from 0"), alibi(H, L, slopes="from 0, geometric")],
         "Head h (from 0) has slope 2^(-8(h+1)/H): the first one is 2^(-8/H), not 1. " + SLOPES_RECIPE),
        ("the 8 is missing from the slopes' exponent: 2^(-(h+1)/H)", lambda: alibi(H, L, slopes="no 8"),
         SLOPES_RECIPE),
        ("the slopes were written 2 ** (-8/H) ** (h+1), and ** binds right to left: that is "
         "2 ** ((-8/H) ** (h+1))",
         lambda: alibi(H, L, slopes="precedence"),
         "Write (2 ** (-8/H)) ** (h+1) or 2 ** (-8*(h+1)/H). " + SLOPES_RECIPE),
    ]
    return mistakes
