"""The check for exercise 6.3 (chapter 06): ALiBi's bias, with the slopes of the paper."""

from __future__ import annotations

import re
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
    where_differs,
)
from ._alibi_mistakes import SLOPES_RECIPE, alibi, alibi_mistakes, alibi_slopes_variant

__all__ = ["alibi", "alibi_slopes_variant", "check_alibi_bias"]

ALIBI_DEFINITION = ("bias[h, i, j] = -m_h · |i - j|, float32 (num_heads, seq_len, seq_len): 0 on the diagonal, more "
                    "negative the farther the key, before or after the query.")
CAUSAL_HINT = ("Return the bias alone, -m_h · |i - j| everywhere: it is not only for decoders. Chapter 06 adds the "
               "causal mask afterwards: bias.masked_fill(~causal, float('-inf')).")
DEVICE_HINT = ("Create every tensor on device: torch.arange(seq_len, device=device), torch.tensor(slopes, "
               "device=device); or build it on the CPU and end with .to(device). A model on the GPU needs its bias "
               "there, and a CPU tensor combined with one on another device raises.")
_TWO_DEVICES = re.compile(r"not on the expected device|on the same device|is on cpu but")
_READS = re.compile(r"meta tensors|\.item\(\)|data-dependent|Cannot copy out of meta|tolist|"
                    r"is not implemented for .*[Mm]eta|no data")


def _reads_numbers(error: BaseException) -> bool:
    """Whether ``error`` is the meta device refusing to give a value (not a CPU tensor meeting a meta one)."""
    return bool(_READS.search(f"{type(error).__name__}: {error}"))


_META = torch.device("meta")  # shapes without numbers: how the check asks for "another device" on any machine


def _slopes_read_off(bias: Tensor) -> list[float]:
    """Each head's slope as the bias shows it, ``-bias[h, 1, 0]`` (query 1, key 0)."""
    return [-v for v in bias[:, 1, 0].to(torch.float64).tolist()]


def _slopes_of_another_count(slopes: list[float], H: int) -> str | None:
    """What the slopes are when they are the recipe's for another number of heads (or repeat some), else None.

    Named before the order: a permutation of the right slopes is a wrong order, but slopes made for
    another count (``n`` or ``2n`` heads, ``H ± 1``) or repeated ones are a wrong count."""
    def same(a: list[float], b: list[float]) -> bool:
        return len(a) == len(b) and all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(a, b))

    right = sorted(_positions.alibi_slopes(H).tolist())
    if same(sorted(slopes), right):  # the right slopes, in another order: that is a wrong order
        return None
    for count in sorted(set(range(1, 2 * H + 3)) - {H}):
        theirs = _positions.alibi_slopes(count).tolist()
        if same(sorted(theirs[:H]), right):  # e.g. 7 heads' first 6 slopes are 6 heads' own
            continue
        if len(theirs) >= H and (same(slopes, theirs[:H]) or same(sorted(slopes), sorted(theirs[:H]))):
            return (f"the slopes of {count} heads ({_fmt(theirs)})" + (f", the first {H} of them" if count > H else "")
                    + ": the slopes depend on num_heads, compute them for num_heads itself")
        if 1 < len(theirs) < H and same(slopes[:len(theirs)], theirs):
            return (f"the {count} slopes of {count} heads first, then {_fmt(slopes[count:])}: "
                    f"the slopes were made for {count} heads, not {H}")
    distinct = {round(v, 9) for v in slopes}
    if 1 < len(distinct) < H:
        return f"only {len(distinct)} different slopes ({_fmt(sorted(distinct, reverse=True))}): some heads repeat a slope"
    return None


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
        (H, 1, L): ("one row per head, the same for every query" + (
                    ": it is +m·j, BLOOM's form (slopes[:, None, None] * positions)" if tuple(out.shape) == (H, 1, L)
                    and close(out, alibi(H, L, distance="key", sign=1.0)[:, :1]) else ""),
                    "BLOOM adds +m·j, one row broadcast over the queries: -m·(i - j) up to a constant per row. The "
                    "exercise asks for the full bias -m_h · |i - j|, which depends on the query too: "
                    "slopes[:, None, None] * distance, distance = (pos[:, None] - pos[None, :]).abs()."),
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


def _matches(out: Tensor, compute: Callable[[], Any], keep: Callable[[Tensor], Tensor] = lambda t: t) -> bool:
    candidates = compute()
    return any(close(keep(out), keep(c)) for c in (candidates if isinstance(candidates, list) else [candidates]))


def _causal_verdict(out: Tensor, H: int, L: int, message: str) -> Verdict | None:
    """A causal mask built in (-inf, or a very negative fill, above the diagonal only), named first; then what
    the bias is on and below the diagonal, when that is wrong too."""
    above = torch.ones(L, L, dtype=torch.bool).triu(1)
    if L < 2 or not bool((out[:, above] <= -1e4).all()) or bool((out[:, above.T] <= -1e4).all()):
        return None
    filled = out[:, above]
    fill = ("-inf" if bool(torch.isinf(filled).all()) else f"a fill of {filled.max().item():.3g}"
            if bool((filled == filled.max()).all()) else "very negative numbers")
    name = f"{message}: it looks like the bias has a causal mask built in ({fill} above the diagonal)"

    def lower(t: Tensor) -> Tensor:
        return t.masked_fill(above, 0.0)

    expected = _positions.alibi_bias(H, L)
    if close(lower(out), lower(expected)):
        return fail(name, CAUSAL_HINT)
    for what, compute, hint in alibi_mistakes(H, L):
        if _matches(out, compute, lower):
            return fail(f"{name}, and on and below the diagonal like {what}", f"{CAUSAL_HINT} {hint}")
    differs = where_differs(lower(out), lower(expected), dim=0, axis="head")
    return fail(f"{name}, and on and below the diagonal it is wrong too: {differs}",
                f"{CAUSAL_HINT} {ALIBI_DEFINITION}")


def _alibi_verdict(out: Tensor, H: int, L: int, where: str) -> Verdict:
    """Why ``out`` (float32 ``(H, L, L)``, on the CPU) is not ALiBi's bias, as precisely as can be told."""
    expected = _positions.alibi_bias(H, L)
    message = f"the bias is wrong {where}"
    causal = _causal_verdict(out, H, L, message)
    if causal is not None:
        return causal
    for name, compute, hint in alibi_mistakes(H, L):
        if _matches(out, compute):
            return fail(f"{message}: it looks like {name}", hint)
    if L > 1 and bool(torch.isfinite(out).all()):
        if not close(out[:, 1:, 1:], out[:, :-1, :-1]):
            if close(out, out[:, :1].expand_as(out)):
                return fail(f"{message}: every query's row is the same, so it depends on the key j only, not on "
                            "the distance i - j (like BLOOM's m·j, which equals -m·(i - j) up to a constant per row)",
                            "The exercise asks for the bias itself, -m_h · |i - j|: " + ALIBI_DEFINITION)
            return fail(f"{message}: it does not depend on i - j only (it is not constant along the diagonals)",
                        ALIBI_DEFINITION)
        distance = (torch.arange(L)[:, None] - torch.arange(L)[None, :]).abs().to(torch.float64)
        slopes = torch.tensor(_slopes_read_off(out), dtype=torch.float64)
        right = _positions.alibi_slopes(H).tolist()
        if close(out, -slopes[:, None, None] * distance):  # the pattern is right: only the slopes are wrong
            wrong_count = _slopes_of_another_count(slopes.tolist(), H)
            if wrong_count is not None:
                return fail(f"{message}: the {H} heads have {wrong_count}", SLOPES_RECIPE)
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


def _stale_bias(out: Any, earlier: list[tuple[int, int, Tensor]], H: int, L: int, where: str) -> None:
    """Fail when ``out`` is an earlier call's bias for other arguments (a result kept from call to call)."""
    if not isinstance(out, Tensor) or tuple(out.shape) == (H, L, L):
        return
    for h, l, t in earlier:
        if out.shape == t.shape and torch.equal(out.detach().cpu(), t):
            raise fail(f"the bias {where} has shape {tuple(out.shape)}: it is the bias of an earlier call "
                       f"(num_heads={h}, seq_len={l}): it looks like a result kept from an earlier call, "
                       "keyed on some of the arguments only",
                       "Keep nothing from one call to the next (no cache keyed on num_heads alone): compute the bias "
                       "for this call's num_heads and seq_len, or key a cache on every argument.")


def check_alibi_bias(fn: Callable[..., Any]) -> CheckResult:
    """Check ``fn(num_heads, seq_len, device=None) -> bias``: ALiBi's float32 ``(H, L, L)`` bias
    ``-m_h · |i - j|`` with the paper's slopes (:func:`mha_lib.alibi_slopes`), for powers of two and
    other numbers of heads, created on ``device``."""

    def body() -> str:
        forbidden = [_positions.alibi_bias, _positions.alibi_slopes]
        # (4, 3) and (6, 8) ask again for a number of heads already asked for, with another length: a result
        # kept from an earlier call (a cache keyed on num_heads only) shows
        cases = [(4, 6), (8, 5), (2, 7), (16, 3), (1, 4), (6, 5), (3, 7), (12, 4), (4, 3), (6, 8)]
        earlier: list[tuple[int, int, Tensor]] = []
        returned: list[Tensor] = []  # the very tensors returned (a cache hands the same one back)
        for H, L in cases:
            where = f"for num_heads={H}, seq_len={L}"
            out = call(fn, H, L, what=f"your function (num_heads={H}, seq_len={L})", forbidden=forbidden)
            _stale_bias(out, earlier, H, L, where)
            _alibi_shape_mistake(out, H, L, where)
            out = expect_tensor(out, f"the bias {where}", (H, L, L), dtype="any",
                                explain=" (num_heads, seq_len, seq_len)")
            _alibi_dtype(out, where)
            returned.append(out)
            out = out.cpu()
            if not close(out, _positions.alibi_bias(H, L)):
                raise _alibi_verdict(out, H, L, where)
            earlier.append((H, L, out.clone()))
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
            if not _TWO_DEVICES.search(str(error)) and _reads_numbers(error):
                # A device-careful answer that reads numbers back (.item(), .tolist()) works on a GPU; the
                # stand-in device only holds shapes. The device is then checked by what it was asked to create.
                return (f"correct on {len(cases)} cases ({', '.join(str(h) for h, _ in cases)} heads, lengths 3 "
                        "to 8); device= accepted (your function reads numbers back from a tensor on the device, "
                        "which the check's stand-in device can't hold, so the device was not checked further)")
            text = str(error).strip().splitlines()[0] if str(error).strip() else ""
            line = describe_error(error, what).message if not isinstance(error, NotImplementedError) else \
                f"{what} raised NotImplementedError: {text}"
            raise Verdict(ERROR, f"{line} (right on the CPU: it is the device that fails)", DEVICE_HINT) from None
        if isinstance(out, Tensor) and out.device != _META:
            # The same tensor object (or its storage) as an earlier call's: a cache. Equal numbers in
            # a new tensor are what a function that ignores device returns: that is the other message.
            if any(out is r or (out.device == r.device and out.data_ptr() == r.data_ptr()) for r in returned):
                raise fail(f"the bias asked for {there} is on {out.device}, and it is the tensor an earlier call "
                           f"(num_heads={H}, seq_len={L}, on the CPU) returned: it looks like a result kept from an "
                           "earlier call, kept without its device",
                           "Keep nothing from one call to the next, or key a cache on every argument, device "
                           "included (functools.lru_cache on the whole signature). " + DEVICE_HINT)
            raise fail(f"the bias asked for {there} is on {out.device}: the argument device was ignored", DEVICE_HINT)
        out = expect_tensor(out, f"the bias {there}", (H, L, L), dtype="any", explain=" (num_heads, seq_len, seq_len)")
        _alibi_dtype(out, there)
        return (f"correct on {len(cases)} cases ({', '.join(str(h) for h, _ in cases)} heads, lengths 3 to 8), "
                "and on another device")

    return run_check("alibi_bias", body)
