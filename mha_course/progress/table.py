"""The table of :mod:`mha_course.progress` as text, and the ``python -m mha_course progress`` command.

``python -m mha_course`` parses the command line (:mod:`mha_course.__main__`) and calls :func:`main`.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from .results import ICONS, Report, _clip
from .runner import DEFAULT_TIMEOUT, check_workspace

__all__ = ["main", "render"]


def render(report: Report, width: int | None = None) -> str:
    """The table, and the total. ``width`` clips the result column (a terminal's width)."""
    head = ("chapter", "exercise", "result")
    lines = []
    last = None
    for row in report.rows:
        chapter = "" if row.chapter == last else \
            f"{row.chapter[:2]} {report.chapter_titles.get(row.chapter, row.chapter[3:])}"
        last = row.chapter
        exercise = (f"{row.exercise.number} {row.exercise.title}" if row.exercise
                    else row.label or "(the whole notebook)")
        icon = ICONS.get(row.status, "")
        lines.append((_clip(chapter, 34), _clip(exercise, 42), f"{icon} {row.message}".strip()))
    w0 = max([len(head[0])] + [len(a) for a, _, _ in lines])
    w1 = max([len(head[1])] + [len(b) for _, b, _ in lines])
    out = []
    for a, b, c in [head, *lines]:
        line = f"{a:<{w0}}  {b:<{w1}}  {c}"
        # An icon takes two columns in a terminal: one to spare, so that no line wraps.
        out.append(_clip(line, width - 1) if width else line)
    total = f"{report.done} of {report.exercises} exercises done."
    if report.notebooks_run:
        total += (f" Ran {report.notebooks_run} notebook{'s' * (report.notebooks_run != 1)} from workspace/ "
                  f"in {report.seconds:.0f} s (your files are not modified).")
    elif report.notes:
        total += " No notebook in workspace/ was run (see above)."
    else:
        total += " You have no exercise notebook in workspace/ yet: start one with `make exercise N=01`."
    return "\n".join(out + [""] + [f"⚠ {note}" for note in report.notes] + [total])


def main(chapters: Iterable[str] = (), timeout: float = DEFAULT_TIMEOUT, root: Path | None = None,
         fork: bool = True) -> int:
    """Run the notebooks of ``workspace/`` (of ``chapters`` only, if given), print the table
    to stdout and the progress to stderr; exit status 0 whatever the results. ``fork``: each
    kernel forked from one process that imported PyTorch, mha_lib and matplotlib once
    (:mod:`~mha_course.progress.forking`; where the platform can't, kernels start as usual): a
    whole workspace of the 12 solutions ran in 60 s instead of 123 s on 2 cores."""

    def say(name: str, seconds: float) -> None:
        print(f"  ran workspace/{name} in {seconds:.1f} s", file=sys.stderr, flush=True)

    report = check_workspace(root, timeout=timeout, chapters=chapters, on_notebook=say, fork=fork)
    if report.notebooks_run:
        print(file=sys.stderr)
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print(render(report, width))
    return 0
