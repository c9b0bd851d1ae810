"""The exercise system: one source (solutions/), generated exercises, committed verdicts,
and a workspace that never overwrites a learner's work."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from mha_course import workspace
from mha_course.__main__ import main as cli

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from make_exercises import MarkerError, make_exercise, pairs  # noqa: E402

SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))


def ids(paths):
    return [p.stem for p in paths]


def check_outputs(path: Path) -> list[str]:
    """The text each check cell displayed (cells whose code calls check_...)."""
    texts = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith("check_"):
            shown = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]  # display_data: verdicts
            texts.append(shown[0].data["text/plain"] if shown else "")
    return texts


def test_every_solution_has_its_exercise():
    assert [p.name for p in SOLUTIONS] == [p.name for p in EXERCISES]
    assert len(SOLUTIONS) >= 5


@pytest.mark.parametrize(("solution", "exercise"), pairs(), ids=lambda p: p.stem)
def test_exercises_are_generated_from_the_solutions(solution: Path, exercise: Path):
    assert exercise.exists(), f"{exercise.name} is missing: run `make notebooks`"
    assert exercise.read_text() == make_exercise(solution.read_text(), solution.name), (
        f"exercises/{exercise.name} is out of date with solutions/{solution.name}: run `make notebooks`"
    )


@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_exercises_hold_no_solutions(path: Path):
    text = path.with_suffix(".py").read_text()
    assert "SOLUTION" not in text and "Worked solutions" not in text and "**Discussion.**" not in text
    assert "raise NotImplementedError  # your code here" in text


@pytest.mark.parametrize("path", SOLUTIONS, ids=ids(SOLUTIONS))
def test_solutions_pass_every_check(path: Path):
    verdicts = check_outputs(path)
    assert len(verdicts) >= 2, f"{path.name} has fewer than two checks"
    for verdict in verdicts:
        assert verdict.startswith("✅"), f"{path.name}: a committed check did not pass:\n{verdict}"


@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_untouched_exercises_read_not_implemented(path: Path):
    verdicts = check_outputs(path)
    assert len(verdicts) >= 2
    for verdict in verdicts:
        assert verdict.startswith("⏳") and "not implemented yet" in verdict, f"{path.name}:\n{verdict}"


@pytest.mark.parametrize("path", EXERCISES, ids=ids(EXERCISES))
def test_chapters_link_to_their_exercises(path: Path):
    chapter = ROOT / "chapters" / path.with_suffix(".py").name
    assert chapter.exists(), f"exercises/{path.name} has no chapter"
    assert f"exercises/{path.name}" in chapter.read_text(), f"{chapter.name} doesn't point to its exercises"


def test_generator_replaces_code_drops_notes_and_keeps_answers_open():
    solution = "\n".join([
        "# %% [markdown]",
        "# # Solutions · Chapter 09 · Test",
        "# <!-- EXERCISE ONLY",
        "# Fill in the code.",
        "# -->",
        "# Intro",
        "# <!-- BEGIN SOLUTION -->",
        "# Only in the solutions.",
        "# <!-- END SOLUTION -->",
        "# <!-- BEGIN ANSWER -->",
        "# The model answer.",
        "# <!-- END ANSWER -->",
        "",
        "# %%",
        "def f(x):",
        "    # BEGIN SOLUTION",
        "    return 2 * x",
        "    # END SOLUTION",
        "",
        "# %%",
        "# SOLUTION ONLY",
        "print(f(1))",
        "",
        "# %%",
        "# BEGIN SOLUTION",
        "print(f(2))",
        "# END SOLUTION",
        "",
    ])
    exercise = make_exercise(solution)
    assert "Intro" in exercise and "Only in the solutions" not in exercise and "model answer" not in exercise
    assert "# # Exercises · Chapter 09 · Test\n# Fill in the code.\n# Intro" in exercise  # no markers left
    assert "EXERCISE ONLY" not in exercise and "-->" not in exercise
    assert "*Your answer here" in exercise
    assert "    raise NotImplementedError  # your code here" in exercise and "2 * x" not in exercise
    assert "print(f(1))" not in exercise
    assert "print(f(2))" not in exercise and "\n# your code here\n" in exercise  # an open task: no raise


@pytest.mark.parametrize("lines", [
    ["# %%", "    # BEGIN SOLUTION", "x = 1"],
    ["# %%", "x = 1", "    # END SOLUTION"],
    ["# %% [markdown]", "# <!-- BEGIN SOLUTION -->", "# <!-- END ANSWER -->"],
    ["# %% [markdown]", "# <!-- EXERCISE ONLY", "# text"],
])
def test_generator_refuses_unbalanced_markers(lines):
    with pytest.raises(MarkerError):
        make_exercise("\n".join(lines) + "\n")


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A copy of the course's exercises in a temporary root."""
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    monkeypatch.setenv("MHA_COURSE_ROOT", str(tmp_path))
    return tmp_path


def test_start_copies_once_and_never_overwrites(course, capsys):
    assert cli(["start", "1"]) == 0
    copy = course / "workspace" / "01_dot_product_attention.ipynb"
    assert copy.exists() and "Created workspace/01_dot_product_attention.ipynb" in capsys.readouterr().out
    nb = nbformat.read(copy, as_version=4)
    assert all(not c.outputs for c in nb.cells if c.cell_type == "code")  # a fresh start
    assert (course / "workspace" / "jupytext.toml").exists()

    copy.write_text(copy.read_text().replace("Exercise 1.1", "Exercise 1.1 (my notes)"))
    assert cli(["start", "01_dot_product_attention"]) == 3  # kept: not an error (make exercise succeeds)
    out = capsys.readouterr().out
    assert "You already have workspace/01_dot_product_attention.ipynb: your work is kept" in out
    assert "mv workspace/01_dot_product_attention.ipynb" in out
    assert "(my notes)" in copy.read_text()


def test_list_and_unknown_exercise(course, capsys):
    assert cli(["start", "02"]) == 0
    capsys.readouterr()
    assert cli(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("started") and line.endswith("02_self_attention_one_head") for line in lines)
    assert any(not line.startswith("started") and line.endswith("01_dot_product_attention") for line in lines)
    assert cli(["start", "42"]) == 1
    assert "no exercise '42'; available: 01_dot_product_attention" in capsys.readouterr().err


def test_course_root_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MHA_COURSE_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(workspace, "__file__", str(tmp_path / "mha_course" / "workspace.py"))
    with pytest.raises(workspace.WorkspaceError, match="can't find the course's exercises/ folder"):
        workspace.course_root()


def test_the_exercises_readme_updates_as_the_readme_says():
    """Issue 34: exercises/README.md said `git pull` and `git stash` where the README says `make update`
    (a plain pull stops on notebooks that were run; make update saves the learner's edits first)."""
    text = (ROOT / "exercises" / "README.md").read_text(encoding="utf-8")
    assert "make update" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make update" in text and "make progress" in text and "workspace/saved/" in text
    assert "git stash" not in text and "Updating the course (`git pull`)" not in text
