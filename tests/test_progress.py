"""``make progress`` / ``python -m mha_course progress``: the learner's table of exercises.

Without a kernel: the exercises are read from the course's generated notebooks (each check
under its heading), the table's layout, a notebook that is not valid JSON, exercises not
started. With kernels (few, small: each start costs seconds): a workspace with chapter 01's
solutions (all pass), chapter 02's untouched exercises (all "not implemented"), chapter 03
with a wrong answer and a half-typed cell, chapter 05 whose imports fail, chapter 04 as
broken JSON, run through the command line; a notebook that hangs, stopped by the limit; and
an error below the last check, on a line of its own.
The learner's files are never modified.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mha_course import progress
from mha_course.progress import Exercise, Report, Row
from mha_lib import checks

ROOT = Path(__file__).resolve().parent.parent


def course_copy(tmp_path: Path) -> Path:
    """A course folder with the real exercises/ (what progress reads) and an empty workspace/."""
    root = tmp_path / "course"
    shutil.copytree(ROOT / "exercises", root / "exercises")
    (root / "workspace").mkdir()
    return root


def edit(source: Path, target: Path, change) -> None:
    """Write ``source`` to ``target`` with ``change(code)`` applied to every code cell."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["source"] = change("".join(cell["source"]))
            cell["outputs"], cell["execution_count"] = [], None
    target.write_text(json.dumps(nb, indent=1, ensure_ascii=False))


def table(text: str) -> dict[str, str]:
    """{"1.2": "✅ passed", ...} from the printed table."""
    rows = {}
    for line in text.splitlines():
        match = re.search(r"\s(\d+\.\d+) .*?\s{2,}(\S.*)$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


# ----------------------------------------------------------------------- no kernel

def test_the_exercises_come_from_the_generated_notebooks_each_with_its_check():
    exercises, titles = progress.course_exercises(ROOT)
    stems = [p.stem for p in sorted((ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))]
    assert list(exercises) == stems and list(titles) == stems
    numbers = [e.number for chapter in exercises.values() for e in chapter]
    assert len(numbers) == len(set(numbers)) >= 2 * len(stems), numbers
    for stem, chapter in exercises.items():
        assert chapter, f"exercises/{stem}.ipynb has no '### Exercise N.M · Title' heading"
        for exercise in chapter:
            assert exercise.number.split(".")[0] == str(int(stem[:2])), (stem, exercise.number)
            assert exercise.checks, f"exercise {exercise.number} ({stem}) calls no check_*(...) under its heading"
            for name in exercise.checks:
                assert callable(getattr(checks, name, None)), f"{stem}: {name} is not in mha_lib.checks"
    first = exercises[stems[0]]
    assert (first[1].number, first[1].title, first[1].checks) == ("1.2", "A causal mask", ("check_causal_mask",))
    assert titles[stems[0]] == "Attention from one dot product"


def test_the_solutions_call_the_same_checks_so_a_solved_copy_maps_onto_the_exercises():
    exercises, _ = progress.course_exercises(ROOT)
    for stem, chapter in exercises.items():
        solution = json.loads((ROOT / "solutions" / f"{stem}.ipynb").read_text())
        cells = [c for c in solution["cells"]]
        owners = progress.assign_cells(cells, chapter)
        called = {o.number for c, o in zip(cells, owners) if o and c["cell_type"] == "code"
                  and progress.check_calls("".join(c["source"]))}
        assert called == {e.number for e in chapter}, f"solutions/{stem}: checks for {called}"


@pytest.mark.parametrize(("code", "calls"), [
    ("check_causal_mask(causal_mask)", ["check_causal_mask"]),
    ("from mha_lib.checks import (\n    check_a,\n    check_b,\n)", []),
    ("r = checks.check_split_heads(f)\nprint(r)", ["check_split_heads"]),
    ("%time check_padding_mask(padding_mask)", ["check_padding_mask"]),  # a magic: not Python
    ("def f(x:\n    pass\ncheck_combine_heads(f)", ["check_combine_heads"]),  # half typed
    ("assert check_a(f) and check_b(g)", ["check_a", "check_b"]),
])
def test_check_calls_are_found_in_code_that_is_not_python(code, calls):
    assert progress.check_calls(code) == calls


def test_not_started_and_unreadable_notebooks_need_no_kernel(tmp_path, monkeypatch):
    root = course_copy(tmp_path)
    broken = root / "workspace" / "01_dot_product_attention.ipynb"
    broken.write_text('{"cells": [{"cell_type": "code", "source": "def f(x):\n')  # saved mid-edit
    before = broken.read_bytes()
    monkeypatch.setattr(progress.runner, "_run", lambda *a: pytest.fail("no notebook should run"))
    report = progress.check_workspace(root)
    first = [r for r in report.rows if r.chapter.startswith("01_")]
    assert len(first) == 1 and first[0].exercise is None and first[0].status == progress.UNREADABLE
    assert "not a notebook that can be read" in first[0].message and "make exercise N=01" in first[0].message
    rest = [r for r in report.rows if not r.chapter.startswith("01_")]
    assert rest and all(r.status == progress.NOT_STARTED for r in rest)
    assert report.done == 0 and report.notebooks_run == 0
    assert broken.read_bytes() == before
    text = progress.render(report)
    assert "💥 workspace/01_dot_product_attention.ipynb is not a notebook that can be read" in text
    assert "not started (make exercise N=02)" in text
    assert text.endswith(f"0 of {report.exercises} exercises done. You have no exercise notebook in workspace/ "
                         "yet: start one with `make exercise N=01`.")


def test_the_table_has_one_aligned_line_per_exercise_and_a_total():
    a = Exercise("01_first", "1.1", "Scores", ("check_a",))
    b = Exercise("01_first", "1.2", "A much longer exercise title that goes on and on", ("check_b",))
    c = Exercise("02_second", "2.1", "Heads", ("check_c",))
    report = Report([Row("01_first", a, "passed", "passed"),
                     Row("01_first", b, "failed", "the mask lets query 0 see key 1"),
                     Row("02_second", c, "not implemented", "not implemented yet")],
                    exercises=3, notebooks_run=2, seconds=7.4,
                    chapter_titles={"01_first": "The first", "02_second": "The second"})
    lines = progress.render(report).splitlines()
    assert lines[0].split() == ["chapter", "exercise", "result"]
    assert lines[1].startswith("01 The first") and lines[1].endswith("✅ passed")
    assert lines[2].startswith(" ") and "1.2 A much longer exercise title that goe…" in lines[2]
    assert lines[2].endswith("❌ the mask lets query 0 see key 1")
    assert lines[3].startswith("02 The second") and lines[3].endswith("⏳ not implemented yet")
    assert len({line.index(line.split("  ")[-1].strip()) for line in lines[1:4]}) == 1, "results not aligned"
    assert lines[-1] == "1 of 3 exercises done. Ran 2 notebooks from workspace/ in 7 s (your files are not modified)."
    clipped = progress.render(report, width=60).splitlines()
    assert all(len(line) < 60 for line in clipped[:4]) and clipped[2].endswith("…"), clipped


# --------------------------------------------------------------------- with kernels

def test_a_workspace_through_the_command_line(tmp_path):
    root = course_copy(tmp_path)
    ws = root / "workspace"
    shutil.copy(ROOT / "solutions" / "01_dot_product_attention.ipynb", ws)  # all pass
    edit(ROOT / "exercises" / "02_self_attention_one_head.ipynb", ws / "02_self_attention_one_head.ipynb",
         lambda code: code)  # untouched: all "not implemented"
    edit(ROOT / "solutions" / "03_multi_head_attention.ipynb", ws / "03_multi_head_attention.ipynb",
         lambda code: code.replace(".transpose(1, 2)  # (B, H, L, d_k)", "  # forgot the transpose")
         .replace("def combine_heads(x):", "def combine_heads(x:"))  # a wrong answer; a half-typed line
    (ws / "04_masks_and_cross_attention.ipynb").write_text('{"cells": [')  # saved mid-edit
    edit(ROOT / "exercises" / "05_checking_against_pytorch.ipynb", ws / "05_checking_against_pytorch.ipynb",
         lambda code: "import a_module_that_does_not_exist\n" + code if "from mha_lib.checks" in code else code)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in ws.iterdir()}

    env = dict(os.environ, MHA_COURSE_ROOT=str(root))
    result = subprocess.run([sys.executable, "-m", "mha_course", "progress", "--timeout", "120"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    rows = table(out)
    assert [rows[n] for n in ("1.1", "1.2", "1.3", "1.4", "1.5")] == ["✅ passed"] * 5, out
    assert rows["2.1"] == rows["2.2"] == "⏳ not implemented yet", out
    assert rows["3.1"] == rows["3.5"] == "✅ passed", out
    assert rows["3.2"].startswith("❌ ") and "(B, L, H, d_k)" in rows["3.2"], out  # the check's own message
    assert rows["3.3"].startswith('💥 the cell "def combine_heads(x:" raised SyntaxError'), out
    assert "(line 1)" in rows["3.3"] and ".py" not in rows["3.3"], out
    assert rows["3.4"].startswith("💥 "), out  # its check reports the missing combine_heads
    assert "04 Masks and cross-attention" in out and "💥 workspace/04_masks_and_cross_attention.ipynb is not " \
                                                      "a notebook that can be read" in out, out
    assert "4.1" not in rows, "an unreadable notebook gets one line, not one per exercise"
    for number in ("5.1", "5.2", "5.3", "5.4"):
        assert "above the exercises, raised ModuleNotFoundError: No module named " \
               "'a_module_that_does_not_exist'" in rows[number], out
    assert rows["7.1"] == "not started (make exercise N=07)" and rows["7.2"] == "not started", out
    exercises = sum(map(len, progress.course_exercises(root)[0].values()))
    assert re.search(rf"^7 of {exercises} exercises done\. Ran 4 notebooks from workspace/ in \d+ s", out, re.M), out
    assert "Traceback" not in out + result.stderr, result.stderr
    for name in ("01_dot_product_attention", "02_self_attention_one_head", "03_multi_head_attention",
                 "05_checking_against_pytorch"):
        assert f"ran workspace/{name}.ipynb in" in result.stderr, result.stderr
    after = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in ws.iterdir()}
    assert after == before, "progress modified or added files in workspace/"


def notebook(cells):
    """A minimal nbformat-4 notebook from ``[(kind, source), ...]``, for the tiny courses below."""
    return {"cells": [{"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": source,
                       **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                      for i, (kind, source) in enumerate(cells)],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_a_notebook_that_hangs_is_stopped_and_the_rest_is_reported(tmp_path):
    """A tiny course: the learner's copy hangs in its first cell (no PyTorch to load)."""
    root = tmp_path / "course"
    (root / "exercises").mkdir(parents=True)
    (root / "workspace").mkdir()

    cells = [("markdown", "# Exercises · Chapter 01 · Tiny"),
             ("markdown", "## Exercise 1.1 · Wait"), ("code", "check_wait(f)"),
             ("markdown", "## Exercise 1.2 · Wait more"), ("code", "check_more(g)")]
    (root / "exercises" / "01_tiny.ipynb").write_text(json.dumps(notebook(cells)))
    (root / "workspace" / "01_tiny.ipynb").write_text(json.dumps(notebook(
        [("code", "import time\nwhile True:\n    time.sleep(0.05)")] + cells)))
    report = progress.check_workspace(root, timeout=2)
    statuses = [(r.exercise.number if r.exercise else None, r.status) for r in report.rows]
    assert statuses == [(None, "timed out"), ("1.1", "not run"), ("1.2", "not run")], report.rows
    assert report.rows[0].message == ('the cell "import time" was still running after the 2 s limit '
                                      "(an endless loop, or a very slow cell?)")
    text = progress.render(report)
    assert "⌛ the cell \"import time\" was still running" in text and "⏸ not checked" in text
    assert text.splitlines()[-1].startswith("0 of 2 exercises done. Ran 1 notebook from workspace/")


# ------------------------------------------------------------- verdicts (issue 22)

def _outcome(*records):
    from mha_course.progress.runner import Outcome

    return Outcome(records=[dict(check=c, status=s, message=m) for c, s, m in records], check_cells=1)


def test_the_last_run_of_a_check_is_its_verdict():
    from mha_course.progress.runner import verdict

    exercise = Exercise("03_x", "3.2", "Split", ("check_split_heads",))
    fixed = _outcome(("split into heads", "failed", "wrong values"), ("split into heads", "passed", "correct"))
    assert verdict(exercise, fixed) == ("passed", "passed")
    broke = _outcome(("split into heads", "passed", "correct"), ("split into heads", "failed", "wrong values"))
    assert verdict(exercise, broke) == ("failed", "wrong values")
    two_checks = _outcome(("a", "failed", "wrong a"), ("b", "passed", "ok"), ("a", "passed", "ok"))
    assert verdict(Exercise("03_x", "3.3", "Two", ("check_a", "check_b")), two_checks) == ("passed", "passed")


def test_a_check_waiting_on_an_earlier_exercise_says_which():
    from mha_course.progress.runner import defined_functions, verdict

    first = Exercise("11_x", "11.1", "Halves", ("check_halves_mask",))
    second = Exercise("11_x", "11.2", "Restricted", ("check_restricted_attention",))
    cells = [{"cell_type": "markdown", "source": "### Exercise 11.1 · Halves"},
             {"cell_type": "code", "source": "def halves_mask(seq_len):\n    raise NotImplementedError"},
             {"cell_type": "markdown", "source": "### Exercise 11.2 · Restricted"},
             {"cell_type": "code", "source": "def restricted_attention(mha, x):\n    return mha(x, x, x)"}]
    owners = progress.assign_cells(cells, [first, second])
    definitions = defined_functions(cells, owners)
    assert definitions == {"halves_mask": "11.1", "restricted_attention": "11.2"}
    waiting = _outcome(("restricted multi-head attention", "not implemented",
                        "not implemented yet: it calls halves_mask, which still raises NotImplementedError"))
    assert verdict(second, waiting, definitions) == (
        "not implemented", "waits for exercise 11.1: halves_mask is not implemented yet")
    assert verdict(second, waiting, {}) == ("not implemented", "waits for halves_mask, which is not implemented yet")
    own_stub = _outcome(("halves mask", "not implemented", "not implemented yet (it raises NotImplementedError)"))
    assert verdict(first, own_stub, definitions) == ("not implemented", "not implemented yet")


def test_waiting_and_last_runs_in_a_kernel(tmp_path):
    """A tiny course run for real: 1.2 calls 1.1's stub; 1.3's wrong attempt sits above its fixed one."""
    root = tmp_path / "course"
    (root / "exercises").mkdir(parents=True)
    (root / "workspace").mkdir()

    head = [("markdown", "# Exercises · Chapter 01 · Tiny"),
            ("code", "import torch\nfrom mha_lib.checks import check_causal_mask, check_halves_mask, "
                     "check_restricted_attention")]
    (root / "exercises" / "01_tiny.ipynb").write_text(json.dumps(notebook(head + [
        ("markdown", "## Exercise 1.1 · Halves"), ("code", "check_halves_mask(halves_mask)"),
        ("markdown", "## Exercise 1.2 · Restricted"), ("code", "check_restricted_attention(restricted_attention)"),
        ("markdown", "## Exercise 1.3 · Causal"), ("code", "check_causal_mask(causal_mask)")])))
    (root / "workspace" / "01_tiny.ipynb").write_text(json.dumps(notebook(head + [
        ("markdown", "## Exercise 1.1 · Halves"),
        ("code", "def halves_mask(seq_len):\n    raise NotImplementedError"), ("code", "check_halves_mask(halves_mask)"),
        ("markdown", "## Exercise 1.2 · Restricted"),
        ("code", "def restricted_attention(mha, x):\n"
                 "    return mha(x, x, x, mask=halves_mask(x.size(1)), return_weights=True)"),
        ("code", "check_restricted_attention(restricted_attention)"),
        ("markdown", "## Exercise 1.3 · Causal"),
        ("code", "check_causal_mask(lambda L: torch.ones(L, L, dtype=torch.bool))"),  # the first attempt
        ("code", "check_causal_mask(lambda L: torch.ones(L, L, dtype=torch.bool).tril())")])))  # fixed
    report = progress.check_workspace(root, timeout=60)
    rows = {r.exercise.number: (r.status, r.message) for r in report.rows if r.exercise}
    assert rows == {"1.1": ("not implemented", "not implemented yet"),
                    "1.2": ("not implemented", "waits for exercise 1.1: halves_mask is not implemented yet"),
                    "1.3": ("passed", "passed")}, report.rows


def test_an_error_below_the_last_check_is_reported_on_its_own_line(tmp_path):
    """Issue 34: the run went up to the last check only, so a cell below it that raises was never
    reported although the README says the notebooks run top to bottom. The checks keep their verdicts."""
    root = tmp_path / "course"
    (root / "exercises").mkdir(parents=True)
    (root / "workspace").mkdir()
    head = [("markdown", "# Exercises · Chapter 01 · Tiny"),
            ("code", "import torch\nfrom mha_lib.checks import check_causal_mask")]
    exercise = [("markdown", "## Exercise 1.1 · Causal"),
                ("code", "check_causal_mask(lambda L: torch.ones(L, L, dtype=torch.bool).tril())")]
    (root / "exercises" / "01_tiny.ipynb").write_text(json.dumps(notebook(head + exercise)))
    (root / "workspace" / "01_tiny.ipynb").write_text(json.dumps(notebook(head + exercise + [
        ("code", "ratio = 1 / 0"),  # the learner's experiment, under the exercise's heading
        ("markdown", "## Done?"), ("code", "print('fine')"), ("code", "undefined_name")])))
    report = progress.check_workspace(root, timeout=60)
    rows = [(r.exercise.number if r.exercise else r.label, r.status, r.message) for r in report.rows]
    assert rows == [
        ("1.1", "passed", "passed"),
        ("(below the last check)", "error",
         'the cell "ratio = 1 / 0", below the last check, raised ZeroDivisionError: division by zero'),
        ("(below the last check)", "error",
         "the cell \"undefined_name\", below the last check, raised NameError: name 'undefined_name' is not defined"),
    ], report.rows
    lines = progress.render(report).splitlines()
    assert [line for line in lines if "below the last check" in line][0].split()[:3] == ["(below", "the", "last"]
    assert sum("💥" in line for line in lines) == 2 and lines[-1].startswith("1 of 1 exercises done.")


# ------------------------------------------------- a chapter the course renumbered (09 -> 10)

def test_a_copy_started_before_its_chapter_was_renumbered_maps_by_rank():
    """The learner's copy still says "Exercise 9.1" where the course now says 10.1 (make update renames
    the file, never its content): its cells go to 10.1 and 10.2 all the same."""
    first = Exercise("10_x", "10.1", "Fuse", ("check_fused_projection",))
    second = Exercise("10_x", "10.2", "Blocks", ("check_blockwise_attention",))
    cells = [{"cell_type": "markdown", "source": "## Exercise 9.1 · Fuse"},
             {"cell_type": "code", "source": "def fuse_projections(mha):\n    raise NotImplementedError"},
             {"cell_type": "code", "source": "check_fused_projection(fuse_projections)"},
             {"cell_type": "markdown", "source": "## Exercise 9.2 · Blocks"},
             {"cell_type": "code", "source": "def blockwise_attention(q, k, v, b):\n    return q"},
             {"cell_type": "markdown", "source": "## Exercise 10.7 · An exercise of my own"},
             {"cell_type": "code", "source": "def mine():\n    pass"}]
    owners = progress.assign_cells(cells, [first, second])
    assert [o and o.number for o in owners] == ["10.1", "10.1", "10.1", "10.2", "10.2", "10.2", "10.2"]
    from mha_course.progress.runner import defined_functions

    assert defined_functions(cells, owners) == {"fuse_projections": "10.1", "blockwise_attention": "10.2",
                                                "mine": "10.2"}


def test_a_workspace_notebook_named_after_no_exercise_is_reported_not_ignored(tmp_path, monkeypatch):
    root = tmp_path / "course"
    (root / "exercises").mkdir(parents=True)
    (root / "workspace").mkdir()
    for stem, number in (("03_heads", "3.1"), ("10_efficient", "10.1")):
        (root / "exercises" / f"{stem}.ipynb").write_text(json.dumps(notebook(
            [("markdown", f"# Exercises · Chapter {stem[:2]} · {stem[3:]}"),
             ("markdown", f"## Exercise {number} · One"), ("code", "check_one(f)")])))
    stale = root / "workspace" / "09_efficient.ipynb"  # the learner pulled with git, not `make update`
    stale.write_text("my chapter 09 work, not even JSON")
    (root / "workspace" / "10_efficient_old.ipynb").write_text("{}")
    before = {p.name: p.read_bytes() for p in (root / "workspace").iterdir()}
    monkeypatch.setattr(progress.runner, "_run", lambda *a: pytest.fail("no notebook should run"))

    report = progress.check_workspace(root)

    assert report.notebooks_run == 0 and {r.status for r in report.rows} == {progress.NOT_STARTED}
    assert report.notes == [
        "workspace/09_efficient.ipynb is not checked: its exercise is now 10_efficient (the course renumbered "
        "it). Rename your copy to have it checked: mv workspace/09_efficient.ipynb workspace/10_efficient.ipynb",
        "workspace/10_efficient_old.ipynb is not checked: no exercise has that name (a copy is checked when it "
        "is named as its exercise in exercises/, e.g. 10_efficient.ipynb). Rename it to have it checked, or "
        "leave it as it is: it stays yours."], report.notes
    text = progress.render(report)
    assert "\n⚠ workspace/09_efficient.ipynb is not checked" in text, text
    assert text.endswith("0 of 2 exercises done. No notebook in workspace/ was run (see above)."), text
    assert progress.check_workspace(root, chapters=["03"]).notes == [], "chapter 03 only: the 10s are not its"
    assert len(progress.check_workspace(root, chapters=["10"]).notes) == 2

    # Both names: the new one is the copy checked; the old one is left for the learner to merge.
    monkeypatch.setattr(progress.runner, "_run", lambda *a: None)
    (root / "workspace" / "10_efficient.ipynb").write_text(json.dumps(notebook([("code", "x = 1")])))
    both = progress.check_workspace(root).notes[0]
    assert both.startswith("workspace/09_efficient.ipynb is not checked: its exercise is now 10_efficient") \
        and "workspace/10_efficient.ipynb is the copy checked" in both and "mv " not in both, both
    assert all(before[p.name] == p.read_bytes() for p in (root / "workspace").iterdir() if p.name in before)


def test_forked_and_fresh_kernels_give_the_same_table(tmp_path):
    """`make progress` forks each kernel from one process that imported PyTorch (as `grade` does);
    `--no-fork` starts each from scratch. A right answer and a wrong one read the same either way."""
    root = course_copy(tmp_path)
    ws = root / "workspace"
    shutil.copy(ROOT / "solutions" / "01_dot_product_attention.ipynb", ws)
    edit(ROOT / "solutions" / "03_multi_head_attention.ipynb", ws / "03_multi_head_attention.ipynb",
         lambda code: code.replace(".transpose(1, 2)  # (B, H, L, d_k)", "  # forgot the transpose"))
    env = dict(os.environ, MHA_COURSE_ROOT=str(root))
    outputs = []
    for extra in ([], ["--no-fork"]):
        result = subprocess.run([sys.executable, "-m", "mha_course", "progress", "01", "03", *extra], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        outputs.append(table(result.stdout))
    forked, fresh = outputs
    assert forked == fresh
    assert forked["1.4"] == "✅ passed" and forked["3.2"].startswith("❌ "), forked
