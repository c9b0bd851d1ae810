"""What each door imports: the learner's commands never load PyTorch; ``import mha_lib`` gives the library.

``make exercise`` and ``make progress`` run ``python -m mha_course``, a package apart from
``mha_lib``: ``python -m mha_lib ...`` runs ``mha_lib/__init__.py`` first, which imports
PyTorch, seconds before a file is copied. These tests prove that the learner's commands import
no heavy module (nor nbformat, nbclient and the kernel where no notebook runs), that
``mha_course`` imports nothing from ``mha_lib``, that the Makefile calls it, and that
``mha_lib``'s plain imports give every name of ``__all__`` and the course's subpackages.
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
HEAVY = ("torch", "numpy", "matplotlib", "nbformat", "nbclient", "jupyter_client", "mha_lib")
COURSE_FILES = sorted((ROOT / "mha_course").rglob("*.py"))

# Runs `python -m mha_course ARGS` in this process (as runpy does for -m), then prints which
# heavy modules it imported, as JSON, on the last line.
PROBE = """
import json, runpy, sys
sys.argv = ["python -m mha_course", *sys.argv[1:]]
try:
    runpy.run_module("mha_course", run_name="__main__", alter_sys=True)
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
    assert seen["heavy"] == [], f"`python -m mha_course {command} --help` imported {seen['heavy']}"
    assert "usage: python -m mha_course" in output


def test_start_and_list_import_no_heavy_module_and_answer_at_once(course):
    env = {"MHA_COURSE_ROOT": str(course)}
    start = time.perf_counter()
    seen, output = run_cli("start", "01", cwd=course, env=env)
    seconds = time.perf_counter() - start
    assert seen == {"code": 0, "heavy": []}, output
    assert (course / "workspace" / "01_dot_product_attention.ipynb").exists()
    # Python's own start-up included (about 0.1 s when idle); a loaded 2-core machine stays far below this.
    assert seconds < 5, f"python -m mha_course start took {seconds:.1f} s"
    assert run_cli("start", "01", cwd=course, env=env)[0] == {"code": 3, "heavy": []}  # kept
    assert run_cli("list", cwd=course, env=env)[0] == {"code": 0, "heavy": []}


def test_progress_imports_no_pytorch_in_its_own_process(course):
    """The notebooks run in their own kernels; the command itself stays light."""
    seen, output = run_cli("progress", cwd=course, env={"MHA_COURSE_ROOT": str(course)})
    assert seen["code"] == 0, output
    assert not {"torch", "numpy", "mha_lib"} & set(seen["heavy"]), seen
    assert "exercises done" in output


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_mha_course_imports_nothing_from_mha_lib():
    """Not at the top of a module, nor inside a function: every module of mha_course, checked."""
    modules = [module_name(path) for path in COURSE_FILES]
    assert {"mha_course", "mha_course.__main__", "mha_course.workspace", "mha_course.progress"} <= set(modules)
    for path in COURSE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            assert not [n for n in names if n.split(".")[0] in ("mha_lib", "torch")], (
                f"{path.relative_to(ROOT)}: {ast.unparse(node)}")
    importable = [m for m in modules if m != "mha_course.__main__"]  # importing __main__ would run the command
    code = (f"import importlib, sys\nfor m in {importable!r}: importlib.import_module(m)\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"importing mha_course imported {result.stdout.strip()}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(("target", "command"), [("exercise N=01", "-m mha_course start 01"),
                                                  ("progress", "-m mha_course progress")])
def test_make_runs_the_learner_commands_from_mha_course(target, command):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(["make", "-n", "-o", ".venv/.installed", *target.split()], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True)
    assert command in result.stdout, result.stdout


def test_python_m_mha_lib_is_the_same_command(course):
    """The notebooks name ``python -m mha_lib start NN``: it answers too, after importing the library."""
    result = subprocess.run([sys.executable, "-m", "mha_lib", "list"], cwd=course, capture_output=True, text=True,
                            env=dict(os.environ, MHA_COURSE_ROOT=str(course)), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "01_dot_product_attention" in result.stdout


def _imported_names() -> dict[str, str]:
    """Each name that mha_lib/__init__.py imports from one of its modules, and that module."""
    tree = ast.parse((ROOT / "mha_lib" / "__init__.py").read_text())
    return {alias.asname or alias.name: node.module for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module for alias in node.names}


def test_every_name_in_all_is_imported_from_its_module():
    """``__all__`` is the one list: exactly the names ``__init__.py`` imports from the modules."""
    imported = _imported_names()
    assert sorted(mha_lib.__all__) == sorted(imported), "__all__ and the imports of mha_lib/__init__.py differ"
    for name, module in imported.items():
        assert getattr(mha_lib, name) is getattr(importlib.import_module(f"mha_lib.{module}"), name), name
    namespace: dict = {}
    exec("from mha_lib import *", namespace)  # noqa: S102 - the star import itself is under test
    assert set(mha_lib.__all__) <= set(namespace)
    from mha_lib import MultiHeadAttention, causal_mask

    assert MultiHeadAttention is mha_lib.multi_head.MultiHeadAttention
    assert causal_mask is mha_lib.masks.causal_mask


def test_import_mha_lib_gives_its_subpackages():
    code = ("import mha_lib\n"
            "print(mha_lib.sentiment.__name__, mha_lib.induction.__name__, mha_lib.bench.decode.__name__,"
            " callable(mha_lib.checks.check_causal_mask))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.split() == ["mha_lib.sentiment", "mha_lib.induction", "mha_lib.bench.decode", "True"]
    with pytest.raises(AttributeError, match="module 'mha_lib' has no attribute 'MultiheadAttention'"):
        mha_lib.MultiheadAttention  # noqa: B018 - a typo must fail as usual
    assert mha_lib.__version__
