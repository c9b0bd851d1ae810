"""The seed study: chapter 07's and chapter 12's models trained from many independent seeds.

One trained model is one sample: another seed gives another model. The chapters therefore
quote what held over the runs of this study, read from the committed file ``study.json``
next to this module (:func:`load_study`), and assert it where they state it. Re-run it with
``make study`` or ``python -m mha_lib.sentiment study --help``.

Each run is independent (its own initialisation and data) and measured as the chapters
measure: :mod:`.run` trains and measures one. This module runs many of them (:func:`study_jobs`,
:func:`run_study`, in worker processes), writes and reads the file (:func:`save_study`,
:func:`load_study`), and reads the runs back (:class:`Study`). What the chapters state about
them, with the counts, is in :mod:`.findings`.

**Kernel paths are replicas, not samples.** The two-head runs are repeated on a second CPU
kernel path (:data:`REPLICA_KERNEL`, plain C++ kernels chosen with ``ATEN_CPU_CAPABILITY``).
A replica is the same seed and data computed with other rounding; it says how often the
rounding alone changes an outcome, and is marked ``"replica": true`` and left out of every
count (:func:`~mha_lib.sentiment.findings.independent`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .run import CONFIG, PARTS, Run, run_seed

__all__ = ["HEADS", "REPLICA_KERNEL", "RUNS", "STUDY_FILE", "THREADS", "Study", "load_study", "progress_line", "run_study",
           "save_study", "study_jobs"]

STUDY_FILE = Path(__file__).with_name("study.json")
HEADS = (1, 2, 4, 8)  # heads per configuration, d_model fixed at 48: d_k = 48, 24, 12, 6
RUNS = {1: 24, 2: 40, 4: 24, 8: 24}  # independent runs (seeds 0, 1, ...) per number of heads
REPLICA_KERNEL = "default"  # the two-head runs again, on PyTorch's plain C++ CPU kernels
THREADS = 1  # per training process: a model this small trains fastest on one thread


def progress_line(label: str, done: int, total: int, started: float, unit: str = "seeds") -> None:
    """A plain-text progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""
    width = 24
    filled = round(width * done / total)
    line = f"{label:>8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}, {time.perf_counter() - started:.0f} s"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + ("\n" if done == total else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def study_jobs(seeds: Sequence[int] | None = None, heads: Sequence[int] = HEADS,
               replicas: bool = True) -> list[tuple[int, int, bool]]:
    """``(seed, num_heads, replica)`` for every run: each ``H`` in ``heads`` with its
    :data:`RUNS` seeds (or ``seeds``), and, if ``replicas``, the two-head seeds again as replicas."""
    jobs = [(seed, H, False) for H in heads for seed in (seeds if seeds is not None else range(RUNS[H]))]
    if replicas and 2 in heads:
        jobs += [(seed, 2, True) for seed, H, _ in list(jobs) if H == 2]
    return jobs


def _job(job: tuple[int, int, bool, str, tuple[str, ...]]) -> Run:
    seed, num_heads, replica, device, parts = job
    torch.set_num_threads(THREADS)  # this process is ours
    return run_seed(seed, num_heads, parts, device, replica=replica)


def run_study(jobs: Sequence[tuple[int, int, bool]], parts: Iterable[str] = PARTS, device: torch.device | str = "cpu",
              workers: int = 2, progress: bool = True) -> list[Run]:
    """Every job of :func:`study_jobs`, in ``workers`` processes of one thread each, with a
    progress bar on stderr; the replicas in processes that take :data:`REPLICA_KERNEL`.
    Returns the runs in the order of ``jobs``."""
    import multiprocessing

    parts = tuple(parts)
    runs: dict[tuple[int, int, bool], Run] = {}
    started, done = time.perf_counter(), 0
    for replica in (False, True):
        # a replica repeats the heads part only: chapter 07's measurements on other rounding
        job_parts = tuple(p for p in parts if p == "heads") if replica else parts
        batch = [(seed, H, rep, str(device), job_parts) for seed, H, rep in jobs if rep == replica]
        batch.sort(key=lambda job: -job[1])  # the slowest (most heads) first: the workers end together
        if not batch:
            continue
        saved = os.environ.get("ATEN_CPU_CAPABILITY")
        if replica:  # a spawned process reads it when it imports torch
            os.environ["ATEN_CPU_CAPABILITY"] = REPLICA_KERNEL
        try:
            with multiprocessing.get_context("spawn").Pool(max(1, workers)) as pool:
                for run in pool.imap_unordered(_job, batch):
                    runs[(run["seed"], run["num_heads"], run["replica"])] = run
                    done += 1
                    if progress:
                        progress_line("study", done, len(jobs), started, unit="runs")
        finally:
            if saved is None:
                os.environ.pop("ATEN_CPU_CAPABILITY", None)
            else:
                os.environ["ATEN_CPU_CAPABILITY"] = saved
    return [runs[job] for job in jobs]


@dataclass
class Study:
    """The runs of a seed study, and small helpers to read them.

    Attributes:
        runs: one dict per seed and kernel path (see the module's docstring).
        config: the data, model and training set-up the runs used.
        about: how the file was made.
    """

    runs: list[Run]
    config: dict[str, Any] = field(default_factory=dict)
    about: dict[str, Any] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        """The kernel paths in the study, in the order of their first run."""
        return list(dict.fromkeys(run["path"] for run in self.runs))

    @property
    def seeds(self) -> list[int]:
        return sorted({run["seed"] for run in self.runs})

    def values(self, fn: Callable[[Run], Any], path: str | None = None,
               where: Callable[[Run], bool] | None = None) -> list[Any]:
        """``fn(run)`` for every run (of one kernel path, and for which ``where`` holds, if given)."""
        return [fn(run) for run in self.runs
                if (path is None or run["path"] == path) and (where is None or where(run))]

    def count(self, predicate: Callable[[Run], bool], path: str | None = None,
              where: Callable[[Run], bool] | None = None) -> tuple[int, int]:
        """``(k, n)``: the predicate holds in ``k`` of the ``n`` runs (selected as in :meth:`values`)."""
        hits = self.values(predicate, path, where)
        return sum(map(bool, hits)), len(hits)

    def span(self, fn: Callable[[Run], float], path: str | None = None,
             where: Callable[[Run], bool] | None = None) -> tuple[float, float]:
        """``(min, max)`` of ``fn(run)`` over the runs (selected as in :meth:`values`)."""
        values = self.values(fn, path, where)
        return min(values), max(values)


def save_study(runs: list[Run], path: str | Path = STUDY_FILE, command: str = "") -> Path:
    """Write the runs as JSON, one run per line (small diffs when a study is re-run)."""
    path = Path(path)
    header = {"about": {"what": "mha_lib.sentiment seed study (chapters 07 and 12)", "command": command,
                        "parts": list(PARTS), "heads": list(HEADS), "replica_kernel": REPLICA_KERNEL},
              "config": CONFIG}
    lines = [json.dumps(run, separators=(",", ":"), sort_keys=False) for run in runs]
    text = json.dumps(header, indent=1)[:-2] + ',\n "runs": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    path.write_text(text)
    return path


def load_study(path: str | Path | None = None) -> Study:
    """The committed study (``mha_lib/sentiment/study.json``), or the file at ``path``."""
    path = Path(path) if path is not None else STUDY_FILE
    if not path.exists():
        raise FileNotFoundError(f"no study at {path}; make one with `python -m mha_lib.sentiment study`")
    data = json.loads(path.read_text())
    return Study(runs=data["runs"], config=data.get("config", {}), about=data.get("about", {}))
