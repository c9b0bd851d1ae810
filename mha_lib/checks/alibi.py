"""The check for exercise 6.3 (chapter 06): ALiBi's bias, with the slopes of the paper."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .. import positions as _positions
from ._core import (
    ERROR,
    CheckResult,
    Verdict,
    accepts,
    call,
    close,
    describe_error,
    diagnose,
    expect_tensor,
    fail,
    run_check,
)

ALIBI_DEFINITION = ("bias[h, i, j] = -m_h · |i - j|, float32 (num_heads, seq_len, seq_len): 0 on the diagonal, more "
                    "negative the farther the key, before or after the query.")
SLOPES_RECIPE = ("For H a power of two the slopes are m_h = 2^(-8(h+1)/H), h = 0 .. H-1 (4 heads: 1/4, 1/16, 1/64, "
                 "1/256). Otherwise: the n slopes of n heads, n the largest power of two below H, then every other "
                 "slope of 2n heads (its 1st, 3rd, 5th, ...) until there are H (6 heads: 1/4, 1/16, 1/64, 1/256, "
                 "then 1/2, 1/8).")
DEVICE_HINT = ("Create every tensor on device: torch.arange(seq_len, device=device), torch.tensor(slopes, "
               "device=device); or build it on the CPU and end with .to(device). A model on the GPU needs its bias "
               "there, and a CPU tensor combined with one on another device raises.")
_META = torch.device("meta")  # shapes without numbers: how the check asks for "another device" on any machine


def _geometric(n: int, *, first: int = 1, eight: float = 8.0) -> list[float]:
    """``n`` slopes ``2^(-eight·h/n)`` for ``h = first .. first + n - 1``: ALiBi's sequence for a power of two."""
    return [2.0 ** (-eight * h / n) for h in range(first, first + n)]


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
    }[mistake]


def alibi(H: int, L: int, *, slopes: str = "", distance: str = "abs", sign: float = -1.0) -> Tensor:
    """``sign · m_h · distance(i, j)``, float64 ``(H, L, L)``; the defaults are ALiBi's bias.

    ``distance``: ``"abs"`` ``|i - j|``; ``"i - j"``, ``"j - i"`` (signed); ``"past"`` ``max(i - j, 0)``;
    ``"future"`` ``max(j - i, 0)``; ``"causal"`` ``|i - j|`` with ``-inf`` where ``j > i``."""
    m = torch.tensor(alibi_slopes_variant(H, slopes), dtype=torch.float64)[:, None, None]  # (H, 1, 1)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    offset = {"abs": (i - j).abs(), "i - j": i - j, "j - i": j - i, "past": (i - j).clamp(min=0),
              "future": (j - i).clamp(min=0), "causal": (i - j).abs()}[distance].to(torch.float64)  # (L, L)
    bias = sign * m * offset  # (H, L, L)
    if distance == "causal":
        bias = bias.masked_fill(j > i, float("-inf"))
    return bias


def _alibi_mistakes(H: int, L: int) -> list[tuple[str, Callable[[], Any], str]]:
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
        ("the bias has a causal mask built in (-inf above the diagonal)",
         lambda: [alibi(H, L, distance="causal"),
                  alibi(H, L).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), -1e9)],
         "Return the bias alone, -m_h · |i - j| everywhere: it is not only for decoders. Chapter 06 adds the causal "
         "mask afterwards: bias.masked_fill(~causal, float('-inf'))."),
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
    ]
    return mistakes


def _slopes_read_off(bias: Tensor) -> list[float]:
    """Each head's slope as the bias shows it, ``-bias[h, 1, 0]`` (query 1, key 0)."""
    return [-v for v in bias[:, 1, 0].to(torch.float64).tolist()]


def _fmt(values: list[float]) -> str:
    shown = ", ".join(f"{v:.4g}" for v in values[:8])
    return shown + (", ..." if len(values) > 8 else "")


def _alibi_shape_mistake(out: Any, H: int, L: int, where: str) -> None:
    """Fail naming the axes of a tensor whose shape is a known misreading of ``(H, L, L)``."""
    if not isinstance(out, Tensor) or tuple(out.shape) == (H, L, L):
        return
    shapes = {
        (L, L): ("the head axis is missing",
                 "ALiBi has one (seq_len, seq_len) pattern per head, each with its own slope: "
                 "slopes[:, None, None] * distance is (num_heads, seq_len, seq_len)."),
        (L, L, H): ("the head axis comes last", "Put the heads first, (num_heads, seq_len, seq_len): "
                    "slopes[:, None, None] * distance, or .permute(2, 0, 1)."),
        (L, H, L): ("the head axis is in the middle", "Put the heads first, (num_heads, seq_len, seq_len): "
                    "slopes[:, None, None] * distance."),
        (H,): ("it is one number per head: the slopes, without the distances",
               "Multiply the slopes by the distances: slopes[:, None, None] * distance, with "
               "distance[i, j] = |i - j|."),
        (1, H, L, L): ("it has an extra leading axis",
                       "Return (num_heads, seq_len, seq_len); broadcasting adds the batch axis when the bias meets "
                       "the scores (B, H, L, L)."),
    }
    if tuple(out.shape) in shapes:
        name, hint = shapes[tuple(out.shape)]
        raise fail(f"the bias {where} has shape {tuple(out.shape)}, expected {(H, L, L)}: {name}", hint)


def _alibi_dtype(out: Tensor, where: str) -> None:
    if out.dtype == torch.float32:
        return
    if out.dtype == torch.bool:
        raise fail(f"the bias {where} has dtype torch.bool; expected torch.float32",
                   "ALiBi is a float mask, added to the scores: -m_h · |i - j|. A bool mask would block keys instead.")
    if not out.is_floating_point():
        raise fail(f"the bias {where} has dtype {out.dtype}; expected torch.float32",
                   "The slopes are fractions: multiply the integer distances (torch.arange gives int64) by a float "
                   "tensor of slopes, torch.tensor(slopes), which is float32.")
    raise fail(f"the bias {where} has dtype {out.dtype}; expected torch.float32, as mha_lib.alibi_bias",
               "The course's modules compute their scores in float32, and F.scaled_dot_product_attention wants a "
               "float mask of the queries' dtype: torch.tensor(slopes) of Python floats is float32; don't ask for "
               "another dtype (or end with .float()).")


def _alibi_verdict(out: Tensor, H: int, L: int, where: str) -> Verdict:
    """Why ``out`` (float32 ``(H, L, L)``, on the CPU) is not ALiBi's bias, as precisely as can be told."""
    expected = _positions.alibi_bias(H, L)
    message = f"the bias is wrong {where}"
    for name, compute, hint in _alibi_mistakes(H, L):
        candidates = compute()
        if any(close(out, c) for c in (candidates if isinstance(candidates, list) else [candidates])):
            return fail(f"{message}: it looks like {name}", hint)
    if L > 1 and bool(torch.isfinite(out).all()):
        if not close(out[:, 1:, 1:], out[:, :-1, :-1]):
            return fail(f"{message}: it does not depend on i - j only (it is not constant along the diagonals)",
                        ALIBI_DEFINITION)
        distance = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).abs().to(torch.float64)
        slopes = torch.tensor(_slopes_read_off(out), dtype=torch.float64)
        right = _positions.alibi_slopes(H).tolist()
        if close(out, -slopes[:, None, None] * distance):  # the pattern is right: only the slopes are wrong
            order = [next((k for k in range(H) if abs(s - right[k]) <= 1e-5 * right[k]), None) for s in slopes.tolist()]
            if None not in order and sorted(order) == list(range(H)):
                if order == list(range(H))[::-1]:
                    how = "reversed: the flattest first"
                elif slopes.tolist() == sorted(slopes.tolist(), reverse=True):
                    how = ("sorted from steep to flat, while the paper's code keeps the n heads' slopes first and "
                           "appends the extra ones after them")
                else:
                    how = f"your heads have the slopes of heads {', '.join(map(str, order))}"
                return fail(f"{message}: the slopes are right but in the wrong order ({how})",
                            "Head 0 gets the first slope of the recipe, head 1 the second, and so on. " + SLOPES_RECIPE)
            if H > 1 and close(slopes, slopes[:1].expand(H)):
                return fail(f"{message}: every head has the same slope ({slopes[0].item():.4g})",
                            "Each head has its own slope, from steep to flat, so that some heads look near and "
                            "others far. " + SLOPES_RECIPE)
            return fail(f"{message}: -slope · |i - j| is the right pattern, but the slopes (read off at query 1, "
                        f"key 0) are {_fmt(slopes.tolist())}", SLOPES_RECIPE)
    return diagnose(out, [], message, ALIBI_DEFINITION, expected=expected, dim=0, axis="head")


def check_alibi_bias(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(num_heads, seq_len, device=None) -> bias``: ALiBi's float32 ``(H, L, L)`` bias
    ``-m_h · |i - j|`` with the paper's slopes (:func:`mha_lib.alibi_slopes`), for powers of two and
    other numbers of heads, created on ``device``."""

    def body() -> str:
        forbidden = [_positions.alibi_bias, _positions.alibi_slopes]
        cases = [(4, 6), (8, 5), (2, 7), (16, 3), (1, 4), (6, 5), (3, 7), (12, 4)]
        for H, L in cases:
            where = f"for num_heads={H}, seq_len={L}"
            out = call(fn, H, L, what=f"your function (num_heads={H}, seq_len={L})", forbidden=forbidden)
            _alibi_shape_mistake(out, H, L, where)
            out = expect_tensor(out, f"the bias {where}", (H, L, L), dtype="any",
                                explain=" (num_heads, seq_len, seq_len)")
            _alibi_dtype(out, where)
            out = out.cpu()
            if not close(out, _positions.alibi_bias(H, L)):
                raise _alibi_verdict(out, H, L, where)
        H, L = 4, 6
        what = f"your function (num_heads={H}, seq_len={L}, device=torch.device('meta'))"
        there = ("with device=torch.device('meta') (a device that holds shapes but no numbers, which the check uses "
                 "in place of a GPU)")
        if not accepts(fn, "device"):
            raise fail("your function doesn't accept the argument device=",
                       "Keep the exercise's signature: def alibi_bias(num_heads, seq_len, device=None).")
        try:
            out = fn(H, L, device=_META)
        except Exception as error:  # noqa: BLE001 - right on the CPU, so it is the device that fails
            text = str(error).strip().splitlines()[0] if str(error).strip() else ""
            line = describe_error(error, what).message if not isinstance(error, NotImplementedError) else \
                f"{what} raised NotImplementedError: {text}"
            raise Verdict(ERROR, f"{line} (right on the CPU: it is the device that fails)", DEVICE_HINT) from None
        if isinstance(out, Tensor) and out.device != _META:
            raise fail(f"the bias asked for {there} is on {out.device}: the argument device was ignored", DEVICE_HINT)
        out = expect_tensor(out, f"the bias {there}", (H, L, L), dtype="any", explain=" (num_heads, seq_len, seq_len)")
        _alibi_dtype(out, there)
        return (f"correct on {len(cases)} cases ({', '.join(str(h) for h, _ in cases)} heads, lengths 3 to 7), "
                "and on another device")

    return run_check("alibi_bias", body)
