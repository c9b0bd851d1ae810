"""What a check gives back, and how it shows: :class:`CheckResult` and :func:`run_check`.

How a verdict shows (the design, tested in a real kernel by tests/test_check_display.py):

- In Jupyter (IPython), every check call displays its verdict the moment it returns,
  wherever it stands in the cell: ``r = check_x(f)``, a line after it, two checks in one
  cell. When the result is also the cell's value, it is not shown a second time; shown
  again in a later cell (``r`` alone), it displays again. Outside IPython nothing is
  printed: the result is returned, and ``print(result)`` shows it.
- ``bool(result)`` is True only when the check passed, so ``if check_x(f):`` works.
  ``assert check_x(f)`` on a failed check raises :class:`CheckFailed`, an AssertionError
  that carries the verdict and hint: ``__bool__`` raises it only when it is called by an
  ``assert`` statement (it reads the caller's next bytecode instruction; where it can't
  tell, ``assert`` gives its usual bare AssertionError, the verdict being displayed above).
- With ``MHA_CHECK_RAISE=1`` in the environment (the repository's conftest.py sets it for
  the kernels nbval starts), a check that failed (❌) or met an error in the learner's
  code (💥) raises :class:`CheckFailed` after showing its verdict, so that even
  ``nbval --nbval-lax`` (which only fails on exceptions) fails on it. "Not implemented
  yet" (⏳) never raises: the exercises run with their stubs.
"""

from __future__ import annotations

import dis
import html
import itertools
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from types import CodeType, FrameType
from typing import Any

import torch

PASSED, NOT_IMPLEMENTED, FAILED, ERROR = "passed", "not implemented", "failed", "error"
ICONS = {PASSED: "✅", NOT_IMPLEMENTED: "⏳", FAILED: "❌", ERROR: "💥"}
COLOURS = {PASSED: "#1a7f37", NOT_IMPLEMENTED: "#6e7781", FAILED: "#cf222e", ERROR: "#cf222e"}

CHECK_LOG = "MHA_CHECK_LOG"
CHECK_RAISE = "MHA_CHECK_RAISE"


class CheckFailed(AssertionError):
    """A failed check, raised by ``assert check_x(f)`` or under ``MHA_CHECK_RAISE=1``."""


# ---------------------------------------------------------------- IPython

_cells = itertools.count(1)
_cell = 0  # which cell is running (counted by a pre_run_cell hook)
_hooked: set[int] = set()


def _next_cell(*_: Any) -> None:
    global _cell
    _cell = next(_cells)


def _shell() -> Any:
    """The running IPython shell, or None (IPython is never imported here for nothing)."""
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is not None and id(shell) not in _hooked:
        shell.events.register("pre_run_cell", _next_cell)
        _hooked.add(id(shell))
        _next_cell()
    return shell


# ---------------------------------------------------------------- assert


_JUMPS_IF_TRUE = {"POP_JUMP_IF_TRUE", "POP_JUMP_FORWARD_IF_TRUE"}
_SKIPPED = {"NOT_TAKEN", "EXTENDED_ARG", "CACHE"}


@lru_cache(maxsize=256)
def _instructions(code: CodeType) -> tuple[dict[int, int], tuple[dis.Instruction, ...]]:
    instructions = tuple(dis.get_instructions(code))
    return {ins.offset: i for i, ins in enumerate(instructions)}, instructions


def _is_assert(frame: FrameType | None) -> bool:
    """Whether ``frame`` is testing a value's truth for an ``assert`` statement.

    ``assert x`` compiles to a jump-if-true (Python 3.13+: preceded by TO_BOOL) over
    "load AssertionError; raise" (LOAD_ASSERTION_ERROR, or 3.14's LOAD_COMMON_CONSTANT);
    ``if x:`` jumps if false, ``assert not x`` negates first: neither is recognised.
    """
    if frame is None:
        return False
    try:
        where, instructions = _instructions(frame.f_code)
        i = where.get(frame.f_lasti)
        if i is None:
            return False
        if instructions[i].opname == "TO_BOOL":
            i += 1
            while i < len(instructions) and instructions[i].opname in _SKIPPED:
                i += 1
        if i >= len(instructions) or instructions[i].opname not in _JUMPS_IF_TRUE:
            return False
        for ins in instructions[i + 1:i + 4]:
            if ins.opname in _SKIPPED:
                continue
            return ins.opname == "LOAD_ASSERTION_ERROR" or (
                ins.opname == "LOAD_COMMON_CONSTANT" and "AssertionError" in str(ins.argval))
    except Exception:  # an interpreter this doesn't know: assert stays bare
        return False
    return False


# ---------------------------------------------------------------- the result


def _html_text(text: str) -> str:
    """``text`` as HTML: escaped, and what it writes between backticks ("use `torch.softmax`")
    shown as code, in JupyterLab as in the book (the plain-text form keeps the backticks)."""
    return re.sub(r"`([^`\n]+)`", r"<code>\1</code>", html.escape(text))


@dataclass(frozen=True)
class CheckResult:
    """The outcome of a check. ``bool(result)`` is True only when it passed.

    Jupyter shows it as a coloured box; elsewhere it prints as plain text.
    """

    name: str
    status: str
    message: str
    hint: str | None = None
    shown_in: int | None = field(default=None, compare=False, repr=False)  # the cell that displayed it

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def failed(self) -> bool:
        """A wrong answer (❌) or an error in the learner's code (💥); not a stub (⏳)."""
        return self.status in (FAILED, ERROR)

    def __bool__(self) -> bool:
        if not self.passed and _is_assert(sys._getframe(1)):
            raise CheckFailed(str(self))
        return self.passed

    def lines(self) -> list[str]:
        lines = [f"{ICONS[self.status]} {self.name}: {self.message}"]
        if self.hint:
            lines.append(f"   Hint: {self.hint}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour = COLOURS[self.status]
        head = f"<b>{ICONS[self.status]} {html.escape(self.name)}</b>: {_html_text(self.message)}"
        hint = f"<br><b>Hint:</b> {_html_text(self.hint)}" if self.hint else ""
        return (
            f'<div style="border-left: 4px solid {colour}; padding: 4px 10px; '
            f'margin: 2px 0; font-family: var(--jp-content-font-family, sans-serif)">{head}{hint}</div>'
        )

    def show(self) -> None:
        """Display the verdict now, in IPython (a no-op elsewhere)."""
        if _shell() is None:
            return
        from IPython.display import display

        display({"text/plain": str(self), "text/html": self._repr_html_()}, raw=True)
        object.__setattr__(self, "shown_in", _cell)

    def _ipython_display_(self) -> None:
        """IPython's hook for ``display(result)`` and for a cell's value: skip what this cell showed."""
        if self.shown_in is None or self.shown_in != _cell:
            self.show()


# ---------------------------------------------------------------- running a check


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
    random numbers of the learner's next cells. The result is logged (``$MHA_CHECK_LOG``),
    shown (in IPython), and raised when it failed under ``$MHA_CHECK_RAISE``.
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
    result.show()
    if result.failed and os.environ.get(CHECK_RAISE, "") not in ("", "0"):
        raise CheckFailed(str(result))
    return result


def log_result(result: CheckResult) -> None:
    """Append the result as one JSON line to the file named by ``$MHA_CHECK_LOG``, if set.

    ``make progress`` (:mod:`mha_course.progress`) runs a learner's notebook with this variable set and
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
