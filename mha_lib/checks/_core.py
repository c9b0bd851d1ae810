"""What every check shares besides results and calls: validating what came back,
comparing it with the reference, and naming the mistake that reproduces it.

A check never raises because of the learner's code. Each step that can go wrong
raises :class:`Verdict` internally, which :func:`run_check` turns into a
:class:`CheckResult`. The reference answers (``reference``) are computed inside
``mha_lib`` and are never shown; only the verdict and a hint are.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor

from ._calling import accepts, call, check_device_care, check_unchanged, cloned, describe_error, on_meta
from ._result import (
    ERROR,
    FAILED,
    NOT_IMPLEMENTED,
    PASSED,
    CheckFailed,
    CheckResult,
    Verdict,
    fail,
    log_result,
    run_check,
)

__all__ = [
    "ERROR", "FAILED", "NOT_IMPLEMENTED", "PASSED", "CheckFailed", "CheckResult", "Mistake", "Verdict",
    "accepts", "call", "check_device_care", "check_unchanged", "cloned", "close", "describe_error", "describe_shapes", "diagnose",
    "expect_number", "expect_tensor", "fail", "float32_close", "gen", "hidden_cases", "case_seed", "CHECK_SEED", "log_result", "on_meta", "randn", "run_check", "sqrt", "unpack_pair",
    "where_differs", "PRECISION_HINT",
]

_PLURAL = {"scores", "weights", "masks", "gradients"}


def _verb(what: str, singular: str, plural: str) -> str:
    words = what.split()
    head = words[1] if len(words) > 1 and words[0] == "the" else (words[0] if words else "")
    return plural if head in _PLURAL else singular


def _article(noun: str) -> str:
    """``an int``, ``a float``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _describe(value: Any) -> str:
    """What a value is, in a few words: ``a tuple of 3 (Tensor (2, 4), Tensor (2, 4), None)``."""
    if isinstance(value, Tensor):
        return f"Tensor {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        parts = ", ".join(_describe(v) for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"{_article(type(value).__name__)} of {len(value)} ({parts})"
    return "None" if value is None else type(value).__name__


def expect_tensor(value: Any, what: str, shape: Sequence[int], *, dtype: str | torch.dtype = "float",
                  explain: str = "") -> Tensor:
    """Return ``value`` as a plain tensor, or fail naming what's wrong with it.

    ``dtype``: ``"float"`` (any floating point), ``"bool"``, ``"any"``, or the exact
    ``torch.dtype`` the inputs had (a float32 input must give a float32 output).
    """
    shape = tuple(shape)
    is_, has = _verb(what, "is", "are"), _verb(what, "has", "have")
    if value is None:
        raise Verdict(NOT_IMPLEMENTED, f"not implemented yet ({what} {is_} None)",
                      "Does your function end with a return statement?")
    if type(value).__module__.startswith("numpy"):
        raise fail(f"{what} {is_} a NumPy array, not a torch.Tensor",
                   "Stay in PyTorch: NumPy breaks autograd and the GPU. Don't call .numpy().")
    if isinstance(value, (list, tuple)):
        raise fail(f"{what} {is_} {_describe(value)}, not a torch.Tensor of shape {shape}",
                   "Return one tensor; torch.stack or torch.cat join a list of tensors.")
    if not isinstance(value, Tensor):
        raise fail(f"{what} {is_} {_article(type(value).__name__)}, not a torch.Tensor")
    if type(value) not in (Tensor, torch.nn.Parameter):
        raise fail(f"{what} {is_} {_article(type(value).__name__)}, a subclass of torch.Tensor; return a plain tensor")
    value = value.detach()
    if tuple(value.shape) != shape:
        raise fail(f"{what} {has} shape {tuple(value.shape)}, expected {shape}{explain}",
                   "Print the shape after every step to see where it goes astray.")
    if dtype == "float" and not value.is_floating_point():
        raise fail(f"{what} {has} dtype {value.dtype}; expected floating point numbers")
    if isinstance(dtype, torch.dtype) and value.dtype != dtype:
        raise fail(f"{what} {has} dtype {value.dtype} for inputs of dtype {dtype}",
                   "Keep the inputs' dtype: don't call .double() / .float() or create tensors with another dtype "
                   "(torch.tensor(..., dtype=query.dtype), torch.zeros_like(...) keep it).")
    if dtype == "bool" and value.dtype != torch.bool:
        raise fail(f"{what} {has} dtype {value.dtype}; expected torch.bool (True = may attend)",
                   "Build it with comparisons or torch.ones(..., dtype=torch.bool); a 0/1 float mask would "
                   "be added to the scores instead of blocking them.")
    return value


def expect_number(value: Any, what: str) -> float:
    """Return ``value`` as a Python float (a Python or NumPy real, or a 0-d / one-element tensor), or
    fail saying what came back."""
    import numbers

    if value is None:
        raise Verdict(NOT_IMPLEMENTED, f"not implemented yet ({what} is None)",
                      "Does your function end with a return statement?")
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise fail(f"{what} is a tensor of shape {tuple(value.shape)}; expected one number",
                       "Reduce over every axis (e.g. .std() with no dim), then .item() gives a Python float.")
        if value.is_complex() or value.dtype == torch.bool:
            raise fail(f"{what} is a tensor of dtype {value.dtype}; expected a real number")
        if value.device.type == "meta":
            raise fail(f"{what} is on the meta device, which holds no number")
        return float(value.detach().cpu().double())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(f"{what} is {_describe(value) if isinstance(value, (tuple, list)) else repr(value)[:60]}"
                   f" ({_article(type(value).__name__)}); expected one number, a float")
    return float(value)


def unpack_pair(value: Any, what: str, first: str, second: str) -> tuple[Any, Any]:
    """Split a returned ``(first, second)`` pair, or fail saying what came back."""
    if value is None:
        raise Verdict(NOT_IMPLEMENTED, f"not implemented yet ({what} returned None)",
                      "Does your function end with a return statement?")
    if isinstance(value, Tensor):
        raise fail(f"{what} returned one tensor {tuple(value.shape)}; expected a pair ({first}, {second})",
                   f"End with: return {first}, {second}")
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise fail(f"{what} returned {_describe(value)}; expected a pair ({first}, {second})",
                   f"End with: return {first}, {second}")
    return value[0], value[1]


def close(actual: Tensor, expected: Tensor) -> bool:
    """Agreement up to the rounding error of the learner's dtype."""
    tol = 1e-7 if actual.dtype == torch.float64 else 1e-4
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.detach().to("cpu", torch.float64)
    if actual.shape != expected.shape:
        return False
    same_nan = torch.isnan(actual) == torch.isnan(expected)
    return bool(same_nan.all()) and torch.allclose(actual.nan_to_num(0.0), expected.nan_to_num(0.0),
                                                   atol=tol, rtol=tol)


Mistake = tuple[str, Callable[[], Any], str]

PRECISION_HINT = ("Keep every step in the inputs' dtype: torch.arange(...) without a dtype, torch.tensor(...) of "
                  "Python floats, .float() or a float32 table of cos/sin give float32 numbers, and casting the "
                  "result back (.to(x.dtype), .type_as(x)) does not bring the lost digits back. Create them with "
                  "dtype=x.dtype.")


def float32_close(actual: Tensor, expected: Tensor) -> bool:
    """Whether a float64 ``actual`` misses ``expected`` only by float32's rounding error."""
    if actual.dtype != torch.float64 or actual.shape != expected.shape:
        return False
    a, e = actual.detach().to("cpu", torch.float64), expected.detach().to("cpu", torch.float64)
    if not bool((torch.isnan(a) == torch.isnan(e)).all()):
        return False
    return torch.allclose(a.nan_to_num(0.0), e.nan_to_num(0.0), atol=1e-4, rtol=1e-4)


def where_differs(actual: Tensor, expected: Tensor, *, dim: int = -2, axis: str = "position") -> str:
    """Which entries along ``dim`` (queries, positions, heads) differ, and by how much, in words:
    ``"positions 2, 3 differ (by up to 0.41)"``."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if a.shape != e.shape or a.dim() == 0:
        return ""
    tol = 1e-7 if actual.dtype == torch.float64 else 1e-4
    wrong = ~torch.isclose(a, e, atol=tol, rtol=tol, equal_nan=True)
    dim = dim % a.dim()
    rows = wrong.movedim(dim, 0).reshape(a.size(dim), -1).any(-1).nonzero().flatten().tolist()
    if not rows:
        return ""
    diff = (a - e).abs()[wrong]
    finite = diff[torch.isfinite(diff)]
    parts = [f"by up to {finite.max().item():.2g}"] if finite.numel() else []
    if bool((~torch.isfinite(a[wrong])).any()):
        parts.append("some of yours are inf or NaN")
    by = ", ".join(parts)
    shown = ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
    if len(rows) == a.size(dim) and a.size(dim) > 1:
        return f"every {axis} differs ({by})"
    return f"{axis}{'s' if len(rows) > 1 else ''} {shown} differ{'' if len(rows) > 1 else 's'} ({by})"


def diagnose(actual: Tensor, mistakes: Iterable[Mistake], message: str, default_hint: str, *,
             expected: Tensor | None = None, dim: int = -2, axis: str = "position") -> Verdict:
    """Find which known mistake reproduces ``actual`` and fail with its hint.

    ``mistakes`` yields ``(name, compute, hint)``: ``compute()`` returns what the
    mistaken code would have produced on the same inputs (or several variants of it,
    e.g. with ``-inf`` and with ``-1e9`` as the fill value). With ``expected`` (the right
    answer), an answer off by float32's rounding only is named, and a generic verdict says
    which entries along ``dim`` (``axis``: their name) differ and by how much.
    """
    for name, compute, hint in mistakes:
        try:
            candidates = compute()
        except Exception:  # a mistake that can't happen with these shapes
            continue
        if isinstance(candidates, Tensor):
            candidates = [candidates]
        if any(close(actual, c) for c in candidates):
            return fail(f"{message}: it looks like {name}", hint)
    if expected is not None and float32_close(actual, expected):
        return fail(f"{message}: it is right only up to float32's rounding (about 1e-7 of each value), so part of "
                    "the computation ran in float32 while the inputs are float64", PRECISION_HINT)
    if torch.isnan(actual).any():
        return fail(f"{message}: it contains NaN",
                    "NaN comes from 0/0 or -inf - (-inf): a softmax over a row whose scores are all "
                    "-inf (every key blocked), or a mask applied to the wrong axis.")
    if expected is not None:
        where = where_differs(actual, expected, dim=dim, axis=axis)
        if where:
            return fail(f"{message}: {where}", default_hint)
    return fail(message, default_hint)


# Hidden test inputs (INSTRUCTORS.md). Every check draws its random inputs from gen(seed) with a
# fixed seed of its own, so the inputs a learner's check sees are the same on every run. A
# grader's hidden run sets a case seed, MHA_CHECK_SEED=<int> or ``with hidden_cases(<int>):``, and
# gen mixes it into every seed: the same checks, on inputs the learner's notebook never drew.
# Without one (the learner's runs) nothing changes. Read in this one place.
CHECK_SEED = "MHA_CHECK_SEED"
_case_seed: ContextVar[int | None] = ContextVar("mha_check_case_seed", default=None)


def case_seed() -> int | None:
    """The case seed of a hidden run: ``hidden_cases``'s, else ``$MHA_CHECK_SEED``'s, else None."""
    seed = _case_seed.get()
    if seed is not None:
        return seed
    text = os.environ.get(CHECK_SEED, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{CHECK_SEED}={text!r} is not an integer; set it to one (e.g. 20261204) or unset it") from None


@contextmanager
def hidden_cases(seed: int) -> Iterator[None]:
    """Run the checks called inside on other inputs than the learner's: each check's seeds mixed with ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"hidden_cases takes an int seed, not {type(seed).__name__}")
    token = _case_seed.set(seed)
    try:
        yield
    finally:
        _case_seed.reset(token)


def gen(seed: int) -> torch.Generator:
    """A generator seeded with ``seed``, mixed with the case seed of a hidden run when there is one."""
    salt = case_seed()
    if salt is not None:
        digest = hashlib.sha256(f"{salt}:{seed}".encode()).digest()
        seed = int.from_bytes(digest[:8], "little") & (2**63 - 1)
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float64) -> Tensor:
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def describe_shapes(**tensors: Tensor | None) -> str:
    parts = [f"{name} {tuple(t.shape)}" for name, t in tensors.items() if t is not None]
    return ", ".join(parts)


def sqrt(x: int) -> float:
    return math.sqrt(x)
