"""The machinery every check shares: results, safe calls, validation, diagnosis.

A check never raises because of the learner's code. Each step that can go wrong
raises :class:`Verdict` internally, which :func:`run_check` turns into a
:class:`CheckResult`. The reference answers are computed inside ``mha_lib``
and are never shown; only the verdict and a hint are.
"""

from __future__ import annotations

import html
import json
import linecache
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

PASSED, NOT_IMPLEMENTED, FAILED, ERROR = "passed", "not implemented", "failed", "error"
_ICONS = {PASSED: "✅", NOT_IMPLEMENTED: "⏳", FAILED: "❌", ERROR: "💥"}
_COLOURS = {PASSED: "#1a7f37", NOT_IMPLEMENTED: "#6e7781", FAILED: "#cf222e", ERROR: "#cf222e"}


@dataclass(frozen=True)
class CheckResult:
    """The outcome of a check. ``bool(result)`` is True only when it passed.

    Jupyter shows it as a coloured box; elsewhere it prints as plain text.
    """

    name: str
    status: str
    message: str
    hint: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __bool__(self) -> bool:
        return self.passed

    def _lines(self) -> list[str]:
        lines = [f"{_ICONS[self.status]} {self.name}: {self.message}"]
        if self.hint:
            lines.append(f"   Hint: {self.hint}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self._lines())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = _COLOURS[self.status]
        head = f"<b>{_ICONS[self.status]} {html.escape(self.name)}</b>: {html.escape(self.message)}"
        hint = f"<br><b>Hint:</b> {html.escape(self.hint)}" if self.hint else ""
        return (
            f'<div style="border-left: 4px solid {colour}; padding: 4px 10px; '
            f'margin: 2px 0; font-family: var(--jp-content-font-family, sans-serif)">{head}{hint}</div>'
        )


class Verdict(Exception):
    """Raised inside a check to end it with a result."""

    def __init__(self, status: str, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.hint = status, message, hint


def fail(message: str, hint: str | None = None) -> Verdict:
    return Verdict(FAILED, message, hint)


def run_check(name: str, body: Callable[[], str]) -> CheckResult:
    """Run ``body`` (which returns the pass message) and turn what happens into a result.

    The global random state is restored afterwards, so a check never changes the
    random numbers of the learner's next cells.
    """
    with torch.random.fork_rng(devices=[]):
        try:
            result = CheckResult(name, PASSED, body())
        except Verdict as verdict:
            result = CheckResult(name, verdict.status, verdict.message, verdict.hint)
        except Exception as error:  # a bug in the check itself: say so, don't crash
            result = CheckResult(
                name, ERROR, f"the check itself failed ({type(error).__name__}: {error})",
                "This is a bug in mha_lib.checks, not in your code; please report it.",
            )
    log_result(result)
    return result


CHECK_LOG = "MHA_CHECK_LOG"


def log_result(result: CheckResult) -> None:
    """Append the result as one JSON line to the file named by ``$MHA_CHECK_LOG``, if set.

    ``python -m mha_lib progress`` runs a learner's notebook with this variable set and
    reads the lines back: ``{"check", "status", "message", "hint"}``, one per check call.
    """
    path = os.environ.get(CHECK_LOG)
    if not path:
        return
    record = {"check": result.name, "status": result.status, "message": result.message, "hint": result.hint}
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(record, ensure_ascii=False) + "\n")
    except OSError:  # a log that can't be written must never break the learner's check
        pass


# ---------------------------------------------------------------- calling the learner

_ERROR_HINTS: list[tuple[tuple[str, ...], str]] = [
    (("'d_v'",),
     "The listing in Transformers in Action uses self.d_v, which it never defines. Every head's "
     "values have the same size as its keys: d_k = d_model // num_heads."),
    (("view size is not compatible",),
     ".view() needs a contiguous tensor, and a transposed tensor isn't one. Call .contiguous() "
     "before .view(), or use .reshape()."),
    (("masked_fill only supports boolean masks", "expected a boolean", "Bool type is not supported"),
     "Masks are boolean tensors (True = may attend): use masked_fill(~mask, float('-inf'))."),
    (("unexpected keyword argument 'mask'",),
     "Your function must accept a mask argument, even if it is None: def ...(..., mask=None)."),
    (("mat1 and mat2 shapes cannot be multiplied", "must match the size of tensor",
      "size of tensor a", "shape '", "Expected size", "expected size", "does not broadcast"),
     "The shapes don't fit. Print the shape of every intermediate tensor; to swap the last two "
     "axes of a batched tensor use .transpose(-2, -1) (not .T)."),
    (("is not defined",),
     "A name is not defined: run the cells above this one first (or check the spelling)."),
    (("'NoneType'",),
     "Something was None: does every function you call end with a return statement?"),
]


def _where_in_learner_code(error: BaseException) -> str:
    """' (line N: <code>)' for the deepest traceback frame outside mha_lib and torch."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = frame.filename.replace("\\", "/")
        if "/mha_lib/checks/" in path or "/torch/" in path or "/site-packages/" in path:
            continue
        code = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
        return f" at line {frame.lineno}: {code}" if code else ""
    return ""


def describe_error(error: BaseException, what: str) -> Verdict:
    """Turn an exception from the learner's code into a short verdict with a hint."""
    if isinstance(error, NotImplementedError):
        return Verdict(NOT_IMPLEMENTED, "not implemented yet (it raises NotImplementedError)",
                       "Replace the `raise NotImplementedError` with your code, run the cell, then this one.")
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    hint = next((h for keys, h in _ERROR_HINTS if any(k in str(error) for k in keys)),
                "Call it yourself on small inputs and read the full traceback.")
    where = _where_in_learner_code(error)
    return Verdict(ERROR, f"{what} raised {type(error).__name__}: {text}{where}", hint)


class _ForbiddenCallWatcher:
    """Notice whether the learner's code calls one of the course's own answers."""

    def __init__(self, forbidden: Iterable[Callable[..., Any]]) -> None:
        self.codes = {f.__code__: self._name(f) for f in forbidden}
        self.called: str | None = None

    @staticmethod
    def _name(f: Callable[..., Any]) -> str:
        """``mha_lib.causal_mask`` when the package exports it, else its full module path."""
        top = f.__module__.split(".")[0]
        name = f.__qualname__.split(".")[0]
        exported = getattr(sys.modules.get(top), name, None)
        if exported is f or getattr(exported, "forward", None) is f or getattr(exported, "__wrapped__", None) is f:
            return f"{top}.{f.__qualname__}"
        return f"{f.__module__}.{f.__qualname__}"

    def __enter__(self) -> _ForbiddenCallWatcher:
        self.previous = sys.getprofile()
        if self.codes:
            sys.setprofile(self._profile)
        return self

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in self.codes and self.called is None:
            self.called = self.codes[frame.f_code]

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self.previous)


def call(fn: Callable[..., Any], *args: Any, what: str, forbidden: Sequence[Callable[..., Any]] = (),
         **kwargs: Any) -> Any:
    """Call the learner's ``fn``; stubs, exceptions and shortcuts become verdicts."""
    if not callable(fn):
        raise fail(f"expected a function or class, got {type(fn).__name__}",
                   "Pass the function itself, without calling it: check(my_function), not check(my_function()).")
    watcher = _ForbiddenCallWatcher(forbidden)
    try:
        with watcher:
            result = fn(*args, **kwargs)
    except Exception as error:  # the learner's code failed: report, don't raise
        raise describe_error(error, what) from None
    if watcher.called:
        raise fail(f"{what} calls {watcher.called}, the course's own answer",
                   "The exercise is to write it yourself; the check compares your code with it.")
    return result


def cloned(*tensors: Tensor) -> list[Tensor]:
    return [t.clone() for t in tensors]


def check_unchanged(names: Sequence[str], originals: Sequence[Tensor | None], given: Sequence[Tensor | None],
                    what: str) -> None:
    """Fail if the learner's code changed one of its inputs in place."""
    for name, original, copy in zip(names, originals, given):
        if original is not None and copy is not None and not torch.equal(original, copy):
            raise fail(f"{what} changed its input `{name}` in place",
                       "In-place operations (x /= ..., x.masked_fill_(...), x[...] = ...) overwrite the "
                       "caller's tensor; compute a new tensor instead (x = x / ..., x.masked_fill(...)).")


# ---------------------------------------------------------------- validating results

def expect_tensor(value: Any, what: str, shape: Sequence[int], *, dtype: str = "float",
                  explain: str = "") -> Tensor:
    """Return ``value`` as a plain tensor, or fail naming what's wrong with it."""
    shape = tuple(shape)
    if value is None:
        raise Verdict(NOT_IMPLEMENTED, f"not implemented yet ({what} is None)",
                      "Does your function end with a return statement?")
    if type(value).__module__.startswith("numpy"):
        raise fail(f"{what} is a NumPy array, not a torch.Tensor",
                   "Stay in PyTorch: NumPy breaks autograd and the GPU. Don't call .numpy().")
    if isinstance(value, (list, tuple)):
        raise fail(f"{what} is a {type(value).__name__}, not a torch.Tensor of shape {shape}",
                   "Return one tensor; torch.stack or torch.cat join a list of tensors.")
    if not isinstance(value, Tensor):
        raise fail(f"{what} is a {type(value).__name__}, not a torch.Tensor")
    if type(value) not in (Tensor, torch.nn.Parameter):
        raise fail(f"{what} is a {type(value).__name__}, a subclass of torch.Tensor; return a plain tensor")
    value = value.detach()
    if tuple(value.shape) != shape:
        raise fail(f"{what} has shape {tuple(value.shape)}, expected {shape}{explain}",
                   "Print the shape after every step to see where it goes astray.")
    if dtype == "float" and not value.is_floating_point():
        raise fail(f"{what} has dtype {value.dtype}; expected floating point numbers")
    if dtype == "bool" and value.dtype != torch.bool:
        raise fail(f"{what} has dtype {value.dtype}; expected torch.bool (True = may attend)",
                   "Build it with comparisons or torch.ones(..., dtype=torch.bool); a 0/1 float mask would "
                   "be added to the scores instead of blocking them.")
    return value


def unpack_pair(value: Any, what: str, first: str, second: str) -> tuple[Any, Any]:
    """Split a returned ``(first, second)`` pair, or fail saying what came back."""
    if value is None:
        raise Verdict(NOT_IMPLEMENTED, f"not implemented yet ({what} returned None)",
                      "Does your function end with a return statement?")
    if isinstance(value, Tensor):
        raise fail(f"{what} returned one tensor; expected a pair ({first}, {second})",
                   f"End with: return {first}, {second}")
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise fail(f"{what} returned {type(value).__name__}; expected a pair ({first}, {second})",
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


def diagnose(actual: Tensor, mistakes: Iterable[Mistake], message: str, default_hint: str) -> Verdict:
    """Find which known mistake reproduces ``actual`` and fail with its hint.

    ``mistakes`` yields ``(name, compute, hint)``: ``compute()`` returns what the
    mistaken code would have produced on the same inputs (or several variants of it,
    e.g. with ``-inf`` and with ``-1e9`` as the fill value).
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
    if torch.isnan(actual).any():
        return fail(f"{message}: it contains NaN",
                    "NaN comes from 0/0 or -inf - (-inf): a softmax over a row whose scores are all "
                    "-inf (every key blocked), or a mask applied to the wrong axis.")
    return fail(message, default_hint)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale


def describe_shapes(**tensors: Tensor | None) -> str:
    parts = [f"{name} {tuple(t.shape)}" for name, t in tensors.items() if t is not None]
    return ", ".join(parts)


def sqrt(x: int) -> float:
    return math.sqrt(x)
