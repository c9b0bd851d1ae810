"""The exercises as assignments for nbgrader and Otter: ``python -m mha_course export nbgrader|otter DIR``.

One assignment per chapter, from ``solutions/NN_name.py`` (the exercises' single source), through
the same transformation that writes ``exercises/`` (``tools/make_exercises.py``: the solutions'
discussions left out, the learner's instructions shown), except that the code between
``# BEGIN SOLUTION`` and ``# END SOLUTION`` stays, marked for the tool:

- **nbgrader** (``DIR/source/<chapter>/<chapter>.ipynb`` and ``DIR/nbgrader_config.py``): the code
  cells that hold a solution are "autograded answer" cells (``### BEGIN SOLUTION`` /
  ``### END SOLUTION``); each check cell becomes a locked "autograder tests" cell worth its
  exercise's points, ``assert check_x(f)`` (the learner's check, visible), then the same check
  under ``### BEGIN HIDDEN TESTS`` on hidden inputs (:func:`mha_lib.checks.hidden_cases`).
- **Otter** (``DIR/<chapter>/<chapter>.ipynb``, Otter Assign's notebook format): each exercise
  a question (``# BEGIN QUESTION`` raw cells, ``name`` and ``points``), its solution cells in a
  solution block, its check cells in a tests block, each followed by a ``# HIDDEN`` test on
  hidden inputs.

An exercise's points: ``--points N.M=P``, else ``<!-- points: P -->`` under its heading in
``solutions/``, else 1 (an exercise with two check cells: half on each). The hidden tests' seed is
``--seed``, else a new random one; it is written only into the instructor's files (the source
notebooks, the autograder), never into what the students get.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import secrets
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .grade import GradeError, parse_points
from .progress.exercises import Exercise, check_calls, exercises_in
from .progress.runner import assign_cells
from .workspace import WorkspaceError, course_root

__all__ = ["ExportError", "export", "main"]

TOOLS = ("nbgrader", "otter")
_INDENTED_BEGIN = re.compile(r"^(\s+)# BEGIN SOLUTION\s*$")
_INDENTED_END = re.compile(r"^(\s+)# END SOLUTION\s*$")


class ExportError(WorkspaceError):
    """An export that can't be written as asked; the message says why."""


def _make_exercises(root: Path) -> Any:
    """``tools/make_exercises.py`` of the course, as a module (a script, not a package)."""
    path = root / "tools" / "make_exercises.py"
    spec = importlib.util.spec_from_file_location("mha_course_make_exercises", path)
    if spec is None or spec.loader is None:
        raise ExportError(f"can't load {path}; the export needs the course's tools/ folder")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instructor_notebook(solution: Path, make_exercises: Any) -> Any:
    """The chapter's notebook as the exercise shows it, but with the solutions of its functions
    kept between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (an open task at the top level
    of a cell, which no check grades, is left as the exercise has it)."""
    import jupytext

    lines = []
    for line in solution.read_text(encoding="utf-8").splitlines():
        begin, end = _INDENTED_BEGIN.match(line), _INDENTED_END.match(line)
        line = f"{begin.group(1)}### BEGIN SOLUTION" if begin else f"{end.group(1)}### END SOLUTION" if end else line
        lines.append(line)
    text = make_exercises.make_exercise("\n".join(lines) + "\n", solution.name)
    nb = jupytext.reads(text, fmt="py:percent")
    nb.metadata.pop("jupytext", None)
    nb.metadata.setdefault("kernelspec", {"display_name": "Python 3 (ipykernel)", "language": "python",
                                          "name": "python3"})
    nb.metadata.setdefault("language_info", {"name": "python"})
    return nb


def _asserted(code: str) -> str:
    """``check_x(f)`` statements made ``assert check_x(f)`` (a failed check then raises, with its hint)."""
    tree = ast.parse(code)
    lines = code.splitlines()
    for node in reversed(tree.body):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and check_calls(ast.unparse(node))):
            line = lines[node.lineno - 1]
            lines[node.lineno - 1] = line[:node.col_offset] + "assert " + line[node.col_offset:]
    return "\n".join(lines)


def _hidden(code: str, seed: int) -> str:
    """The same checks on hidden inputs."""
    body = "\n".join("    " + line for line in _asserted(code).splitlines())
    return f"from mha_lib.checks import hidden_cases\nwith hidden_cases({seed}):\n{body}"


def _cell_id(number: str) -> str:
    return "ex" + number.replace(".", "_")


def _plan(nb: Any, exercises: list[Exercise]) -> tuple[list[Exercise | None], dict[str, int]]:
    """Each cell's exercise, and how many check cells each exercise has."""
    owners = assign_cells(nb.cells, exercises)
    tests: dict[str, int] = {}
    for cell, owner in zip(nb.cells, owners):
        if owner and _is_test(cell):
            tests[owner.number] = tests.get(owner.number, 0) + 1
    return owners, tests


def _is_test(cell: Any) -> bool:
    return cell.cell_type == "code" and bool(check_calls(cell.source)) and not re.search(
        r"^\s*(from|import)\s", cell.source, re.M)


def _nbgrader(nb: Any, exercises: list[Exercise], points: dict[str, float], seed: int) -> Any:
    owners, tests = _plan(nb, exercises)
    counters: dict[str, int] = {}
    for cell, owner in zip(nb.cells, owners):
        if cell.cell_type != "code" or owner is None:
            continue
        k = counters[owner.number] = counters.get(owner.number, 0) + 1
        meta: dict[str, Any] = {"schema_version": 3, "task": False}
        if "### BEGIN SOLUTION" in cell.source:
            meta.update(grade=False, solution=True, locked=False, grade_id=f"{_cell_id(owner.number)}_answer{k}")
        elif _is_test(cell):
            worth = points.get(owner.number, owner.points) / tests[owner.number]
            cell.source = (f"{_asserted(cell.source)}\n### BEGIN HIDDEN TESTS\n{_hidden(cell.source, seed)}\n"
                           "### END HIDDEN TESTS")
            meta.update(grade=True, solution=False, locked=True, points=worth,
                        grade_id=f"{_cell_id(owner.number)}_tests{k}")
        else:
            continue
        cell.metadata["nbgrader"] = meta
    return nb


def _raw(text: str) -> Any:
    import nbformat

    return nbformat.v4.new_raw_cell(text)


def _otter(nb: Any, exercises: list[Exercise], points: dict[str, float], seed: int, name: str) -> Any:
    import nbformat

    owners, tests = _plan(nb, exercises)
    config = (f"# ASSIGNMENT CONFIG\nname: {name}\nrequirements: null\nrun_tests: false\ninit_cell: true\n"
              "check_all_cell: false\nexport_cell: false\nsolutions_pdf: false\ntemplate_pdf: false\n"
              "show_question_points: true\ntests:\n  files: false\n  ok_format: true")
    cells = [_raw(config)]
    last = {owner.number: i for i, owner in enumerate(owners) if owner}
    first = {}
    for i, owner in enumerate(owners):
        if owner:
            first.setdefault(owner.number, i)
    for i, (cell, owner) in enumerate(zip(nb.cells, owners)):
        cell = nbformat.from_dict(dict(cell))
        if owner and first[owner.number] == i:
            worth = points.get(owner.number, owner.points)
            cells.append(_raw(f"# BEGIN QUESTION\nname: {_cell_id(owner.number)}\npoints: {worth:g}"))
        if owner and cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            cell.source = cell.source.replace("### BEGIN SOLUTION", "# BEGIN SOLUTION").replace(
                "### END SOLUTION", "# END SOLUTION")
            cells += [_raw("# BEGIN SOLUTION"), cell, _raw("# END SOLUTION")]
        elif owner and _is_test(cell):
            hidden = nbformat.v4.new_code_cell(f"# HIDDEN\n{_hidden(cell.source, seed)}")
            cell.source = _asserted(cell.source)
            cells += [_raw("# BEGIN TESTS"), cell, hidden, _raw("# END TESTS")]
        else:
            cells.append(cell)
        if owner and last[owner.number] == i:
            if not tests.get(owner.number):
                raise ExportError(f"exercise {owner.number} has no check cell: Otter needs a test for it")
            cells.append(_raw("# END QUESTION"))
    nb.cells = cells
    return nb


def _check_target(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise ExportError(f"{directory} is a file; give a new folder (or an empty one) to export into")
    if directory.is_dir() and any(directory.iterdir()):
        raise ExportError(f"{directory} is not empty, and nothing in it is overwritten; give a new folder "
                          "(or an empty one)")


NBGRADER_CONFIG = '''"""nbgrader's configuration for the course's exercises, written by `python -m mha_course export nbgrader`."""

c = get_config()  # noqa: F821 - nbgrader defines it

c.CourseDirectory.course_id = "mha_course"
# One assignment per chapter: {assignments}
# Seconds a cell may run while autograding (make progress allows a notebook {timeout} s in all).
c.ExecutePreprocessor.timeout = {timeout}
# What a student's answer cell holds before they write it (the course's own stub).
c.ClearSolutions.code_stub = {{"python": "raise NotImplementedError  # your code here"}}
'''

README = """# The course's exercises for {tool}

Written by `python -m mha_course export {tool}` from the course's solutions/ (chapters {chapters}).
This folder holds the solutions and the hidden tests (seed {seed}): keep it from the students.
How to use it: INSTRUCTORS.md of the course.
"""


def export(tool: str, directory: Path, root: Path | None = None, chapters: Iterable[str] = (),
           seed: int | None = None, points: dict[str, float] | None = None) -> list[Path]:
    """Write the assignments; returns the notebooks written. Refuses a folder that holds anything."""
    if tool not in TOOLS:
        raise ExportError(f"no export for {tool!r}; choose one of {', '.join(TOOLS)}")
    root = root or course_root()
    directory = Path(directory)
    _check_target(directory)
    sources = {p.stem: p for p in sorted((root / "solutions").glob("[0-9][0-9]_*.py"))}
    if not sources:
        raise ExportError(f"no solutions/NN_name.py in {root}: the export is made from solutions/ (is this a "
                          "students' copy of the course?)")
    wanted = {c.strip()[:2] if c.strip()[:2].isdigit() else c.strip() for c in chapters}
    unknown = [c for c in wanted if not any(s[:2] == c or s == c for s in sources)]
    if unknown:
        raise ExportError(f"no chapter {', '.join(sorted(unknown))}; the course's: {', '.join(sources)}")
    stems = [s for s in sources if not wanted or s[:2] in wanted or s in wanted]
    seed = secrets.randbelow(2**31) if seed is None else seed
    points = points or {}
    make_exercises = _make_exercises(root)
    import nbformat

    notebooks = []
    for stem in stems:
        nb = instructor_notebook(sources[stem], make_exercises)
        exercises = exercises_in(nb.cells, stem)
        if tool == "nbgrader":
            nb = _nbgrader(nb, exercises, points, seed)
            target = directory / "source" / stem / f"{stem}.ipynb"
        else:
            nb = _otter(nb, exercises, points, seed, stem)
            target = directory / stem / f"{stem}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.validate(nb)
        nbformat.write(nb, str(target))
        notebooks.append(target)
    if tool == "nbgrader":
        from .progress.runner import DEFAULT_TIMEOUT

        listing = ", ".join(f"source/{s}/{s}.ipynb" for s in stems)
        (directory / "nbgrader_config.py").write_text(
            NBGRADER_CONFIG.format(assignments=listing, timeout=DEFAULT_TIMEOUT), encoding="utf-8")
    (directory / "README.md").write_text(README.format(tool=tool, chapters=", ".join(s[:2] for s in stems),
                                                       seed=seed), encoding="utf-8")
    return notebooks


def main(tool: str, directory: str, chapters: Iterable[str] = (), seed: int | None = None,
         points: Iterable[str] = (), root: Path | None = None) -> int:
    root = root or course_root()
    from .progress.exercises import course_exercises

    exercises, _ = course_exercises(root)
    try:
        overrides = parse_points(points, exercises)
    except GradeError as error:
        raise ExportError(str(error)) from None
    seed = secrets.randbelow(2**31) if seed is None else seed
    written = export(tool, Path(directory), root, chapters, seed, overrides)
    for path in written:
        print(f"wrote {path}")
    if tool == "nbgrader":
        print(f"\nThen, in {directory}: nbgrader generate_assignment {written[0].parent.name}  (see INSTRUCTORS.md)")
    else:
        print(f"\nThen, in {written[0].parent}: otter assign {written[0].name} dist  (see INSTRUCTORS.md)")
    print(f"The hidden tests use seed {seed}; {directory} holds the solutions: keep it from the students.",
          file=sys.stderr)
    return 0
