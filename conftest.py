"""How nbval runs the notebooks (`make test`, `make test-gpu`, the oldest-PyTorch job).

A failed check fails the run. nbval's lax mode (`--nbval-lax`, on the GPU and with the oldest
PyTorch) compares no outputs: only an exception fails a cell, and a check *returns* its verdict.
So the kernel that nbval starts for a notebook gets MHA_CHECK_RAISE=1, with which a check that
failed (❌) or met an error (💥) raises after showing its verdict (mha_lib/checks/_result.py);
"not implemented yet" (⏳, the exercises' stubs) never raises. The variable is set only while
nbval starts its kernel, never for the tests themselves, nor for a learner's `make progress`.
tests/test_check_display.py proves it with a notebook that fails.

Two more settings make `make test` faster on 2 cores (its notebooks about twice as fast). Neither
changes what a notebook prints: nbval compares every stored output, as before.

- **Threads.** With N pytest-xdist workers on C cores, each worker, and all it starts (nbval's
  kernels, the subprocesses of tests), uses OMP_NUM_THREADS = max(1, C // N) threads, unless the
  variable is set already. Two kernels of 2 threads each on 2 cores stall each other: chapter 03's
  rank cell took 38 s that way, instead of under a second.
- **Forked kernels.** Each kernel is forked from a server that imported PyTorch, mha_lib and
  matplotlib once (mha_course.progress.forking, as `make progress` and `grade` do), instead of
  importing them again: about 3 s less per notebook. Only on the CPU of a Linux machine (no
  GPU device visible, or MHA_DEVICE=cpu): a GPU's driver and a Mac's frameworks are not forked.
  MHA_NBVAL_FORK=0 starts every kernel from scratch. The notebooks' outputs themselves come from
  kernels started from scratch (`make notebooks`), so a notebook that used a module it never
  imported would fail there.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHECK_RAISE = "MHA_CHECK_RAISE"  # = mha_lib.checks.CHECK_RAISE (not imported: no torch at collection)
FORK = "MHA_NBVAL_FORK"  # 0: every notebook's kernel starts from scratch
THREADS = "OMP_NUM_THREADS"
GPU_NODES = ("/dev/nvidiactl", "/dev/kfd")  # there when an NVIDIA or an AMD GPU is visible


def kernel_threads() -> str | None:
    """A worker's share of the cores when several run at once, or None (leave the thread count as it is)."""
    if THREADS in os.environ:
        return None
    try:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        return None
    if workers <= 1:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return str(max(1, cores // workers))


def fork_kernels() -> bool:
    """Whether nbval's kernels are forked: not asked off, on Linux, and the notebooks run on the CPU."""
    if os.environ.get(FORK, "").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    device = os.environ.get("MHA_DEVICE", "").strip().lower()
    if device:
        return device == "cpu"
    return not any(Path(node).exists() for node in GPU_NODES)


@functools.cache
def _manager_class() -> type:
    """A forking kernel manager, or jupyter_client's own where the fork server can't start. Chosen once, at
    the first kernel's start, with the environment kernels start with."""
    from jupyter_client.manager import KernelManager

    try:
        from mha_course.progress.forking import kernel_manager_class
    except ImportError:  # a copy of this file outside the course (tests/test_check_display.py)
        return KernelManager
    return kernel_manager_class(dict(os.environ), blocking=True) or KernelManager


def _kernel_manager(**kwargs: Any) -> Any:
    """What nbval calls as ``KernelManager(...)``."""
    return _manager_class()(**kwargs)


def pytest_configure(config: pytest.Config) -> None:
    threads = kernel_threads()
    if threads is not None:  # a pytest-xdist worker: its share, for itself and all it starts
        os.environ[THREADS] = threads
        if "torch" in sys.modules:  # imported already: the variable came too late for it
            sys.modules["torch"].set_num_threads(int(threads))
    if not (getattr(config.option, "nbval", False) or getattr(config.option, "nbval_lax", False)):
        return
    if not fork_kernels():
        return
    import nbval.kernel

    if hasattr(nbval.kernel, "KernelManager"):  # nbval 0.11 starts its kernels with it (start_new_kernel)
        nbval.kernel.KernelManager = _kernel_manager


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if not type(item).__module__.startswith("nbval"):
        yield
        return
    previous = os.environ.get(CHECK_RAISE)
    os.environ[CHECK_RAISE] = "1"  # the notebook's kernel starts in this setup and inherits it
    try:
        yield
    finally:
        if previous is None:
            del os.environ[CHECK_RAISE]
        else:
            os.environ[CHECK_RAISE] = previous
