"""Grading a class: ``python -m mha_course grade SUBMISSIONS/`` (INSTRUCTORS.md).

Each subfolder of ``SUBMISSIONS/`` is one student's ``workspace/`` (or holds it: ``alice/workspace/``),
named after the student. Every notebook in it that is named after an exercise notebook of the course
(``01_dot_product_attention.ipynb``) runs as ``make progress`` runs it (:mod:`mha_course.progress`,
the same code): a copy, in a new kernel of its own, within the same time limit per notebook, each check's
last verdict kept. A notebook that raises, runs past the limit, or is not valid JSON costs only
its own exercises' points. A notebook saved under another chapter's name (it calls that chapter's
checks) is not run and scores 0, with a line that says so.

Faster than ``make progress``, with the same verdicts: ``--jobs N`` notebooks at once (default: the
cores; the CSV's rows in the same order), each kernel forked from a server that imported PyTorch once
(:mod:`mha_course.progress.forking`; ``--no-fork`` starts them from scratch), and each notebook stopped
after its last check cell (``--all-cells`` runs the rest too).

The output: a CSV with one row per student and exercise (student, chapter, exercise, points,
max_points, verdict, message, hint: its first line) and a summary table on stdout (each
student's total, then how many students passed each exercise). With ``--seed N`` the checks run
on hidden inputs (:func:`mha_lib.checks.hidden_cases`): the same checks, on inputs the students'
own runs never drew. Nothing in ``SUBMISSIONS/`` is written, and an existing CSV is not
overwritten without ``--force``.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .progress.exercises import Exercise, _source, check_calls, course_exercises
from .progress.results import ERROR, NOT_RUN, NOT_STARTED, PASSED, Row, _clip, _one_line
from .progress.runner import AFTER_CHECKS, DEFAULT_TIMEOUT, check_workspace
from .workspace import WorkspaceError, course_root

__all__ = ["COLUMNS", "GradeError", "Grades", "NOT_SUBMITTED", "WRONG_CHAPTER", "check_jobs", "default_jobs", "grade",
           "main", "parse_points", "summary", "write_csv"]

COLUMNS = ("student", "chapter", "exercise", "points", "max_points", "verdict", "message", "hint")
NOT_SUBMITTED = "not submitted"  # the student's folder has no notebook of this chapter
WRONG_CHAPTER = "wrong chapter"  # a notebook named after one chapter that holds another's exercises
_NOTEBOOK = re.compile(r"^\d\d_.+\.ipynb$")


class GradeError(WorkspaceError):
    """The submissions can't be graded as given; the message says why and what to do."""


@dataclass
class Grades:
    """What ``grade`` found: the CSV's rows, and a line for each thing left ungraded."""

    rows: list[dict] = field(default_factory=list)
    students: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # per student: the seconds their notebooks ran
    wall: float = 0.0  # seconds from the first notebook's start to the last one's end
    jobs: int = 1  # how many notebooks ran at once


def parse_points(specs: Iterable[str], exercises: dict[str, list[Exercise]]) -> dict[str, float]:
    """``{"1.4": 2.0}`` from ``["1.4=2", "2.1=0.5"]``; an unknown exercise or a bad number is refused."""
    known = {e.number for chapter in exercises.values() for e in chapter}
    points: dict[str, float] = {}
    for spec in specs:
        for item in filter(None, (part.strip() for part in spec.split(","))):
            number, sep, value = item.partition("=")
            number = number.strip()
            try:
                amount = float(value)
            except ValueError:
                amount = -1.0
            if not sep or amount < 0:
                raise GradeError(f"--points {item!r}: write EXERCISE=POINTS with POINTS a number >= 0, e.g. 1.4=2")
            if number not in known:
                raise GradeError(f"--points {item!r}: the course has no exercise {number!r} "
                                 f"(its exercises: {', '.join(sorted(known, key=_number_key))})")
            points[number] = amount
    return points


def _number_key(number: str) -> tuple[int, ...]:
    return tuple(int(part) for part in number.split(".") if part.isdigit())


def _student_folder(folder: Path) -> Path:
    """The folder that holds a student's notebooks: ``alice/workspace/`` if there is one, else ``alice/``."""
    inner = folder / "workspace"
    return inner if inner.is_dir() else folder


def _calls(path: Path) -> set[str] | None:
    """The ``check_*`` functions a notebook calls, or None when it can't be read (the runner reports that)."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return {name for cell in cells if cell.get("cell_type") == "code" for name in check_calls(_source(cell))}
    except Exception:  # noqa: BLE001 - not JSON, not a notebook: progress's runner says what is wrong
        return None


def _wrong_chapter(path: Path, stem: str, exercises: dict[str, list[Exercise]]) -> str | None:
    """Why ``path``, named after chapter ``stem``, holds another chapter's exercises (None when it doesn't):
    it calls none of this chapter's checks and some of another's."""
    calls = _calls(path)
    if calls is None:
        return None
    own = {name for e in exercises[stem] for name in e.checks}
    if calls & own:
        return None
    others = sorted({other for other, chapter in exercises.items() if other != stem
                     for e in chapter if set(e.checks) & calls})
    if not others:
        return None
    return (f"{path.name} holds the exercises of {', '.join(others)} (it calls their checks), not those of "
            f"{stem}: not run, 0 points. Was it saved under the wrong name?")


def _rows_of(student: str, report_rows: list[Row], exercises: list[Exercise], stem: str,
             points: dict[str, float]) -> list[dict]:
    """The CSV rows of one chapter of one student, from progress's rows (one per exercise, whatever happened)."""
    whole = next((row for row in report_rows if row.exercise is None and row.label is None), None)
    by_number = {row.exercise.number: row for row in report_rows if row.exercise is not None}
    out = []
    for exercise in exercises:
        worth = points.get(exercise.number, exercise.points)
        row = by_number.get(exercise.number)
        if row is None or (whole is not None and row.status == NOT_RUN):
            status, message, hint = (whole.status, whole.message, "") if whole else (NOT_SUBMITTED, "", "")
        else:
            status, message, hint = row.status, row.message, row.hint
        if status == NOT_STARTED:
            status, message = NOT_SUBMITTED, f"no {stem}.ipynb in the student's folder"
        out.append({"student": student, "chapter": stem, "exercise": f"{exercise.number} {exercise.title}",
                    "points": _number(worth if status == PASSED else 0.0), "max_points": _number(worth),
                    "verdict": status, "message": message, "hint": _first_line(hint)})
    for row in report_rows:
        if row.label == AFTER_CHECKS:  # counts no points, but the student should hear of it
            out.append({"student": student, "chapter": stem, "exercise": AFTER_CHECKS, "points": "0",
                        "max_points": "0", "verdict": row.status, "message": row.message, "hint": ""})
    return out


def _number(value: float) -> str:
    return f"{value:g}"


def _first_line(text: str) -> str:
    return _one_line(next((line for line in str(text).splitlines() if line.strip()), ""))


def default_jobs() -> int:
    """How many notebooks ``grade`` runs at once unless told: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def check_jobs(jobs: object) -> int:
    """``jobs`` as a whole number >= 1, or a :class:`GradeError` that says what was wrong."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise GradeError(f"--jobs {jobs!r}: give how many notebooks to run at once, a whole number >= 1 "
                         f"(e.g. --jobs {default_jobs()}, the cores of this machine)")
    return jobs


def _thread_env(jobs: int) -> dict[str, str]:
    """With several kernels at once, each one's PyTorch gets its share of the cores (``OMP_NUM_THREADS``):
    2 kernels of 2 threads each on 2 cores would only take turns. Unset with one job (as ``make progress``),
    and never changed when the instructor set it."""
    if jobs == 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, default_jobs() // jobs))}


def _grade_notebook(root: Path, workspace: Path, stem: str, timeout: float, env: dict[str, str],
                    all_cells: bool, fork: bool) -> tuple[list[Row], float | None]:
    """One student's notebook of one chapter, as ``make progress`` checks it: its rows, and the seconds
    it ran (None when there was nothing to run). Runs in a worker process when ``--jobs`` > 1."""
    ran: list[float] = []
    report = check_workspace(root, timeout=timeout, chapters=[stem], workspace=workspace, env=env,
                             on_notebook=lambda _name, seconds: ran.append(seconds), below_last_check=all_cells,
                             fork=fork)
    return report.rows, (ran[0] if ran else None)


def grade(submissions: Path, root: Path | None = None, timeout: float = DEFAULT_TIMEOUT, chapters: Iterable[str] = (),
          seed: int | None = None, points: dict[str, float] | None = None,
          on_notebook: Callable[[str, str, float], None] | None = None, jobs: int = 1,
          all_cells: bool = False, fork: bool = True) -> Grades:
    """Grade every student folder in ``submissions``; see the module's docstring. ``jobs``: how many
    notebooks run at once (each in its own kernel, with its own time limit; the rows come out in the same
    order whatever it is); ``all_cells``: also run the cells below each notebook's last check; ``fork``:
    fork each kernel from a process that imported PyTorch once (:mod:`mha_course.progress.forking`),
    not start it from scratch."""
    root = root or course_root()
    jobs = check_jobs(jobs)
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise GradeError(f"{submissions} is not a folder; give the folder that holds one folder per student")
    exercises, _ = course_exercises(root)
    wanted = {c.strip()[:2] if c.strip()[:2].isdigit() else c.strip() for c in chapters}
    unknown = [c for c in wanted if not any(s[:2] == c or s == c for s in exercises)]
    if unknown:
        raise GradeError(f"no chapter {', '.join(sorted(unknown))}; the course's: {', '.join(exercises)}")
    if wanted:
        exercises = {s: e for s, e in exercises.items() if s[:2] in wanted or s in wanted}
    points = points or {}
    folders = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not folders:
        raise GradeError(f"{submissions} holds no student folder; put each student's workspace/ in a folder of "
                         f"its own, named after the student: {submissions}/alice/01_dot_product_attention.ipynb")
    found = {f.name: sorted(p for p in _student_folder(f).glob("*.ipynb")) for f in folders}
    if not any(found.values()):
        raise GradeError(f"no notebook in any student folder of {submissions} ({len(folders)} folders, e.g. "
                         f"{folders[0].name}/); each should hold the student's copies, e.g. "
                         f"{folders[0].name}/01_dot_product_attention.ipynb")
    grades = Grades(students=[f.name for f in folders])
    env = ({} if seed is None else {"MHA_CHECK_SEED": str(seed)}) | _thread_env(jobs)
    # The plan, in the CSV's order: per student and chapter, rows known at once (a wrong chapter) or a notebook
    # to run. The notebooks run one after another, or `jobs` at a time; the rows are put back in this order.
    plan: list[tuple[str, str, Path, list[Row] | None]] = []
    for folder in folders:
        student, workspace = folder.name, _student_folder(folder)
        ours = [p for p in found[student] if p.stem in exercises]
        strays = [p.name for p in found[student] if p.stem not in exercises and not (
            wanted and _NOTEBOOK.match(p.name) and p.stem[:2] not in wanted)]
        if not ours and found[student] and not wanted:
            grades.notes.append(f"{student}: holds no notebook of this course (found {', '.join(strays)}); "
                                "every exercise scores 0. Another course's notebooks, or renamed copies?")
        elif strays:
            grades.notes.append(f"{student}: not graded: {', '.join(strays)} (named after no exercise notebook "
                                "of the course, e.g. 01_dot_product_attention.ipynb)")
        grades.seconds[student] = 0.0
        for stem in exercises:
            copy = workspace / f"{stem}.ipynb"
            wrong = _wrong_chapter(copy, stem, exercises) if copy.exists() else None
            plan.append((student, stem, workspace, [Row(stem, None, WRONG_CHAPTER, wrong)] if wrong else None))

    def done(student: str, stem: str, seconds: float | None) -> None:
        if seconds is not None:
            grades.seconds[student] += seconds
            if on_notebook:
                on_notebook(student, f"{stem}.ipynb", seconds)

    started = time.perf_counter()
    results: dict[int, list[Row]] = {}
    if jobs == 1:
        for i, (student, stem, workspace, rows) in enumerate(plan):
            if rows is None:
                rows, seconds = _grade_notebook(root, workspace, stem, timeout, env, all_cells, fork)
                done(student, stem, seconds)
            results[i] = rows
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # "spawn": a worker starts as a fresh Python (no state of this process, the same on every OS)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {}
            for i, (student, stem, workspace, rows) in enumerate(plan):
                if rows is None:
                    futures[pool.submit(_grade_notebook, root, workspace, stem, timeout, env, all_cells, fork)] = i
                else:
                    results[i] = rows
            for future in as_completed(futures):
                i = futures[future]
                student, stem, workspace, _ = plan[i]
                try:
                    rows, seconds = future.result()
                except Exception as error:  # noqa: BLE001 - a worker that died: this notebook's points only
                    rows, seconds = [Row(stem, None, ERROR, f"could not run {stem}.ipynb: "
                                                            f"{type(error).__name__}: {_one_line(str(error))}")], None
                done(student, stem, seconds)
                results[i] = rows
    grades.wall = time.perf_counter() - started
    grades.jobs = jobs
    for i, (student, stem, _, _) in enumerate(plan):
        grades.rows += _rows_of(student, results[i], exercises[stem], stem, points)
    return grades


def write_csv(grades: Grades, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(grades.rows)


def summary(grades: Grades) -> str:
    """Each student's total, then how many students passed each exercise."""
    totals: dict[str, list[float]] = {s: [0.0, 0.0, 0, 0] for s in grades.students}
    per_exercise: dict[str, list[int]] = {}
    for row in grades.rows:
        if row["exercise"] == AFTER_CHECKS:
            continue
        total = totals[row["student"]]
        total[0] += float(row["points"])
        total[1] += float(row["max_points"])
        total[2] += row["verdict"] == PASSED
        total[3] += 1
        counts = per_exercise.setdefault(row["exercise"], [0, 0])
        counts[0] += row["verdict"] == PASSED
        counts[1] += 1
    width = max([len("student")] + [len(s) for s in totals])
    lines = [f"{'student':<{width}}  {'points':>13}  {'passed':>8}  time"]
    for student, (got, worth, passed, count) in totals.items():
        share = f"{100 * got / worth:.0f}%" if worth else "-"
        lines.append(f"{student:<{width}}  {_number(got):>5} of {_number(worth):<4} {share:>4}  "
                     f"{passed:>3} of {count:<3}  {grades.seconds.get(student, 0):.0f} s")
    lines += ["", "exercise                                        passed by"]
    for exercise, (passed, count) in per_exercise.items():
        lines.append(f"{_clip(exercise, 46):<46}  {passed:>3} of {count}")
    lines += [""] + [f"⚠ {note}" for note in grades.notes]
    return "\n".join(lines).rstrip() + "\n"


def main(submissions: str, chapters: Iterable[str] = (), output: str = "grades.csv", timeout: float = DEFAULT_TIMEOUT,
         seed: int | None = None, points: Iterable[str] = (), force: bool = False, root: Path | None = None,
         jobs: int | None = None, all_cells: bool = False, fork: bool = True) -> int:
    """The command line: grade, write the CSV, print the summary; progress on stderr."""
    root = root or course_root()
    jobs = default_jobs() if jobs is None else check_jobs(jobs)
    target = Path(output)
    if target.exists() and not force:
        raise GradeError(f"{target} exists and is kept; give another --output, or --force to replace it")
    if target.parent and not target.parent.is_dir():
        raise GradeError(f"{target.parent} is not a folder; --output names the CSV file to write")
    sub = Path(submissions).resolve()
    if sub == target.resolve().parent or sub in target.resolve().parents:
        raise GradeError(f"--output {target} is inside {submissions}; write the grades outside the submissions")
    exercises, _ = course_exercises(root)
    overrides = parse_points(points, exercises)

    def say(student: str, name: str, seconds: float) -> None:
        print(f"  {student}: ran {name} in {seconds:.1f} s", file=sys.stderr, flush=True)

    grades = grade(Path(submissions), root, timeout=timeout, chapters=chapters, seed=seed, points=overrides,
                   on_notebook=say, jobs=jobs, all_cells=all_cells, fork=fork)
    write_csv(grades, target)
    print(summary(grades), end="")
    print(f"\nWrote {target} ({len(grades.rows)} rows, {len(grades.students)} students)"
          + (f"; checks ran on hidden inputs (seed {seed})." if seed is not None else "."))
    print(f"Graded in {grades.wall:.0f} s, {jobs} notebook{'s' if jobs > 1 else ''} at a time.")
    return 0
