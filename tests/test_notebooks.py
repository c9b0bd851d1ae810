"""The notebooks themselves: paired, executed top to bottom, and following the course's rules.

nbval (see pyproject.toml) re-runs every notebook and compares its outputs; these tests
check what nbval does not: that each .ipynb has a py:percent twin with the same content,
that its stored outputs come from one clean run, and that it seeds and picks its device.
Re-pair and re-execute with `make notebooks`.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest
from jupytext.config import load_jupytext_config

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("chapters", "exercises", "solutions")
NOTEBOOKS = sorted(p for folder in FOLDERS for p in (ROOT / folder).glob("*.ipynb"))
CHAPTERS = [p for p in NOTEBOOKS if p.parent.name == "chapters"]


def ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def test_there_are_notebooks():
    assert (ROOT / "chapters" / "01_dot_product_attention.ipynb") in CHAPTERS


def test_every_script_has_its_notebook():
    for folder in FOLDERS:
        for py in (ROOT / folder).glob("[0-9][0-9]_*.py"):
            assert py.with_suffix(".ipynb").exists(), f"{py.relative_to(ROOT)} has no .ipynb; run `make notebooks`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_pair_is_in_sync(path: Path):
    py = path.with_suffix(".py")
    assert py.exists(), f"{py.relative_to(ROOT)} is missing; run `make notebooks`"
    config = load_jupytext_config(str(path.parent))
    expected = jupytext.writes(jupytext.read(path), fmt="py:percent", config=config)
    assert py.read_text() == expected, (
        f"{py.name} and {path.name} have drifted apart; run `make notebooks` "
        f"(or `jupytext --sync {path.relative_to(ROOT)}`)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_outputs_come_from_one_clean_run(path: Path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name} was not executed top to bottom in a fresh kernel (execution counts {counts}); "
        "run `make notebooks`"
    )
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} has stored errors: {[e.ename for e in errors]}"
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_chapter_seeds_and_picks_its_device(path: Path):
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "seed_everything(" in source, f"{path.name} must seed with mha_lib.seed_everything"
    assert "get_device()" in source, f"{path.name} must choose its device with mha_lib.get_device()"
