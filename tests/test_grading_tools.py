"""The exports graded by the tools themselves (INSTRUCTORS.md), on one short chapter.

nbgrader (``generate_assignment``, then ``autograde`` and ``generate_feedback``) and Otter (``otter
assign``, then ``otter run``, no Docker), each on three submissions: the worked solutions (full
points), the untouched student notebook (0, without crashing), and the solutions with one planted
mistake (only that exercise loses its points, and the feedback shows the check's hint). Both tools
come with requirements-dev.txt, which `make test` installs; without one, its test is skipped and
says so. The hidden tests' seed never reaches what the students get.
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mha_course.export import ExportError, export
from mha_lib.checks import check_self_attention

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = "02_self_attention_one_head"
SEED = 424242
BIN = Path(sys.executable).parent


def _needs(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None,
                              reason=f"{module} is not installed: requirements-dev.txt has it (`make setup`)")


def _tool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("MHA_CHECK_RAISE", None)
    run = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, f"{' '.join(args)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run


def _plant(source: str) -> str:
    """One mistake in exercise 2.1: the scores divided by d_k instead of its square root."""
    planted = source.replace("/ math.sqrt(q.size(-1))", "/ q.size(-1)")
    assert planted != source
    return planted


def _with_mistake(path: Path, target: Path) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "def self_attention(" in "".join(cell["source"]):
            cell["source"] = _plant("".join(cell["source"]))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(nb), encoding="utf-8")


def _expected_hint() -> str:
    """What check 2.1 says about the planted mistake, in plain text (as the feedback shows it)."""

    def self_attention(x, W_q, W_k, W_v):
        q, k, v = x @ W_q, x @ W_k, x @ W_v
        weights = (q @ k.transpose(-2, -1) / q.size(-1)).softmax(-1)
        return weights @ v, weights

    result = check_self_attention(self_attention)
    assert result.status == "failed" and result.hint, result
    assert math  # the solution's module imports math: the planted line no longer uses it
    return result.hint.replace("`", "")


def _plain(text: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", text)).replace("`", "").split())


def test_an_export_refuses_a_folder_that_holds_anything(tmp_path):
    (tmp_path / "mine.txt").write_text("the instructor's")
    with pytest.raises(ExportError, match="not empty"):
        export("nbgrader", tmp_path, ROOT, [CHAPTER])
    with pytest.raises(ExportError, match="no chapter 99"):
        export("otter", tmp_path / "new", ROOT, ["99"])
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


@_needs("nbgrader")
def test_nbgrader_grades_the_export(tmp_path):
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    export("nbgrader", course, ROOT, [CHAPTER], seed=SEED)
    _tool("nbgrader", "generate_assignment", CHAPTER, "--force", cwd=course)
    source = course / "source" / CHAPTER / f"{CHAPTER}.ipynb"
    release = course / "release" / CHAPTER / f"{CHAPTER}.ipynb"
    student = release.read_text(encoding="utf-8")
    assert str(SEED) not in student and "hidden_cases" not in student and "math.sqrt(q.size(-1))" not in student
    assert "assert check_self_attention(self_attention)" in student
    for who, notebook in (("solved", source), ("stub", release)):
        target = course / "submitted" / who / CHAPTER / f"{CHAPTER}.ipynb"
        target.parent.mkdir(parents=True)
        shutil.copy(notebook, target)
    _with_mistake(source, course / "submitted" / "planted" / CHAPTER / f"{CHAPTER}.ipynb")
    _tool("nbgrader", "autograde", CHAPTER, "--create", "--force", cwd=course)
    _tool("nbgrader", "generate_feedback", CHAPTER, "--force", cwd=course)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {}
        for who in ("solved", "stub", "planted"):
            submission = gradebook.find_submission_notebook(CHAPTER, CHAPTER, who)
            scores[who] = ({g.name: g.score for g in submission.grades}, submission.max_score)
    solved, worth = scores["solved"]
    assert worth >= 2 and sum(solved.values()) == worth, solved
    assert sum(scores["stub"][0].values()) == 0, scores["stub"]
    planted = scores["planted"][0]
    assert planted == {name: (0 if name.startswith("ex2_1_") else score) for name, score in solved.items()}
    assert planted["ex2_1_tests2"] == 0 and sum(planted.values()) == worth - 1
    feedback = (course / "feedback" / "planted" / CHAPTER / f"{CHAPTER}.html").read_text(encoding="utf-8")
    assert _expected_hint() in _plain(feedback)


@_needs("otter")
def test_otter_grades_the_export(tmp_path):
    course = tmp_path / "course"
    export("otter", course, ROOT, [CHAPTER], seed=SEED)
    folder = course / CHAPTER
    _tool("otter", "assign", f"{CHAPTER}.ipynb", "dist", cwd=folder)
    student = folder / "dist" / "student" / f"{CHAPTER}.ipynb"
    solved = folder / "dist" / "autograder" / f"{CHAPTER}.ipynb"
    zips = list((folder / "dist" / "autograder").glob("*.zip"))
    assert len(zips) == 1, list((folder / "dist" / "autograder").iterdir())
    text = student.read_text(encoding="utf-8")
    assert str(SEED) not in text and "hidden_cases" not in text and "math.sqrt(q.size(-1))" not in text
    _with_mistake(solved, tmp_path / "planted" / f"{CHAPTER}.ipynb")
    results = {}
    for who, notebook in (("solved", solved), ("stub", student), ("planted", tmp_path / "planted" / f"{CHAPTER}.ipynb")):
        out = tmp_path / "results" / who
        out.mkdir(parents=True)
        run = _tool("otter", "run", "-a", str(zips[0]), "-o", str(out), str(notebook), cwd=tmp_path)
        data = json.loads((out / "results.json").read_text(encoding="utf-8"))
        results[who] = (_questions(data), _messages(data) + run.stdout)
    solved_scores = results["solved"][0]
    assert solved_scores and all(score == possible for score, possible in solved_scores.values()), solved_scores
    assert all(score == 0 for score, _ in results["stub"][0].values()), results["stub"][0]
    planted = results["planted"][0]
    assert planted == {q: ((0, p) if q == "ex2_1" else (s, p)) for q, (s, p) in solved_scores.items()}, planted
    assert _expected_hint() in _plain(results["planted"][1]), results["planted"][1][-3000:]


def _questions(data: dict) -> dict[str, tuple[float, float]]:
    """Otter's results.json (Gradescope's format): per question, (score, max_score)."""
    return {t["name"]: (t["score"], t["max_score"]) for t in data["tests"] if t.get("score") is not None}


def _messages(data: dict) -> str:
    return "\n".join(t.get("output", "") for t in data["tests"])
