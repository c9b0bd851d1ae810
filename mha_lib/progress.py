"""How far you are: ``make progress`` (or ``python -m mha_lib progress``).

For every exercise notebook you have in ``workspace/``, run a copy of it in a fresh kernel
(yours is never modified), collect what each check said, and print one line per
exercise::

    chapter                          exercise                          result
    01 Attention from one dot pro…   1.1 Scores (warm-up)              ✅ passed
                                     1.2 A causal mask                 ❌ the mask lets query 0 see key 1 …
                                     1.3 A padding mask                ⏳ not implemented yet
    02 Self-attention with one head  2.1 Self-attention with given …   not started (make exercise N=02)

    1 of 22 exercises done.

How it works. The list of exercises comes from the course's generated ``exercises/NN_*.ipynb``:
each ``### Exercise N.M · Title`` heading and the check called under it (``check_x(...)``).
Each of your notebooks runs top to bottom (up to its last check) with ``nbclient``, errors
allowed, within a time limit, and with ``MHA_CHECK_LOG`` naming a temporary file: every
check call appends one JSON line to it, ``{"check", "status", "message", "hint"}``
(:func:`mha_lib.checks._core.log_result`). A notebook that raises, runs past the limit, or
can't be read (half-edited JSON) gives a line in the table, never a traceback.

This module imports neither PyTorch nor nbclient until a notebook runs, so
``python -m mha_lib progress --help`` answers at once.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .workspace import course_root

__all__ = ["Exercise", "Row", "course_exercises", "check_workspace", "render", "main"]

DEFAULT_TIMEOUT = 120  # seconds of running cells, per notebook (the kernel's start is not counted)

PASSED, NOT_IMPLEMENTED, FAILED, ERROR = "passed", "not implemented", "failed", "error"
# What a row can say besides a check's own status.
NOT_STARTED, NO_CHECK, TIMED_OUT, NOT_RUN, UNREADABLE = (
    "not started", "no check", "timed out", "not run", "unreadable")
ICONS = {PASSED: "✅", NOT_IMPLEMENTED: "⏳", FAILED: "❌", ERROR: "💥", TIMED_OUT: "⌛",
         NO_CHECK: "❓", NOT_RUN: "⏸", UNREADABLE: "💥", NOT_STARTED: ""}

EXERCISE_HEADING = re.compile(r"^#{1,6}\s*Exercise\s+(\d+\.\d+)\s*[·:.-]\s*(.+?)\s*$", re.M)
TITLE_HEADING = re.compile(r"^#\s+(.+?)\s*$", re.M)


@dataclass(frozen=True)
class Exercise:
    chapter: str  # the notebook's stem: "01_dot_product_attention"
    number: str  # "1.2"
    title: str  # "A causal mask"
    checks: tuple[str, ...]  # the check functions called under its heading


@dataclass
class Row:
    """One line of the table: an exercise (or, for ``exercise=None``, a whole notebook)."""

    chapter: str
    exercise: Exercise | None
    status: str
    message: str = ""

    @property
    def done(self) -> bool:
        return self.status == PASSED


@dataclass
class Report:
    rows: list[Row]
    exercises: int  # how many the course has
    notebooks_run: int = 0
    seconds: float = 0.0
    chapter_titles: dict[str, str] = field(default_factory=dict)

    @property
    def done(self) -> int:
        return sum(row.done for row in self.rows)


# ------------------------------------------------------------------ reading notebooks

def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def check_calls(code: str) -> list[str]:
    """The ``check_*`` functions called in a code cell, in order (imports don't count)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:  # IPython magics, or the learner's half-written code
        lines = [line for line in code.splitlines() if not re.match(r"\s*(from|import)\s", line)]
        return re.findall(r"(?<![\w.])(check_\w+)\s*\(", "\n".join(lines))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    names = []
    for node in calls:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name.startswith("check_"):
            names.append(name)
    return names


def notebook_title(cells: Iterable[dict], fallback: str) -> str:
    """"Attention from one dot product" from "# Exercises · Chapter 01 · Attention from one dot product"."""
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            match = TITLE_HEADING.search(_source(cell))
            if match:
                return re.split(r"\s+·\s+", match.group(1))[-1].replace("`", "")
    return fallback


def course_exercises(root: Path) -> tuple[dict[str, list[Exercise]], dict[str, str]]:
    """``({chapter stem: [Exercise, ...]}, {chapter stem: title})`` from ``exercises/NN_*.ipynb``."""
    exercises: dict[str, list[Exercise]] = {}
    titles: dict[str, str] = {}
    for path in sorted((root / "exercises").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        titles[path.stem] = notebook_title(cells, path.stem[3:].replace("_", " "))
        found: list[list] = []  # [number, title, [checks]]
        for cell in cells:
            if cell["cell_type"] == "markdown":
                found += [[m.group(1), m.group(2), []] for m in EXERCISE_HEADING.finditer(_source(cell))]
            elif cell["cell_type"] == "code" and found:
                found[-1][2].extend(check_calls(_source(cell)))
        exercises[path.stem] = [Exercise(path.stem, n, t.replace("`", ""), tuple(dict.fromkeys(c)))
                                for n, t, c in found]
    return exercises, titles


# ------------------------------------------------------------- running one notebook

@dataclass
class _Outcome:
    records: list[dict] = field(default_factory=list)  # the check's JSON lines
    errors: list[str] = field(default_factory=list)  # "cell 5 raised NameError: ..."
    check_cells: int = 0
    stopped: str | None = None  # TIMED_OUT or ERROR (the kernel died): the run ended here


def _assign_cells(cells: list[dict], exercises: list[Exercise]) -> list[Exercise | None]:
    """Which exercise each cell of the learner's copy belongs to: the one whose check it
    calls, else the one under whose heading it stands (in the copy, which may be edited)."""
    by_check: dict[str, Exercise] = {}
    for exercise in exercises:
        for name in exercise.checks:
            by_check.setdefault(name, exercise)
    by_number = {e.number: e for e in exercises}
    current: Exercise | None = None
    owners: list[Exercise | None] = []
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            headings = EXERCISE_HEADING.findall(_source(cell))
            if headings:
                current = by_number.get(headings[-1][0], current)
            elif TITLE_HEADING.search(_source(cell)) or re.search(r"^##\s", _source(cell), re.M):
                current = None  # "## Part 2", "## Done?": no longer inside an exercise
            owners.append(current)
        elif cell.get("cell_type") == "code":
            calls = [by_check[c] for c in check_calls(_source(cell)) if c in by_check]
            owners.append(calls[0] if calls else current)
        else:
            owners.append(None)
    return owners


def _error_line(output: dict) -> str:
    lines = str(output.get("evalue", "")).strip().splitlines()
    # "(2878884339.py, line 1)": the kernel's name for the cell means nothing to the learner.
    value = re.sub(r"\(\S+\.py, (line \d+)\)", r"(\1)", lines[0]) if lines else ""
    return f"{output.get('ename', 'Error')}: {value}".strip().rstrip(":")


def _cell(cell) -> str:
    """How the learner finds a cell: its first line (JupyterLab shows no cell numbers)."""
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    return f'the cell "{_clip(first, 40)}"'


def _run(nb, workspace: Path, owners: list[Exercise | None], timeout: float,
         outcomes: dict[str, _Outcome]) -> Row | None:
    """Run the notebook's cells up to its last check, in one fresh kernel, and fill in
    ``outcomes``. Returns a row for the whole notebook when the run stopped outside every
    exercise (a cell at the top that hangs, or a kernel that dies there)."""
    import logging

    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    check_cells = [i for i, cell in enumerate(nb.cells)
                   if cell.cell_type == "code" and check_calls(cell.source)]
    if not check_cells:
        return None
    quiet = logging.getLogger("mha_lib.progress.nbclient")  # nbclient logs timeouts as errors
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    started: set[str] = set()  # exercises at least one of whose cells ran
    outside: list[str] = []  # errors of cells outside every exercise, so far
    with tempfile.TemporaryDirectory(prefix="mha-progress-") as tmp:
        log = Path(tmp) / "checks.jsonl"
        log.touch()
        env = dict(os.environ, MHA_CHECK_LOG=str(log), PYTHONUNBUFFERED="1")
        client = NotebookClient(
            nb, timeout=int(timeout), allow_errors=True, kernel_name="python3", log=quiet,
            shutdown_kernel="immediate", record_timing=False,
            resources={"metadata": {"path": str(workspace)}},
        )
        # The kernel's own output (not the cells') goes nowhere: the table is the report.
        with client.setup_kernel(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            deadline = time.monotonic() + timeout  # the kernel's start is not counted
            position = 0
            for index, cell in enumerate(nb.cells[: check_cells[-1] + 1]):
                if cell.cell_type != "code":
                    continue
                owner = owners[index]
                outcome = outcomes[owner.number] if owner else None
                if owner and outcome and owner.number not in started:
                    started.add(owner.number)
                    outcome.errors += outside  # an earlier failure may be why this one fails
                client.timeout = max(1, int(deadline - time.monotonic() + 0.999))
                stop: str | None = None
                why = ""
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    stop, why = TIMED_OUT, (f"{_cell(cell)} was still running after the {timeout:g} s "
                                            "limit (an endless loop, or a very slow cell?)")
                except DeadKernelError:
                    stop, why = ERROR, f"the kernel died in {_cell(cell)} (out of memory, or a crash?)"
                with log.open(encoding="utf-8") as lines:
                    lines.seek(position)
                    new = [_record(line) for line in lines.read().splitlines() if line.strip()]
                    position = lines.tell()
                errors = [f"{_cell(cell)}{'' if outcome else ', above the exercises,'} raised {_error_line(o)}"
                          for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                if outcome is not None:
                    outcome.records += new
                    outcome.check_cells += bool(check_calls(cell.source))
                    outcome.errors += errors
                else:
                    outside += errors
                if stop:
                    for number, other in outcomes.items():
                        if other is outcome:
                            other.stopped, other.errors = stop, [why]
                        elif number not in started:
                            other.stopped = NOT_RUN
                    return None if outcome else Row("", None, stop, why)
    return None


def _record(line: str) -> dict:
    """One check's JSON line (a line cut short by a dying kernel reads as an error)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        return {"status": ERROR, "message": f"a check's result could not be read: {line[:80]!r}"}
    return record


def _verdict(exercise: Exercise, outcome: _Outcome) -> tuple[str, str]:
    """(status, message) of one exercise from what its cells did."""
    if outcome.stopped == NOT_RUN:
        return NOT_RUN, "not checked: the notebook stopped earlier (see above)"
    if outcome.stopped in (TIMED_OUT, ERROR):
        return outcome.stopped, outcome.errors[0]
    records = outcome.records
    for status in (FAILED, ERROR):
        for record in records:
            if record.get("status") == status:
                return status, _one_line(record.get("message", ""))
    if any(r.get("status") == NOT_IMPLEMENTED for r in records):
        return NOT_IMPLEMENTED, "not implemented yet"
    if records and all(r.get("status") == PASSED for r in records):
        return PASSED, "passed"
    if outcome.errors:
        return ERROR, outcome.errors[0]
    if not outcome.check_cells:
        calls = ", ".join(f"{name}(...)" for name in exercise.checks) or "its check"
        return NO_CHECK, f"no check ran: your copy has no cell that calls {calls}"
    return NO_CHECK, "the check cell ran but printed no result"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _check_notebook(path: Path, exercises: list[Exercise], timeout: float) -> list[Row]:
    chapter = path.stem
    try:
        import nbformat

        text = path.read_text(encoding="utf-8")
        json.loads(text)  # its error says where the JSON breaks, in a few words
        invalid: dict = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. cells without ids, from an old nbformat
            nb = nbformat.reads(text, as_version=4, capture_validation_error=invalid)
        if invalid:
            error = invalid["ValidationError"]
            raise ValueError(f"{error.message}" + (f" at {'/'.join(map(str, error.path))}" if error.path else ""))
    except Exception as error:  # noqa: BLE001 - half-edited JSON, a wrong format, unreadable
        reason = _one_line(str(error).splitlines()[0] if str(error) else type(error).__name__)
        return [Row(chapter, None, UNREADABLE,
                    f"workspace/{path.name} is not a notebook that can be read ({reason}). Open it in "
                    f"a text editor to fix it, or rename it and run `make exercise N={chapter[:2]}` "
                    "for a fresh copy")]
    for cell in nb.cells:  # a copy in memory: nothing is ever written back
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    owners = _assign_cells(nb.cells, exercises)
    outcomes = {e.number: _Outcome() for e in exercises}
    try:
        whole = _run(nb, path.parent, owners, timeout, outcomes)
    except Exception as error:  # noqa: BLE001 - the kernel would not start, ...
        return [Row(chapter, None, ERROR, f"could not run workspace/{path.name}: "
                                          f"{type(error).__name__}: {_one_line(str(error))}")]
    rows = [Row(chapter, None, whole.status, whole.message)] if whole else []
    return rows + [Row(chapter, e, *_verdict(e, outcomes[e.number])) for e in exercises]


def check_workspace(root: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
                    chapters: Iterable[str] = (), on_notebook: Callable[[str, float], None] | None = None) -> Report:
    """Run the learner's notebooks and return what the table shows.

    ``chapters``: numbers ("01") or stems to limit the report to; ``on_notebook(name, seconds)``
    is called after each notebook ran (the command line prints it as it goes).
    """
    root = root or course_root()
    exercises, titles = course_exercises(root)
    wanted = {c.strip()[:2] if c.strip()[:2].isdigit() else c for c in chapters}
    if wanted:
        exercises = {stem: ex for stem, ex in exercises.items() if stem[:2] in wanted or stem in wanted}
    report = Report(rows=[], exercises=sum(map(len, exercises.values())), chapter_titles=titles)
    start = time.perf_counter()
    for stem, chapter_exercises in exercises.items():
        copy = root / "workspace" / f"{stem}.ipynb"
        if not copy.exists():
            report.rows += [Row(stem, e, NOT_STARTED, f"not started (make exercise N={stem[:2]})" if i == 0
                                else "not started") for i, e in enumerate(chapter_exercises)]
            continue
        began = time.perf_counter()
        rows = _check_notebook(copy, chapter_exercises, timeout)
        report.rows += rows
        report.notebooks_run += rows[0].status != UNREADABLE
        if on_notebook:
            on_notebook(copy.name, time.perf_counter() - began)
    report.seconds = time.perf_counter() - start
    return report


# ------------------------------------------------------------------------- the table

def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render(report: Report, width: int | None = None) -> str:
    """The table, and the total. ``width`` clips the result column (a terminal's width)."""
    head = ("chapter", "exercise", "result")
    lines = []
    last = None
    for row in report.rows:
        chapter = "" if row.chapter == last else \
            f"{row.chapter[:2]} {report.chapter_titles.get(row.chapter, row.chapter[3:])}"
        last = row.chapter
        exercise = f"{row.exercise.number} {row.exercise.title}" if row.exercise else "(the whole notebook)"
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
    else:
        total += " You have no exercise notebook in workspace/ yet: start one with `make exercise N=01`."
    return "\n".join(out + ["", total])


def main(chapters: Iterable[str] = (), timeout: float = DEFAULT_TIMEOUT, root: Path | None = None) -> int:
    def say(name: str, seconds: float) -> None:
        print(f"  ran workspace/{name} in {seconds:.1f} s", file=sys.stderr, flush=True)

    report = check_workspace(root, timeout=timeout, chapters=chapters, on_notebook=say)
    if report.notebooks_run:
        print(file=sys.stderr)
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    print(render(report, width))
    return 0
