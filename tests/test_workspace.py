"""``make exercise N=NN``: a quick copy, a clean refusal, and a notebook Jupyter would write.

(``tests/test_exercises.py`` covers ``python -m mha_course start/list`` themselves.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mha_course import workspace

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


@pytest.fixture
def course(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    return tmp_path


def make_exercise(course: Path, n: str) -> subprocess.CompletedProcess:
    """`make exercise N=n` as a learner runs it, on the course copy (never rebuilding .venv)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["MHA_COURSE_ROOT"] = str(course)
    return subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "exercise", f"N={n}",
                           f"PY={sys.executable}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_make_exercise_copies_then_refuses_cleanly(course):
    first = make_exercise(course, "01")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("Created workspace/01_dot_product_attention.ipynb"), first.stdout
    copy = course / "workspace" / "01_dot_product_attention.ipynb"
    copy.write_text(copy.read_text().replace("Exercise 1.1", "Exercise 1.1 (my notes)"))

    again = make_exercise(course, "01")
    assert again.returncode == 0, "a copy that exists is kept: make must not report a failure"
    assert again.stdout.startswith("You already have workspace/01_dot_product_attention.ipynb: your work is kept")
    assert "Error" not in again.stdout + again.stderr and "***" not in again.stderr, again.stderr
    assert "(my notes)" in copy.read_text()

    wrong = make_exercise(course, "42")
    assert wrong.returncode != 0, "an exercise that doesn't exist is an error"
    assert "error: no exercise '42'; available: 01_dot_product_attention" in wrong.stderr


def test_the_copy_is_what_nbformat_writes_without_outputs(course):
    target = workspace.start("03", root=course)
    expected = nbformat.read(ROOT / "exercises" / target.name, as_version=4)
    for cell in expected.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    expected.metadata.pop("jupytext", None)
    assert target.read_text(encoding="utf-8") == nbformat.writes(expected) + "\n"
    nbformat.validate(nbformat.read(target, as_version=4))
    assert "make progress" in (course / "workspace" / "README.md").read_text()
