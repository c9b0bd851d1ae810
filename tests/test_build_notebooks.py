"""tools/build_notebooks.py picks each pair's inputs by content (a git checkout resets file times)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import build_notebooks  # noqa: E402

CELL = "# %%\nprint({})\n"


def write_pair(folder: Path, value: int) -> Path:
    """A notebook whose one cell prints ``value``, and its .py, in agreement."""
    py = folder / "01_demo.py"
    nb = jupytext.reads(CELL.format(value), fmt="py:percent")
    jupytext.write(nb, folder / "01_demo.ipynb")
    py.write_text(build_notebooks.as_py(folder / "01_demo.ipynb"))
    return folder / "01_demo.ipynb"


def edit_py(ipynb: Path, value: int) -> None:
    py = ipynb.with_suffix(".py")
    py.write_text(py.read_text().replace(CELL.format(value - 1), CELL.format(value)))


def edit_ipynb(ipynb: Path, value: int) -> None:
    nb = jupytext.read(ipynb)
    nb.cells[0].source = f"print({value})"
    jupytext.write(nb, ipynb)


def make_older(path: Path) -> None:
    """Give ``path`` an old time stamp, so that a rule by file time would pick the other file."""
    os.utime(path, (time.time() - 3600, time.time() - 3600))


@pytest.fixture
def course(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(build_notebooks, "ROOT", tmp_path)
    monkeypatch.setattr(build_notebooks, "RECORD", tmp_path / "build" / "notebook_pairs.json")
    (tmp_path / "chapters").mkdir()
    return tmp_path / "chapters"


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=folder, check=True,
                   capture_output=True)


def test_a_pair_that_agrees_needs_no_choice(course):
    ipynb = write_pair(course, 1)
    assert build_notebooks.source_of(ipynb, {}, None) is None
    assert build_notebooks.source_of(ipynb, {}, "ipynb") is None


@pytest.mark.parametrize("edited", ["py", "ipynb"])
def test_the_record_of_the_last_build_tells_which_file_was_edited(course, edited):
    ipynb = write_pair(course, 1)
    record = {"chapters/01_demo.ipynb": build_notebooks.sha(ipynb.with_suffix(".py").read_text())}
    (edit_py if edited == "py" else edit_ipynb)(ipynb, 2)
    make_older(ipynb.with_suffix(".py") if edited == "py" else ipynb)  # the edited file looks older
    assert build_notebooks.source_of(ipynb, record, None) == edited
    other = "ipynb" if edited == "py" else "py"
    assert build_notebooks.source_of(ipynb, record, other) == other  # --from decides


def test_both_files_edited_stops_and_asks(course):
    ipynb = write_pair(course, 1)
    record = {"chapters/01_demo.ipynb": build_notebooks.sha(ipynb.with_suffix(".py").read_text())}
    build_notebooks.RECORD.parent.mkdir()
    build_notebooks.RECORD.write_text(json.dumps(record))
    edit_py(ipynb, 2)
    edit_ipynb(ipynb, 3)
    with pytest.raises(build_notebooks.PairError, match="both edited and disagree; rerun with --from py or"):
        build_notebooks.source_of(ipynb, record, None)
    assert build_notebooks.main([str(ipynb)]) == 1  # and the command says so, building nothing


@pytest.mark.parametrize("edited", ["py", "ipynb"])
def test_without_a_record_git_tells_which_file_was_edited(course, edited):
    ipynb = write_pair(course, 1)
    git(course.parent, "init", "-q")
    git(course.parent, "add", ".")
    git(course.parent, "commit", "-qm", "pair")
    (edit_py if edited == "py" else edit_ipynb)(ipynb, 2)
    make_older(ipynb.with_suffix(".py") if edited == "py" else ipynb)
    assert build_notebooks.source_of(ipynb, {}, None) == edited


def test_a_new_notebook_takes_its_py(course):
    py = course / "02_new.py"
    py.write_text(CELL.format(5))
    assert build_notebooks.source_of(py.with_suffix(".ipynb"), {}, None) == "py"


def test_changed_builds_only_pairs_that_disagree(course, capsys):
    first, second = write_pair(course, 1), course / "02_other.ipynb"
    jupytext.write(jupytext.reads(CELL.format(7), fmt="py:percent"), second)
    second.with_suffix(".py").write_text(build_notebooks.as_py(second))
    record = {f"chapters/{p.name}": build_notebooks.sha(p.with_suffix(".py").read_text()) for p in (first, second)}
    build_notebooks.RECORD.parent.mkdir()
    build_notebooks.RECORD.write_text(json.dumps(record))
    edit_py(first, 2)

    assert build_notebooks.main(["--changed", str(first), str(second)]) == 0
    out = capsys.readouterr().out
    assert "chapters/01_demo.ipynb (inputs from the .py)" in out and "02_other" not in out
    nb = jupytext.read(first)
    assert nb.cells[0].source == "print(2)" and nb.cells[0].outputs[0]["text"] == "2\n"  # built from the .py
    assert first.with_suffix(".py").read_text() == build_notebooks.as_py(first)  # in agreement again
    assert json.loads(build_notebooks.RECORD.read_text())["chapters/01_demo.ipynb"] == build_notebooks.sha(
        first.with_suffix(".py").read_text())
    assert build_notebooks.main(["--changed", str(first), str(second)]) == 0
    assert "every pair agrees: nothing to build" in capsys.readouterr().out
