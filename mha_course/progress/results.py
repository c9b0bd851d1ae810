"""What the table of :mod:`mha_course.progress` holds: the statuses, its rows and the report.

A row is one exercise of one chapter (or, with ``exercise=None``, a whole notebook that could
not be read or run, or a cell below its last check that failed); its ``status`` is a check's own (``passed``, ``not implemented``,
``failed``, ``error``) or one of those below, which say why no check result came.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .exercises import Exercise

__all__ = ["ERROR", "FAILED", "ICONS", "NOT_IMPLEMENTED", "NOT_RUN", "NOT_STARTED", "NO_CHECK",
           "PASSED", "TIMED_OUT", "UNREADABLE", "Report", "Row"]

PASSED, NOT_IMPLEMENTED, FAILED, ERROR = "passed", "not implemented", "failed", "error"
# What a row can say besides a check's own status.
NOT_STARTED, NO_CHECK, TIMED_OUT, NOT_RUN, UNREADABLE = (
    "not started", "no check", "timed out", "not run", "unreadable")
ICONS = {PASSED: "✅", NOT_IMPLEMENTED: "⏳", FAILED: "❌", ERROR: "💥", TIMED_OUT: "⌛",
         NO_CHECK: "❓", NOT_RUN: "⏸", UNREADABLE: "💥", NOT_STARTED: ""}


@dataclass
class Row:
    """One line of the table: an exercise (or, for ``exercise=None``, a whole notebook)."""

    chapter: str
    exercise: Exercise | None
    status: str
    message: str = ""
    label: str | None = None  # what the exercise column says for a row of no exercise
    hint: str = ""  # the hint of the check whose result is the verdict (grade's CSV shows its first line)


    @property
    def done(self) -> bool:
        return self.status == PASSED


@dataclass
class Report:
    """The whole table: its rows, how many exercises the course has, and what was run."""

    rows: list[Row]
    exercises: int  # how many the course has
    notebooks_run: int = 0
    seconds: float = 0.0
    chapter_titles: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # workspace notebooks that match no exercise

    @property
    def done(self) -> int:
        return sum(row.done for row in self.rows)


def _clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the last one an ellipsis when it was longer."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())
