"""Generate exercises/NN_name.py from solutions/NN_name.py, the exercises' single source.

    python tools/make_exercises.py          # write every exercise script
    python tools/make_exercises.py --check  # exit 1 if one is out of date

Markers in a solution (py:percent) script:

- code: the lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` become
  ``raise NotImplementedError  # your code here`` at the marker's indentation (inside a
  function or class); at the top level of a cell (an open task without a check, whose
  results no later cell uses) they become the comment ``# your code here``, so that
  the untouched exercise still runs top to bottom;
- markdown: the lines between ``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->``
  are left out (notes for the solutions only);
- markdown: the lines between ``<!-- BEGIN ANSWER -->`` and ``<!-- END ANSWER -->`` (a
  written answer) become an invitation to write one's own;
- markdown: the lines between ``<!-- EXERCISE ONLY`` and ``-->`` are an HTML comment, so the
  solution notebook doesn't show them; the exercise does (instructions, "Done?");
- the title ``# Solutions · Chapter NN ...`` becomes ``# Exercises · Chapter NN ...``;
- a cell whose first line is ``# SOLUTION ONLY`` is left out.

The generated script is then built into ``exercises/NN_name.ipynb`` by
``tools/build_notebooks.py`` (``make notebooks`` runs both).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import jupytext
from jupytext.config import load_jupytext_config

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"

STUB = "raise NotImplementedError  # your code here"
TOP_LEVEL_STUB = "# your code here"
ANSWER = "# *Your answer here (double-click this cell to edit it).*"
_CODE_BEGIN = re.compile(r"^(\s*)# BEGIN SOLUTION\s*$")
_CODE_END = re.compile(r"^\s*# END SOLUTION\s*$")
_MD = re.compile(r"^#\s*<!-- (BEGIN|END) (SOLUTION|ANSWER) -->\s*$")
_EXERCISE_BEGIN = re.compile(r"^#\s*<!-- EXERCISE ONLY\s*$")
_EXERCISE_END = re.compile(r"^#\s*-->\s*$")
_TITLE = re.compile(r"^# # Solutions · ")


class MarkerError(ValueError):
    """A solution script whose markers don't pair up."""


def _drop_solution_cells(lines: list[str]) -> list[str]:
    kept: list[str] = []
    skipping = False
    for i, line in enumerate(lines):
        if line.startswith("# %%"):
            skipping = i + 1 < len(lines) and lines[i + 1].strip() == "# SOLUTION ONLY"
        if not skipping:
            kept.append(line)
    return kept


def _drop_empty_markdown(lines: list[str]) -> list[str]:
    """Leave out the markdown cells that hold nothing once the solution's blocks are removed (a discussion
    cell that was all ``<!-- BEGIN SOLUTION -->`` ... ``<!-- END SOLUTION -->``)."""
    kept: list[str] = []
    cell: list[str] = []

    def flush() -> None:
        if cell and cell[0].startswith("# %% [markdown]") and all(line.strip() in ("", "#") for line in cell[1:]):
            return
        kept.extend(cell)

    for line in lines:
        if line.startswith("# %%"):
            flush()
            cell = []
        cell.append(line)
    flush()
    return kept


def make_exercise(solution: str, name: str = "solution") -> str:
    """The exercise script for one solution script (py:percent text)."""
    out: list[str] = []
    open_marker: tuple[str, int] | None = None  # (kind, line number)
    for number, line in enumerate(_drop_solution_cells(solution.splitlines()), start=1):
        begin, md = _CODE_BEGIN.match(line), _MD.match(line)
        if open_marker and open_marker[0] == "EXERCISE":
            if _EXERCISE_END.match(line):
                open_marker = None
            else:
                out.append(line)
        elif _EXERCISE_BEGIN.match(line):
            if open_marker:
                raise MarkerError(f"{name}:{number}: <!-- EXERCISE ONLY inside an open {open_marker[0]} block")
            open_marker = ("EXERCISE", number)
        elif _TITLE.match(line):
            out.append(_TITLE.sub("# # Exercises · ", line))
        elif begin:
            if open_marker:
                raise MarkerError(f"{name}:{number}: BEGIN SOLUTION inside an open {open_marker[0]} block")
            open_marker = ("code", number)
            indent = begin.group(1)
            out.append(indent + STUB if indent else TOP_LEVEL_STUB)
        elif _CODE_END.match(line):
            if not open_marker or open_marker[0] != "code":
                raise MarkerError(f"{name}:{number}: END SOLUTION without a BEGIN SOLUTION")
            open_marker = None
        elif md:
            which, kind = md.groups()
            if which == "BEGIN":
                if open_marker:
                    raise MarkerError(f"{name}:{number}: <!-- BEGIN {kind} --> inside an open {open_marker[0]} block")
                open_marker = (kind, number)
                if kind == "ANSWER":
                    out.append(ANSWER)
            else:
                if not open_marker or open_marker[0] != kind:
                    raise MarkerError(f"{name}:{number}: <!-- END {kind} --> without its BEGIN")
                open_marker = None
        elif not open_marker:
            out.append(line)
    if open_marker:
        raise MarkerError(f"{name}:{open_marker[1]}: {open_marker[0]} block never closed")
    tidy: list[str] = []  # removed blocks can leave blank markdown lines ("#") doubled or leading
    for line in out:
        if line == "#" and tidy and (tidy[-1] == "#" or tidy[-1].startswith("# %% [markdown]")):
            continue
        tidy.append(line)
    tidy = _drop_empty_markdown(tidy)
    text = "\n".join(tidy) + "\n"
    # Normalise through jupytext, as building the notebook will.
    config = load_jupytext_config(str(EXERCISES))
    return jupytext.writes(jupytext.reads(text, fmt="py:percent"), fmt="py:percent", config=config)


def pairs() -> list[tuple[Path, Path]]:
    return [(s, EXERCISES / s.name) for s in sorted(SOLUTIONS.glob("[0-9][0-9]_*.py"))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report exercises that are out of date")
    args = parser.parse_args()
    stale = []
    for solution, exercise in pairs():
        text = make_exercise(solution.read_text(), solution.name)
        if exercise.exists() and exercise.read_text() == text:
            continue
        stale.append(exercise)
        if not args.check:
            exercise.write_text(text)
            print(f"wrote {exercise.relative_to(ROOT)}")
    if args.check and stale:
        print("out of date (run `make notebooks`):", *(str(p.relative_to(ROOT)) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
