"""Running the learner's notebooks: each in a fresh kernel, collecting what its checks said.

A copy of each notebook in ``workspace/`` (the file is never written) runs top to bottom, to its
last cell, with ``nbclient``: errors allowed, within a time limit, and with
``MHA_CHECK_LOG`` naming a temporary file to which every check call appends one JSON line
(:func:`mha_lib.checks._result.log_result`). Each cell is assigned to an exercise, and each
exercise gets a verdict from its cells' check results and errors; an error (or a timeout) in a
cell below the last check gets a row of its own. PyTorch runs only in the
kernels; nbformat and nbclient are imported only when a notebook is read or run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..workspace import course_root
from .exercises import EXERCISE_HEADING, TITLE_HEADING, Exercise, _source, check_calls, course_exercises
from .results import (ERROR, FAILED, NO_CHECK, NOT_IMPLEMENTED, NOT_RUN, NOT_STARTED, PASSED, TIMED_OUT,
                      UNREADABLE, Report, Row, _clip, _one_line)

if TYPE_CHECKING:  # nbformat is imported only when a notebook is read
    from nbformat import NotebookNode

__all__ = ["DEFAULT_TIMEOUT", "Outcome", "assign_cells", "check_workspace", "defined_functions", "verdict",
           "verdict_and_hint"]

DEFAULT_TIMEOUT = 120  # seconds of running cells, per notebook (the kernel's start is not counted)


@dataclass
class Outcome:
    """What the cells of one exercise did while its notebook ran."""

    records: list[dict] = field(default_factory=list)  # the check's JSON lines
    errors: list[str] = field(default_factory=list)  # "cell 5 raised NameError: ..."
    check_cells: int = 0
    stopped: str | None = None  # TIMED_OUT or ERROR (the kernel died): the run ended here


def assign_cells(cells: list[dict], exercises: list[Exercise]) -> list[Exercise | None]:
    """Which exercise each cell of the learner's copy belongs to: the one whose check it
    calls, else the one under whose heading it stands (in the copy, which may be edited)."""
    by_check: dict[str, Exercise] = {}
    for exercise in exercises:
        for name in exercise.checks:
            by_check.setdefault(name, exercise)
    by_number = {e.number: e for e in exercises}
    # A copy started before the course renumbered its chapter says "Exercise 9.1" where the course
    # now says "10.1": a heading whose chapter number is none of these exercises' goes by its rank.
    chapters = {e.number.partition(".")[0] for e in exercises}
    by_rank: dict[str, Exercise] = {}
    for exercise in exercises:
        by_rank.setdefault(exercise.number.partition(".")[2], exercise)

    def by_heading(number: str) -> Exercise | None:
        chapter, _, rank = number.partition(".")
        return by_number.get(number) or (by_rank.get(rank) if chapter not in chapters else None)

    current: Exercise | None = None
    owners: list[Exercise | None] = []
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            headings = EXERCISE_HEADING.findall(_source(cell))
            if headings:
                current = by_heading(headings[-1][0]) or current
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
    """An error output in one line: ``"NameError: name 'x' is not defined"``."""
    lines = str(output.get("evalue", "")).strip().splitlines()
    # "(2878884339.py, line 1)": the kernel's name for the cell means nothing to the learner.
    value = re.sub(r"\(\S+\.py, (line \d+)\)", r"(\1)", lines[0]) if lines else ""
    return f"{output.get('ename', 'Error')}: {value}".strip().rstrip(":")


def _cell(cell: NotebookNode) -> str:
    """How the learner finds a cell: its first line (JupyterLab shows no cell numbers)."""
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    return f'the cell "{_clip(first, 40)}"'


AFTER_CHECKS = "(below the last check)"  # the label of the row of a cell below every check


def _run(nb: NotebookNode, workspace: Path, owners: list[Exercise | None], timeout: float,
         outcomes: dict[str, Outcome], after: list[Row] | None = None, env: dict[str, str] | None = None,
         below_last_check: bool = True, fork: bool = False) -> Row | None:
    """Run the notebook's cells, all of them, in one fresh kernel, and fill in ``outcomes``.
    Returns a row for the whole notebook when the run stopped outside every exercise (a cell at
    the top that hangs, or a kernel that dies there). A cell below the last check that raises,
    hangs or kills the kernel adds a row to ``after`` (the checks above have their verdicts).
    ``env``: variables added to the kernel's environment (``grade`` passes ``MHA_CHECK_SEED``).
    ``below_last_check=False`` stops after the last cell that calls a check: no verdict can change
    below it (``grade`` does this unless told ``--all-cells``; ``make progress`` runs every cell).
    ``fork=True``: the kernel is forked from a process that has imported PyTorch and mha_lib
    (:mod:`~mha_course.progress.forking`; ``grade`` does this), where this platform allows."""
    after = [] if after is None else after
    import logging

    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    check_cells = [i for i, cell in enumerate(nb.cells)
                   if cell.cell_type == "code" and check_calls(cell.source)]
    if not check_cells:
        return None
    quiet = logging.getLogger("mha_course.progress.nbclient")  # nbclient logs timeouts as errors
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    started: set[str] = set()  # exercises at least one of whose cells ran
    outside: list[str] = []  # errors of cells outside every exercise, so far
    with tempfile.TemporaryDirectory(prefix="mha-progress-") as tmp:
        log = Path(tmp) / "checks.jsonl"
        log.touch()
        manager = None
        if fork:
            from .forking import kernel_manager_class

            manager = kernel_manager_class(dict(os.environ, **(env or {})))
        env = dict(os.environ, **(env or {}), MHA_CHECK_LOG=str(log), PYTHONUNBUFFERED="1")
        client = NotebookClient(
            nb, timeout=int(timeout), allow_errors=True, kernel_name="python3", log=quiet,
            shutdown_kernel="immediate", record_timing=False,
            resources={"metadata": {"path": str(workspace)}},
            **({"kernel_manager_class": manager} if manager else {}),
        )
        # The kernel's own output (not the cells') goes nowhere: the table is the report.
        with client.setup_kernel(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
            deadline = time.monotonic() + timeout  # the kernel's start is not counted
            position = 0
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                if index > check_cells[-1] and not below_last_check:
                    break
                if index > check_cells[-1]:  # below every check: its errors are the notebook's own
                    client.timeout = max(1, int(deadline - time.monotonic() + 0.999))
                    try:
                        client.execute_cell(cell, index)
                    except CellTimeoutError:
                        after.append(Row("", None, TIMED_OUT, f"{_cell(cell)}, below the last check, was still "
                                                              f"running after the {timeout:g} s limit"))
                        return None
                    except DeadKernelError:
                        after.append(Row("", None, ERROR, f"the kernel died in {_cell(cell)}, below the last check "
                                                          "(out of memory, or a crash?)"))
                        return None
                    after += [Row("", None, ERROR, f"{_cell(cell)}, below the last check, raised {_error_line(o)}")
                              for o in cell.get("outputs", []) if o.get("output_type") == "error"]
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


# A check whose code calls a stub of an earlier exercise says so (mha_lib.checks._calling.describe_error).
_WAITS_FOR = re.compile(r"it calls (\w+), which still raises NotImplementedError")


def defined_functions(cells: list, owners: list[Exercise | None]) -> dict[str, str]:
    """``{function name: the number of the exercise whose cells define it}`` in the learner's copy."""
    found: dict[str, str] = {}
    for cell, owner in zip(cells, owners):
        if owner is not None and cell.get("cell_type") == "code":
            for name in re.findall(r"^\s*def\s+(\w+)\s*\(", _source(cell), re.M):
                found.setdefault(name, owner.number)
    return found


def _waiting(exercise: Exercise, records: list[dict], definitions: dict[str, str]) -> str:
    """"waits for exercise 12.1: halves_mask is not implemented yet" when a check's code calls the stub
    of another exercise; "not implemented yet" when the exercise's own code is the stub."""
    for record in records:
        match = _WAITS_FOR.search(str(record.get("message", "")))
        if record.get("status") == NOT_IMPLEMENTED and match:
            name = match.group(1)
            number = definitions.get(name)
            if number and number != exercise.number:
                return f"waits for exercise {number}: {name} is not implemented yet"
            return f"waits for {name}, which is not implemented yet"
    return "not implemented yet"


def verdict(exercise: Exercise, outcome: Outcome, definitions: dict[str, str] | None = None) -> tuple[str, str]:
    """(status, message) of one exercise from what its cells did. Each check's last run is its verdict
    (a wrong attempt above a fixed one no longer counts); ``definitions``: which exercise defines
    each of the learner's functions (:func:`defined_functions`)."""
    status, message, _ = verdict_and_hint(exercise, outcome, definitions)
    return status, message


def verdict_and_hint(exercise: Exercise, outcome: Outcome,
                     definitions: dict[str, str] | None = None) -> tuple[str, str, str]:
    """:func:`verdict`, and the hint of the check whose result decided it ("" when none)."""
    if outcome.stopped == NOT_RUN:
        return NOT_RUN, "not checked: the notebook stopped earlier (see above)", ""
    if outcome.stopped in (TIMED_OUT, ERROR):
        return outcome.stopped, outcome.errors[0], ""
    last: dict[str, dict] = {}
    for record in outcome.records:
        last[str(record.get("check", ""))] = record  # a later run of the same check replaces the earlier one
    records = list(last.values())
    for status in (FAILED, ERROR):
        for record in records:
            if record.get("status") == status:
                return status, _one_line(record.get("message", "")), str(record.get("hint") or "")
    if any(r.get("status") == NOT_IMPLEMENTED for r in records):
        return NOT_IMPLEMENTED, _waiting(exercise, records, definitions or {}), ""
    if records and all(r.get("status") == PASSED for r in records):
        return PASSED, "passed", ""
    if outcome.errors:
        return ERROR, outcome.errors[0], ""
    if not outcome.check_cells:
        calls = ", ".join(f"{name}(...)" for name in exercise.checks) or "its check"
        return NO_CHECK, f"no check ran: your copy has no cell that calls {calls}", ""
    return NO_CHECK, "the check cell ran but printed no result", ""


def _check_notebook(path: Path, exercises: list[Exercise], timeout: float,
                    env: dict[str, str] | None = None, below_last_check: bool = True,
                    fork: bool = False) -> list[Row]:
    """The rows of one notebook of ``workspace/``: one per exercise, after a row for the whole
    notebook when it could not be read or run (or stopped above the exercises)."""
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
    owners = assign_cells(nb.cells, exercises)
    outcomes = {e.number: Outcome() for e in exercises}
    after: list[Row] = []
    try:
        whole = _run(nb, path.parent, owners, timeout, outcomes, after, env, below_last_check, fork)
    except Exception as error:  # noqa: BLE001 - the kernel would not start, ...
        return [Row(chapter, None, ERROR, f"could not run workspace/{path.name}: "
                                          f"{type(error).__name__}: {_one_line(str(error))}")]
    rows = [Row(chapter, None, whole.status, whole.message)] if whole else []
    definitions = defined_functions(nb.cells, owners)
    tail = [Row(chapter, None, row.status, row.message, label=AFTER_CHECKS) for row in after]
    verdicts = [(e, verdict_and_hint(e, outcomes[e.number], definitions)) for e in exercises]
    return rows + [Row(chapter, e, status, message, hint=hint) for e, (status, message, hint) in verdicts] + tail


def check_workspace(root: Path | None = None, timeout: float = DEFAULT_TIMEOUT,
                    chapters: Iterable[str] = (), on_notebook: Callable[[str, float], None] | None = None,
                    workspace: Path | None = None, env: dict[str, str] | None = None,
                    below_last_check: bool = True, fork: bool = False) -> Report:
    """Run the learner's notebooks and return what the table shows.

    ``chapters``: numbers ("01") or stems to limit the report to; ``on_notebook(name, seconds)``
    is called after each notebook ran (the command line prints it as it goes). ``workspace``: the
    folder of notebooks (default ``root/workspace``; ``grade`` passes a student's); ``env``:
    variables added to each kernel's environment; ``below_last_check=False``: stop each notebook
    after its last check cell; ``fork``: kernels forked from a process that imported PyTorch (see
    :func:`_run`).
    """
    root = root or course_root()
    workspace = workspace or root / "workspace"
    exercises, titles = course_exercises(root)
    wanted = {c.strip()[:2] if c.strip()[:2].isdigit() else c for c in chapters}
    if wanted:
        exercises = {stem: ex for stem, ex in exercises.items() if stem[:2] in wanted or stem in wanted}
    report = Report(rows=[], exercises=sum(map(len, exercises.values())), chapter_titles=titles)
    start = time.perf_counter()
    for stem, chapter_exercises in exercises.items():
        copy = workspace / f"{stem}.ipynb"
        if not copy.exists():
            report.rows += [Row(stem, e, NOT_STARTED, f"not started (make exercise N={stem[:2]})" if i == 0
                                else "not started") for i, e in enumerate(chapter_exercises)]
            continue
        began = time.perf_counter()
        rows = _check_notebook(copy, chapter_exercises, timeout, env, below_last_check, fork)
        report.rows += rows
        report.notebooks_run += rows[0].status != UNREADABLE
        if on_notebook:
            on_notebook(copy.name, time.perf_counter() - began)
    report.seconds = time.perf_counter() - start
    report.notes = stray_notebooks(root, titles, wanted, workspace)
    return report


def stray_notebooks(root: Path, stems: Iterable[str], wanted: Iterable[str] = (),
                    workspace: Path | None = None) -> list[str]:
    """A line for each ``workspace/NN_*.ipynb`` named after no exercise (none of ``stems``): it is
    not checked. When an exercise has its name under another number (the course renumbered the
    chapter, and the copy was not renamed with it), the line says how to rename it."""
    stems, wanted = set(stems), set(wanted)
    workspace = workspace or root / "workspace"
    notes = []
    for copy in sorted(workspace.glob("[0-9][0-9]_*.ipynb")):
        if copy.stem in stems:
            continue
        same = [s for s in sorted(stems) if s[3:] == copy.stem[3:]]
        if wanted and not {copy.stem, copy.stem[:2], *same, *(s[:2] for s in same)} & wanted:
            continue
        if len(same) == 1 and (workspace / f"{same[0]}.ipynb").exists():
            notes.append(f"workspace/{copy.name} is not checked: its exercise is now {same[0]} (the course "
                         f"renumbered it), and workspace/{same[0]}.ipynb is the copy checked. Copy what you want "
                         f"to keep from {copy.name} into it, then move {copy.name} out of workspace/.")
        elif len(same) == 1:
            notes.append(f"workspace/{copy.name} is not checked: its exercise is now {same[0]} (the course "
                         f"renumbered it). Rename your copy to have it checked: "
                         f"mv workspace/{copy.name} workspace/{same[0]}.ipynb")
        else:
            example = next((s for s in sorted(stems) if s[:2] == copy.stem[:2]), min(stems, default="01_x"))
            notes.append(f"workspace/{copy.name} is not checked: no exercise has that name (a copy is checked when "
                         f"it is named as its exercise in exercises/, e.g. {example}.ipynb). Rename it to have "
                         "it checked, or leave it as it is: it stays yours.")
    return notes
