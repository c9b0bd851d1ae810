"""``python -m mha_course grade SUBMISSIONS/``: a class's workspaces graded into a CSV (INSTRUCTORS.md).

Three synthetic students on chapters 01 and 02 (few kernels: each start costs seconds), made from
solutions/ and exercises/: complete (the solutions), partial (one planted mistake, one stub, and
chapter 01's exercises saved as 02), broken (01 not valid JSON, 02 raising at its top, and another
course's notebook), graded as the command does by default (2 or more notebooks at once, in forked
kernels). Then a notebook that loops (a tiny course, no PyTorch), the points; a tiny class graded
serially in kernels started from scratch and in parallel in forked ones (the same CSV), the cells below
the last check (``--all-cells``), what a forked kernel starts with, a bad ``--jobs``; the bad input an
instructor may give, and the hidden inputs of the checks (``MHA_CHECK_SEED``).
"""

from __future__ import annotations

import csv
import json
import math
import os
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
    run = subprocess.run([sys.executable, "-m", "mha_course", "grade", str(subs), "01", "02", "-o", str(out),
                          "--jobs", "2"],
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


# A tiny course without PyTorch (kernels start in a second): each notebook defines its own check, which
# logs a verdict the way mha_lib's checks do (MHA_CHECK_LOG), so that notebooks can pass, loop or break.
_LOGGING_CHECK = """import json, os
def check_{name}(answer):
    status = "passed" if answer == 42 else "failed"
    with open(os.environ["MHA_CHECK_LOG"], "a") as log:
        log.write(json.dumps({{"check": "check_{name}", "status": status, "message": status,
                              "hint": "the answer is 42\\nsecond line"}}) + "\\n")
"""


def _code(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}


def _md(source: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def _tiny_nb(cells: list[dict]) -> dict:
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                        "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def _tiny_class(tmp_path: Path) -> tuple[Path, Path]:
    """A course of 2 chapters (1.1, 1.2; 2.1) and 4 students: all right; 1.2 wrong and chapter 02 looping;
    chapter 01 raising in 1.1 and a cell below the last check that raises; nothing but chapter 02."""
    root = tmp_path / "course"
    chapters = {"01_tiny": [("1.1", "one"), ("1.2", "two")], "02_other": [("2.1", "three")]}
    for stem, exercises in chapters.items():
        cells = [_md(f"# Exercises · Chapter {stem[:2]} · {stem[3:]}")]
        for number, name in exercises:
            cells += [_md(f"## Exercise {number} · {name.title()}"), _code(f"{name} = None  # your code here"),
                      _code(f"check_{name}({name})")]
        _write(root / "exercises" / f"{stem}.ipynb", _tiny_nb(cells))

    def notebook(stem: str, answers: dict[str, str], top: str = "", below: str = "") -> dict:
        cells = [_code(top)] if top else []
        cells += [_code("".join(_LOGGING_CHECK.format(name=n) for _, n in chapters[stem]))]
        for number, name in chapters[stem]:
            cells += [_md(f"## Exercise {number} · {name.title()}"), _code(answers.get(name, f"{name} = 42")),
                      _code(f"check_{name}({name})")]
        return _tiny_nb(cells + ([_code(below)] if below else []))

    subs = tmp_path / "subs"
    for stem in chapters:
        _write(subs / "ann" / f"{stem}.ipynb", notebook(stem, {}))
    _write(subs / "bob" / "01_tiny.ipynb", notebook("01_tiny", {"two": "two = 41"}))
    _write(subs / "bob" / "02_other.ipynb", notebook("02_other", {"three": "while True:\n    pass"}))
    _write(subs / "cy" / "01_tiny.ipynb", notebook("01_tiny", {"one": "raise RuntimeError('oops')"},
                                                   below="raise ValueError('below')"))
    _write(subs / "cy" / "02_other.ipynb", notebook("02_other", {}))
    _write(subs / "dee" / "02_other.ipynb", notebook("02_other", {}))
    return root, subs


def test_jobs_give_the_serial_csv_and_a_loop_costs_only_its_own_points(tmp_path):
    """Serially in kernels started from scratch (make progress --no-fork), then 2 at a time in forked
    kernels (grade's default): the same CSV, row for row."""
    root, subs = _tiny_class(tmp_path)
    serial = grading.grade(subs, root, timeout=3, jobs=1, fork=False)
    parallel = grading.grade(subs, root, timeout=3, jobs=2)
    assert serial.jobs == 1 and parallel.jobs == 2
    assert parallel.rows == serial.rows, "--jobs (or forked kernels) changed the CSV"
    verdicts = {(r["student"], r["exercise"].split()[0]): (r["verdict"], r["points"]) for r in parallel.rows}
    assert verdicts == {
        ("ann", "1.1"): ("passed", "1"), ("ann", "1.2"): ("passed", "1"), ("ann", "2.1"): ("passed", "1"),
        ("bob", "1.1"): ("passed", "1"), ("bob", "1.2"): ("failed", "0"), ("bob", "2.1"): ("timed out", "0"),
        ("cy", "1.1"): ("error", "0"), ("cy", "1.2"): ("passed", "1"), ("cy", "2.1"): ("passed", "1"),
        ("dee", "1.1"): ("not submitted", "0"), ("dee", "1.2"): ("not submitted", "0"),
        ("dee", "2.1"): ("passed", "1")}
    rows = {(r["student"], r["exercise"].split()[0]): r for r in parallel.rows}
    assert "3 s limit" in rows["bob", "2.1"]["message"]
    assert rows["bob", "1.2"]["hint"] == "the answer is 42", "the hint's first line"
    assert "RuntimeError: oops" in rows["cy", "1.1"]["message"]
    # the CSV's order: students by name, chapters and exercises in the course's order
    assert [(r["student"], r["exercise"].split()[0]) for r in parallel.rows] == [
        (s, n) for s in ("ann", "bob", "cy", "dee") for n in ("1.1", "1.2", "2.1")]
    # every notebook that ran has its seconds counted for its student; dee's chapter 01 did not run
    assert all(parallel.seconds[s] > 0 for s in ("ann", "bob", "cy", "dee"))
    assert parallel.seconds["bob"] >= 3, "the loop ran to its limit"


def test_grading_stops_at_the_last_check_unless_told_all_cells(tmp_path):
    root, subs = _tiny_class(tmp_path)
    for student in ("ann", "bob", "dee"):
        shutil.rmtree(subs / student)
    default = grading.grade(subs, root, timeout=3, chapters=["01"], jobs=1, fork=False)
    everything = grading.grade(subs, root, timeout=3, chapters=["01"], jobs=1, all_cells=True, fork=False)
    below = [r for r in everything.rows if r["exercise"] == "(below the last check)"]
    assert [(r["student"], r["verdict"], r["points"]) for r in below] == [("cy", "error", "0")]
    assert "ValueError: below" in below[0]["message"]
    assert default.rows == [r for r in everything.rows if r not in below], "the verdicts are the same"


def test_a_forked_kernel_starts_clean_where_its_notebook_is(tmp_path):
    """grade's kernels are forked from a process that imported PyTorch (mha_course.progress.forking): each
    one still starts with an empty namespace, in the notebook's folder, with the environment it was given,
    its own random numbers, in a session of its own, and is gone once its notebook has run."""
    import nbformat
    from nbclient import NotebookClient

    from mha_course.progress import forking

    code = ("import json, os, sys\nprint(json.dumps({'names': sorted(n for n in dir() if not n.startswith('_')), "
            "'preloaded': 'torch' in sys.modules, 'cwd': os.getcwd(), 'var': os.environ.get('MHA_TEST_VAR'), "
            "'alone': os.getpgid(0) == os.getpid(), 'pid': os.getpid(), 'main': __name__, "
            "'draw': __import__('torch').rand(3).tolist()}))")
    env = dict(os.environ, MHA_TEST_VAR="given")
    manager = forking.kernel_manager_class(env)
    assert manager is not None, "the fork server did not start"
    seen = []
    for name in ("one", "two"):
        folder = tmp_path / name
        folder.mkdir()
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        client = NotebookClient(nb, timeout=120, kernel_name="python3", kernel_manager_class=manager,
                                resources={"metadata": {"path": str(folder)}})
        with client.setup_kernel(env=env):
            client.execute_cell(nb.cells[0], 0)
        info = json.loads(nb.cells[0].outputs[0]["text"])
        assert info["preloaded"], "the kernel was not forked from the server (PyTorch not imported already)"
        assert set(info["names"]) <= {"In", "Out", "exit", "quit", "get_ipython", "open", "json", "os", "sys"}
        assert (info["cwd"], info["var"], info["alone"], info["main"]) == (str(folder), "given", True, "__main__")
        seen.append(info)
    assert seen[0]["pid"] != seen[1]["pid"] and seen[0]["draw"] != seen[1]["draw"], "two kernels, the same process?"
    for info in seen:
        assert not Path(f"/proc/{info['pid']}").exists() or "Z" in Path(f"/proc/{info['pid']}/stat").read_text(), \
            "a kernel outlived its notebook"


def test_a_bad_jobs_value_gets_a_clear_error(tmp_path, capsys):
    from mha_course.__main__ import main

    root, subs = _tiny_class(tmp_path)
    for bad in (0, -2, 1.5, "2", True):
        with pytest.raises(grading.GradeError, match=r"--jobs .*a whole number >= 1"):
            grading.grade(subs, root, jobs=bad)
    for bad in ("0", "two", "-1"):
        with pytest.raises(SystemExit) as stopped:
            main(["grade", str(subs), "--jobs", bad, "-o", str(tmp_path / "g.csv")])
        assert stopped.value.code == 2
        assert f"--jobs/-j: '{bad}' is not a whole number >= 1" in capsys.readouterr().err
    assert not (tmp_path / "g.csv").exists()
    assert grading.default_jobs() >= 1


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
