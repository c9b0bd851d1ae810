"""``mha_lib`` loads its names on first use (PEP 562), so that the command line is quick.

``python -m mha_lib start 01`` must answer in well under a second: it copies a file, and
importing PyTorch alone takes seconds. These tests prove that no command's process imports
PyTorch (or NumPy, Matplotlib, nbformat, nbclient where they aren't needed), and that the
lazy package still behaves like the eager one: every name in ``__all__`` resolves to the
object its submodule defines, ``dir()`` lists them, ``from mha_lib import *`` works, and
the table, ``__all__`` and the ``TYPE_CHECKING`` imports that type checkers read agree.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mha_lib

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "numpy", "matplotlib", "nbformat", "nbclient", "jupyter_client")

# Runs `python -m mha_lib ARGS` in this process (as runpy does for -m), then prints which
# heavy modules it imported, as JSON, on the last line.
PROBE = """
import json, runpy, sys
sys.argv = ["python -m mha_lib", *sys.argv[1:]]
try:
    runpy.run_module("mha_lib", run_name="__main__", alter_sys=True)
except SystemExit as exit:
    code = exit.code
else:
    code = 0
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print(json.dumps({{"code": code, "heavy": heavy}}))
""".format(heavy=HEAVY)


def run_cli(*args: str, cwd: Path, env: dict | None = None) -> tuple[dict, str]:
    result = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True,
                            env=dict(os.environ, **(env or {})), timeout=120)
    *lines, last = result.stdout.strip().splitlines()
    return json.loads(last), "\n".join(lines) + result.stderr


@pytest.fixture
def course(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises")
    return tmp_path


@pytest.mark.parametrize("command", ["start", "list", "progress"])
def test_help_imports_no_heavy_module(command, course):
    seen, output = run_cli(command, "--help", cwd=course, env={"MHA_COURSE_ROOT": str(course)})
    assert seen["code"] == 0, output
    assert seen["heavy"] == [], f"`python -m mha_lib {command} --help` imported {seen['heavy']}"
    assert "usage: python -m mha_lib" in output


def test_start_and_list_import_no_heavy_module_and_answer_at_once(course):
    env = {"MHA_COURSE_ROOT": str(course)}
    start = time.perf_counter()
    seen, output = run_cli("start", "01", cwd=course, env=env)
    seconds = time.perf_counter() - start
    assert seen == {"code": 0, "heavy": []}, output
    assert (course / "workspace" / "01_dot_product_attention.ipynb").exists()
    # Python's own start-up included; a loaded 2-core machine still stays far below this.
    assert seconds < 5, f"python -m mha_lib start took {seconds:.1f} s"
    assert run_cli("start", "01", cwd=course, env=env)[0] == {"code": 3, "heavy": []}  # kept
    assert run_cli("list", cwd=course, env=env)[0] == {"code": 0, "heavy": []}


def test_progress_imports_no_pytorch_in_its_own_process(course):
    """The notebooks run in their own kernels; the command itself stays light."""
    seen, output = run_cli("progress", cwd=course, env={"MHA_COURSE_ROOT": str(course)})
    assert seen["code"] == 0, output
    assert "torch" not in seen["heavy"] and "numpy" not in seen["heavy"], seen
    assert "exercises done" in output


def test_import_mha_lib_alone_is_light():
    code = f"import sys, mha_lib; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"`import mha_lib` imported {result.stdout.strip()}"


def test_every_name_in_all_resolves_to_its_submodules_object():
    for name in mha_lib.__all__:
        value = getattr(mha_lib, name)
        module = importlib.import_module(f"mha_lib.{mha_lib._EXPORTS[name]}")
        assert value is getattr(module, name), name
    assert set(mha_lib.__all__) <= set(dir(mha_lib))
    namespace: dict = {}
    exec("from mha_lib import *", namespace)  # noqa: S102 - the star import itself is under test
    assert set(mha_lib.__all__) <= set(namespace)
    from mha_lib import MultiHeadAttention, causal_mask

    assert MultiHeadAttention is mha_lib.multi_head.MultiHeadAttention
    assert causal_mask is mha_lib.masks.causal_mask


def test_submodules_and_unknown_names():
    assert mha_lib.sentiment is importlib.import_module("mha_lib.sentiment")
    assert mha_lib.checks.check_causal_mask is not None
    with pytest.raises(AttributeError, match="module 'mha_lib' has no attribute 'MultiheadAttention'"):
        mha_lib.MultiheadAttention  # noqa: B018 - a typo must fail as usual
    assert not hasattr(mha_lib, "_private")
    assert mha_lib.__version__


def test_the_table_all_and_the_type_checking_imports_agree():
    """Adding a name means adding it to _EXPORTS and to the TYPE_CHECKING block."""
    tree = ast.parse((ROOT / "mha_lib" / "__init__.py").read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"]
    assert len(blocks) == 1, "mha_lib/__init__.py needs one `if TYPE_CHECKING:` block"
    imported = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.unparse(node)
        for alias in node.names:
            # `import X as X` marks a re-export for type checkers
            assert alias.asname == alias.name, f"write `from .{node.module} import {alias.name} as {alias.name}`"
            imported[alias.name] = node.module
    assert imported == mha_lib._EXPORTS, "the TYPE_CHECKING imports and _EXPORTS differ"
    assert sorted(mha_lib.__all__) == sorted(mha_lib._EXPORTS), "__all__ and _EXPORTS differ"
    (assignment,) = [n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"]
    assert isinstance(assignment.value, ast.List), "__all__ must be a literal list: type checkers read it"
    eager = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
             and not (isinstance(n, ast.ImportFrom) and n.module in ("__future__", "typing"))
             and not (isinstance(n, ast.Import) and [a.name for a in n.names] == ["importlib"])]
    assert not eager, f"mha_lib/__init__.py imports eagerly: {[ast.unparse(n) for n in eager]}"
