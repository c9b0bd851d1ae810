"""How nbval's kernels start under the repository's conftest.py: threads and forking.

With several pytest-xdist workers, each worker and every kernel it starts get their share of the
cores, and on the CPU of a Linux machine each kernel is forked from a server that imported PyTorch
once (mha_course.progress.forking). Here: the two rules, what a kernel of a real nbval run finds (forked,
its thread count, a process of its own, the variables it was given), and that MHA_NBVAL_FORK=0
starts kernels from scratch. That forked kernels print what fresh ones do is what the whole
notebook suite shows: its stored outputs come from fresh kernels (`make notebooks`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _root_conftest():
    spec = importlib.util.spec_from_file_location("course_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = _root_conftest()
REPORT = """\
import json, os, sys
import torch
report = {"pid": os.getpid(), "threads_var": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads(),
          "raise": os.environ.get("MHA_CHECK_RAISE"), "names": sorted(n for n in dir() if not n.startswith("_"))}
"""


def test_threads_are_shared_only_when_several_workers_run(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert course.kernel_threads() is None, "one worker: the default thread count"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for workers in (1, 2, 3, 64):
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
        expected = None if workers == 1 else str(max(1, cores // workers))
        assert course.kernel_threads() == expected, workers
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "two")
    assert course.kernel_threads() is None
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert course.kernel_threads() is None, "a thread count the user set is kept"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernels are forked on Linux only")
def test_kernels_are_forked_only_for_the_cpu(monkeypatch):
    monkeypatch.delenv("MHA_NBVAL_FORK", raising=False)
    monkeypatch.setenv("MHA_DEVICE", "cpu")
    assert course.fork_kernels()
    for device in ("cuda", "cuda:1", "mps"):
        monkeypatch.setenv("MHA_DEVICE", device)
        assert not course.fork_kernels(), device
    monkeypatch.delenv("MHA_DEVICE")
    gpu = any(Path(node).exists() for node in course.GPU_NODES)
    assert course.fork_kernels() is not gpu, "without MHA_DEVICE, a visible GPU means fresh kernels"
    monkeypatch.setenv("MHA_DEVICE", "cpu")
    monkeypatch.setenv("MHA_NBVAL_FORK", "0")
    assert not course.fork_kernels()


def _run(tmp_path: Path, env_extra: dict[str, str], *args: str) -> list[dict]:
    """nbval (with the repository's conftest.py) on two notebooks that write what their kernel finds."""
    folder = tmp_path / "course"
    folder.mkdir()
    shutil.copy(ROOT / "conftest.py", folder / "conftest.py")
    for name in ("a", "b"):
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        first = "import sys\npreloaded = 'torch' in sys.modules and 'matplotlib.pyplot' in sys.modules"
        write = REPORT + f"report['preloaded'] = preloaded\nopen({name + '.json'!r}, 'w').write(json.dumps(report))"
        nb.cells = [nbformat.v4.new_code_cell(first), nbformat.v4.new_code_cell(write)]
        nbformat.write(nb, folder / f"{name}.ipynb")
    (folder / "test_worker.py").write_text(  # a plain test, run by a worker too
        "import json, os, torch\n\ndef test_worker():\n    open('worker.json', 'w').write(json.dumps("
        "{'threads_var': os.environ.get('OMP_NUM_THREADS'), 'threads': torch.get_num_threads()}))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MHA_NBVAL_FORK", "MHA_CHECK_RAISE", "PYTEST_XDIST_WORKER_COUNT")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               MHA_DEVICE="cpu", **env_extra)
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p", "no:cacheprovider",
                          "-p", "no:randomly", "-q", *args, "a.ipynb", "b.ipynb", "test_worker.py"],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return [json.loads((folder / f"{name}.json").read_text()) for name in ("a", "b", "worker")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernels are forked on Linux only")
def test_two_notebooks_at_once_get_forked_kernels_with_their_share_of_threads(tmp_path):
    *reports, worker = _run(tmp_path, {}, "-n", "2", "--dist", "load")
    cores = len(os.sched_getaffinity(0))
    assert worker == {"threads_var": str(max(1, cores // 2)), "threads": max(1, cores // 2)}, \
        "a worker's own tests (and what they start) get its share of the cores too"
    for report in reports:
        assert report["preloaded"], "the kernel was not forked: PyTorch and matplotlib were not imported already"
        assert report["threads_var"] == str(max(1, cores // 2)) and report["threads"] == max(1, cores // 2)
        assert report["raise"] == "1", "the kernel lost the variables nbval's setup gives it"
        assert set(report["names"]) <= {"In", "Out", "exit", "quit", "get_ipython", "open", "json", "os", "sys",
                                        "torch", "preloaded"}, "a forked kernel's namespace is not empty"
    assert reports[0]["pid"] != reports[1]["pid"], "two notebooks, one kernel?"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernels are forked on Linux only")
def test_mha_nbval_fork_0_starts_kernels_from_scratch(tmp_path):
    *reports, worker = _run(tmp_path, {"MHA_NBVAL_FORK": "0"}, "-p", "no:xdist")
    assert worker["threads_var"] is None
    for report in reports:
        assert not report["preloaded"], "MHA_NBVAL_FORK=0, yet the kernel found PyTorch imported"
        assert report["threads_var"] is None, "one notebook at a time: no thread count is set"
        assert report["raise"] == "1"
