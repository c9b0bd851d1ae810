"""The course's table of exercises, read from the generated ``exercises/NN_*.ipynb``.

Each ``### Exercise N.M · Title`` heading of a notebook starts an exercise; the ``check_*``
functions called in the code cells below it, up to the next heading, are its checks.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXERCISE_HEADING", "POINTS", "TITLE_HEADING", "Exercise", "check_calls", "course_exercises",
           "exercises_in", "notebook_title", "points_after"]

EXERCISE_HEADING = re.compile(r"^#{1,6}\s*Exercise\s+(\d+\.\d+)\s*[·:.-]\s*(.+?)\s*$", re.M)
TITLE_HEADING = re.compile(r"^#\s+(.+?)\s*$", re.M)
# An exercise's points for the graders (INSTRUCTORS.md), an HTML comment in the markdown under its heading,
# in solutions/ (and so in exercises/): ``<!-- points: 2 -->``. Without one an exercise is worth 1 point.
POINTS = re.compile(r"<!--\s*points:\s*(\d+(?:\.\d+)?)\s*-->", re.I)


@dataclass(frozen=True)
class Exercise:
    """One exercise of the course, as its notebook in ``exercises/`` introduces it."""

    chapter: str  # the notebook's stem: "01_dot_product_attention"
    number: str  # "1.2"
    title: str  # "A causal mask"
    checks: tuple[str, ...]  # the check functions called under its heading
    points: float = 1.0  # what it is worth to a grader (``<!-- points: N -->`` under its heading)


def _source(cell: dict) -> str:
    """A cell's source as one string (nbformat stores it as a string or a list of lines)."""
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


def points_after(text: str, start: int) -> float:
    """The points stated between ``text[start:]`` and the next exercise heading (1 when none is)."""
    following = EXERCISE_HEADING.search(text, start)
    match = POINTS.search(text, start, following.start() if following else len(text))
    return float(match.group(1)) if match else 1.0


def course_exercises(root: Path) -> tuple[dict[str, list[Exercise]], dict[str, str]]:
    """``({chapter stem: [Exercise, ...]}, {chapter stem: title})`` from ``exercises/NN_*.ipynb``."""
    exercises: dict[str, list[Exercise]] = {}
    titles: dict[str, str] = {}
    for path in sorted((root / "exercises").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        titles[path.stem] = notebook_title(cells, path.stem[3:].replace("_", " "))
        exercises[path.stem] = exercises_in(cells, path.stem)
    return exercises, titles


def exercises_in(cells: Iterable[dict], chapter: str) -> list[Exercise]:
    """The exercises of one notebook's cells: each heading, the checks called below it, its points."""
    found: list[list] = []  # [number, title, [checks], points]
    for cell in cells:
        if cell["cell_type"] == "markdown":
            text = _source(cell)
            found += [[m.group(1), m.group(2), [], points_after(text, m.end())]
                      for m in EXERCISE_HEADING.finditer(text)]
        elif cell["cell_type"] == "code" and found:
            found[-1][2].extend(check_calls(_source(cell)))
    return [Exercise(chapter, n, t.replace("`", ""), tuple(dict.fromkeys(c)), p) for n, t, c, p in found]
