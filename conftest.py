"""How nbval runs the notebooks (`make test`, `make test-gpu`, the oldest-PyTorch job).

A failed check fails the run. nbval's lax mode (`--nbval-lax`, on the GPU and with the oldest
PyTorch) compares no outputs: only an exception fails a cell, and a check *returns* its verdict.
So the kernel that nbval starts for a notebook gets MHA_CHECK_RAISE=1, with which a check that
failed (❌) or met an error (💥) raises after showing its verdict (mha_lib/checks/_result.py);
"not implemented yet" (⏳, the exercises' stubs) never raises. The variable is set only while
nbval starts its kernel, never for the tests themselves, nor for a learner's `make progress`.
tests/test_check_display.py proves it with a notebook that fails.

Two more settings make the notebooks' share of `make test` about twice as fast on 2 cores. Neither
changes what a notebook prints: nbval compares every stored output, as before.

- **Threads.** With N notebooks at once (pytest-xdist's workers) on C cores, each kernel starts with
  OMP_NUM_THREADS = max(1, C // N), unless it is set already. Two kernels of 2 threads each on 2
  cores stall each other: chapter 03's rank cell took 38 s that way, instead of under a second.
- **Forked kernels.** Each kernel is forked from a server that imported PyTorch, mha_lib and
  matplotlib once (mha_course.progress.forking, as `make progress` and `grade` do), instead of
  importing them again: about 3 s less per notebook. Only on the CPU of a Linux machine (no
  GPU device visible, or MHA_DEVICE=cpu): a GPU's driver and a Mac's frameworks are not forked.
  MHA_NBVAL_FORK=0 starts every kernel from scratch. The notebooks' outputs themselves come from
  kernels started from scratch (`make notebooks`), so a notebook that used a module it never
  imported would fail there.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHECK_RAISE = "MHA_CHECK_RAISE"  # = mha_lib.checks.CHECK_RAISE (not imported: no torch at collection)
FORK = "MHA_NBVAL_FORK"  # 0: every notebook's kernel starts from scratch
THREADS = "OMP_NUM_THREADS"


def kernel_threads() -> str | None:
    """The kernels' thread count when several notebooks run at once, or None (leave it as it is)."""
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
    return not any(Path(node).exists() for node in ("/dev/nvidiactl", "/dev/kfd"))  # NVIDIA's, AMD's GPUs


_manager: list[Any] = []  # the kernel manager class, chosen at the first kernel's start


def _kernel_manager(**kwargs: Any) -> Any:
    """What nbval calls as ``KernelManager(...)``: a forking one, or jupyter_client's own where the fork
    server can't start. Chosen at the first kernel's start, with the environment kernels start with."""
    if not _manager:
        from jupyter_client.manager import KernelManager

        try:
            from mha_course.progress.forking import kernel_manager_class
        except ImportError:  # a copy of this file outside the course (tests/test_check_display.py)
            _manager.append(KernelManager)
        else:
            _manager.append(kernel_manager_class(dict(os.environ), blocking=True) or KernelManager)
    return _manager[0](**kwargs)


def pytest_configure(config: pytest.Config) -> None:
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
    settings = {CHECK_RAISE: "1"}  # the notebook's kernel starts in this setup and inherits them
    threads = kernel_threads()
    if threads is not None:
        settings[THREADS] = threads
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value
