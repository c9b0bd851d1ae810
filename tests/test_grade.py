"""``python -m mha_course grade SUBMISSIONS/``: a class's workspaces graded into a CSV (INSTRUCTORS.md).

Three synthetic students on chapters 01 and 02 (few kernels: each start costs seconds), made from
solutions/ and exercises/: complete (the solutions), partial (one planted mistake, one stub, and
chapter 01's exercises saved as 02), broken (01 not valid JSON, 02 raising at its top, and another
course's notebook). Then a notebook that loops (a tiny course, no PyTorch), the points, the bad
input an instructor may give, and the hidden inputs of the checks (``MHA_CHECK_SEED``).
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mha_course import grade as grading
from mha_course.progress import course_exercises
from mha_lib.checks import check_attention_scores, check_causal_mask, hidden_cases
from mha_lib.checks._core import case_seed, gen

ROOT = Path(__file__).resolve().parent.parent
CH1, CH2 = "01_dot_product_attention", "02_self_attention_one_head"


def _notebook(path: Path, change=lambda code: code) -> dict:
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["source"] = change("".join(cell["source"]))
            cell["outputs"], cell["execution_count"] = [], None
    return nb


def _write(path: Path, nb: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")


def _plant(code: str) -> str:
    """Chapter 01's solutions with a wrong causal mask (the upper triangle) and padding_mask a stub."""
    code = code.replace("dtype=torch.bool).tril()", "dtype=torch.bool).triu()")
    if code.startswith("def padding_mask("):
        code = "def padding_mask(lengths, max_len=None):\n    raise NotImplementedError  # your code here\n"
    return code


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    subs = tmp_path_factory.mktemp("class") / "submissions"
    for chapter in (CH1, CH2):
        _write(subs / "complete" / f"{chapter}.ipynb", _notebook(ROOT / "solutions" / f"{chapter}.ipynb"))
    _write(subs / "partial" / "workspace" / f"{CH1}.ipynb", _notebook(ROOT / "solutions" / f"{CH1}.ipynb", _plant))
    _write(subs / "partial" / "workspace" / f"{CH2}.ipynb", _notebook(ROOT / "exercises" / f"{CH1}.ipynb"))
    (subs / "broken").mkdir()
    (subs / "broken" / f"{CH1}.ipynb").write_text('{"cells": [{"cell_type": "code", "source": "def f(x):\n')
    _write(subs / "broken" / f"{CH2}.ipynb", _notebook(  # 2.1's cell raises: self_attention is never defined
        ROOT / "solutions" / f"{CH2}.ipynb",
        lambda code: "raise RuntimeError('left over')\n" + code if code.startswith("def self_attention(") else code))
    _write(subs / "broken" / "lab1.ipynb", _notebook(ROOT / "exercises" / f"{CH1}.ipynb"))
    before = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file()}
    out = subs.parent / "grades.csv"
    run = subprocess.run([sys.executable, "-m", "mha_course", "grade", str(subs), "01", "02", "-o", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    after = {p: p.read_bytes() for p in subs.rglob("*") if p.is_file()}
    return run, list(csv.DictReader(out.open(encoding="utf-8"))), before == after


def _by(rows, student):
    return {r["exercise"].split()[0]: r for r in rows if r["student"] == student}


def test_grade_writes_one_row_per_student_and_exercise(graded):
    run, rows, unchanged = graded
    exercises, _ = course_exercises(ROOT)
    numbers = [e.number for stem in (CH1, CH2) for e in exercises[stem]]
    assert list(rows[0]) == list(grading.COLUMNS)
    for student in ("broken", "complete", "partial"):
        assert list(_by(rows, student)) == numbers, student
    assert unchanged, "grade wrote into the submissions"
    complete = _by(rows, "complete")
    assert {(r["verdict"], r["points"], r["max_points"]) for r in complete.values()} == {("passed", "1", "1")}
    n = len(numbers)
    assert re.search(rf"^complete\s+{n} of {n}\s+100%", run.stdout, re.M), run.stdout


def test_a_planted_mistake_and_a_stub_cost_only_their_own_points(graded):
    _, rows, _ = graded
    partial = _by(rows, "partial")
    assert partial["1.2"]["verdict"] == "failed" and partial["1.2"]["points"] == "0"
    assert partial["1.2"]["hint"] and "\n" not in partial["1.2"]["hint"], partial["1.2"]
    assert partial["1.3"]["verdict"] == "not implemented" and partial["1.3"]["points"] == "0"
    others = [r for n, r in partial.items() if n.startswith("1.") and n not in ("1.2", "1.3")]
    assert others and all(r["verdict"] == "passed" and r["points"] == "1" for r in others)
    # chapter 01's exercises saved as 02: not run, a clear line, no points
    second = [r for n, r in partial.items() if n.startswith("2.")]
    assert {r["verdict"] for r in second} == {grading.WRONG_CHAPTER}
    assert "holds the exercises of 01_dot_product_attention" in second[0]["message"]


def test_a_broken_notebook_costs_only_its_own_points(graded):
    run, rows, _ = graded
    broken = _by(rows, "broken")
    first = [r for n, r in broken.items() if n.startswith("1.")]
    assert {r["verdict"] for r in first} == {"unreadable"} and "not a notebook that can be read" in first[0]["message"]
    assert broken["2.1"]["verdict"] == "error" and "RuntimeError: left over" in broken["2.1"]["message"]
    rest = [r for n, r in broken.items() if n.startswith("2.") and n != "2.1"]
    assert rest and all(r["verdict"] == "passed" and r["points"] == "1" for r in rest), rest
    assert "broken: not graded: lab1.ipynb" in run.stdout


def test_a_notebook_that_loops_is_stopped_and_costs_its_own_points(tmp_path):
    """A tiny course whose learner's copy loops (no PyTorch to load), next to an unreadable one."""
    root = tmp_path / "course"
    cells = [{"cell_type": "markdown", "metadata": {}, "source": "# Exercises · Chapter 01 · Tiny"},
             {"cell_type": "markdown", "metadata": {}, "source": "## Exercise 1.1 · Wait\n<!-- points: 3 -->"},
             {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": "check_wait(f)"}]
    nb = {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                       "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    _write(root / "exercises" / "01_tiny.ipynb", nb)
    _write(root / "exercises" / "02_other.ipynb", dict(nb, cells=[
        {"cell_type": "markdown", "metadata": {}, "source": "## Exercise 2.1 · Other"},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": "check_other(g)"}]))
    looping = dict(nb, cells=[{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                               "source": "while True:\n    pass"}] + cells)
    _write(tmp_path / "subs" / "ann" / "01_tiny.ipynb", looping)
    (tmp_path / "subs" / "ann" / "02_other.ipynb").write_text("{")
    grades = grading.grade(tmp_path / "subs", root, timeout=2)
    rows = {r["exercise"]: r for r in grades.rows}
    assert rows["1.1 Wait"]["verdict"] == "timed out" and "2 s limit" in rows["1.1 Wait"]["message"]
    assert rows["1.1 Wait"]["max_points"] == "3" and rows["1.1 Wait"]["points"] == "0"
    assert rows["2.1 Other"]["verdict"] == "unreadable"
    assert re.search(r"^ann\s+0 of 4\s+0%", grading.summary(grades), re.M), grading.summary(grades)
    # --points overrides what the notebook states; an unknown exercise or a bad number is refused
    exercises, _ = course_exercises(root)
    assert grading.parse_points(["1.1=0.5,2.1=2"], exercises) == {"1.1": 0.5, "2.1": 2.0}
    for bad in ("3.1=1", "1.1=two", "1.1"):
        with pytest.raises(grading.GradeError, match="--points"):
            grading.parse_points([bad], exercises)


def test_bad_input_gets_a_clear_message_and_nothing_is_overwritten(tmp_path, capsys):
    from mha_course.__main__ import main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["grade", str(empty), "-o", str(tmp_path / "g.csv")]) == 1
    assert "holds no student folder" in capsys.readouterr().err
    (empty / "alice").mkdir()
    (empty / "alice" / "notes.txt").write_text("hello")
    assert main(["grade", str(empty), "-o", str(tmp_path / "g.csv")]) == 1
    assert "no notebook in any student folder" in capsys.readouterr().err
    kept = tmp_path / "kept.csv"
    kept.write_text("the instructor's own grades")
    assert main(["grade", str(empty), "-o", str(kept)]) == 1
    assert "exists and is kept" in capsys.readouterr().err and kept.read_text() == "the instructor's own grades"
    assert main(["grade", str(empty), "-o", str(empty / "g.csv")]) == 1
    assert "inside" in capsys.readouterr().err and not (empty / "g.csv").exists()
    assert main(["grade", str(tmp_path / "missing"), "-o", str(tmp_path / "g.csv")]) == 1
    assert "is not a folder" in capsys.readouterr().err
    assert main(["grade", str(empty), "99", "-o", str(tmp_path / "g.csv")]) == 1
    assert "no chapter 99" in capsys.readouterr().err


# ----------------------------------------------------------- hidden inputs (MHA_CHECK_SEED)

def _scores(query, key):
    return query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))


def _scores_over_d_k(query, key):  # a common mistake: divided by d_k, not its square root
    return query @ key.transpose(-2, -1) / query.size(-1)


def test_a_hidden_seed_changes_the_inputs_and_still_passes_right_answers_and_fails_wrong_ones(monkeypatch):
    monkeypatch.delenv("MHA_CHECK_SEED", raising=False)
    assert case_seed() is None
    seen = gen(1).initial_seed()
    with hidden_cases(20261204):
        assert case_seed() == 20261204
        hidden = torch.randn(4, generator=gen(1))
        assert gen(1).initial_seed() != seen and gen(2).initial_seed() != gen(1).initial_seed()
        assert check_attention_scores(_scores).passed
        wrong = check_attention_scores(_scores_over_d_k)
        assert wrong.status == "failed" and "instead of √d_k" in wrong.message and wrong.hint
        assert check_causal_mask(lambda n: torch.ones(n, n, dtype=torch.bool).tril()).passed
        assert not check_causal_mask(lambda n: torch.ones(n, n, dtype=torch.bool).triu()).passed
    assert case_seed() is None and not torch.equal(torch.randn(4, generator=gen(1)), hidden)
    monkeypatch.setenv("MHA_CHECK_SEED", "20261204")
    assert torch.equal(torch.randn(4, generator=gen(1)), hidden), "the variable and the context agree"
    assert check_attention_scores(_scores).passed and not check_attention_scores(_scores_over_d_k).passed
    monkeypatch.setenv("MHA_CHECK_SEED", "soon")
    with pytest.raises(ValueError, match="MHA_CHECK_SEED='soon' is not an integer"):
        gen(1)
    with pytest.raises(TypeError, match="int seed"):
        with hidden_cases("1"):  # type: ignore[arg-type]
            pass
