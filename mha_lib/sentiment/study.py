"""The seed study: chapter 07's and chapter 12's models trained from many independent seeds.

One trained model is one sample: another seed gives another model. The chapters therefore
quote what held over the runs of this study, read from the committed file ``study.json``
next to this module (:func:`load_study`), and assert it where they state it. Re-run it with
``make study`` or ``python -m mha_lib.sentiment study --help``.

Each run is independent (its own initialisation and data) and measured as the chapters
measure: :mod:`.run` trains and measures one. This module says which runs make the study
(:func:`study_jobs`), runs them (:func:`run_study`) and writes and reads the file
(:func:`save_study`, :func:`load_study`, read back as a :class:`Study`), with the machinery
every seed study shares (:mod:`mha_lib.studies`: the worker processes, the progress bar, the
file's layout). What the chapters state about the runs, with the counts, is in :mod:`.findings`.

**Kernel paths are replicas, not samples.** The two-head runs are repeated on a second CPU
kernel path (:data:`REPLICA_KERNEL`, plain C++ kernels chosen with ``ATEN_CPU_CAPABILITY``).
A replica is the same seed and data computed with other rounding; it says how often the
rounding alone changes an outcome, and is marked ``"replica": true`` and left out of every
count (:func:`~mha_lib.sentiment.findings.independent`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from ..studies import Progress, Study, progress_line, run_jobs
from ..studies import load_study as _load_study
from ..studies import save_study as _save_study
from .run import CONFIG, PARTS, Run, run_seed

__all__ = ["HEADS", "REPLICA_KERNEL", "RUNS", "STUDY_FILE", "THREADS", "Study", "load_study", "progress_line", "run_study",
           "save_study", "study_jobs"]

STUDY_FILE = Path(__file__).with_name("study.json")
HEADS = (1, 2, 4, 8)  # heads per configuration, d_model fixed at 48: d_k = 48, 24, 12, 6
RUNS = {1: 24, 2: 40, 4: 24, 8: 24}  # independent runs (seeds 0, 1, ...) per number of heads
REPLICA_KERNEL = "default"  # the two-head runs again, on PyTorch's plain C++ CPU kernels
THREADS = 1  # per training process: a model this small trains fastest on one thread


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
    return run_seed(seed, num_heads, parts, device, replica=replica)


def _heads(job: tuple[int, int, bool, str, tuple[str, ...]]) -> int:
    return job[1]


def run_study(jobs: Sequence[tuple[int, int, bool]], parts: Iterable[str] = PARTS, device: torch.device | str = "cpu",
              workers: int = 2, progress: bool = True) -> list[Run]:
    """Every job of :func:`study_jobs`, in ``workers`` processes of :data:`THREADS` thread(s) each
    (:func:`~mha_lib.studies.run_jobs`), with a progress bar on stderr; the replicas in processes
    that take :data:`REPLICA_KERNEL`. Returns the runs in the order of ``jobs``."""
    parts = tuple(parts)
    bar = Progress(len(jobs)) if progress else False
    runs: dict[tuple[int, int, bool], Run] = {}
    for replica in (False, True):
        # a replica repeats the heads part only: chapter 07's measurements on other rounding
        job_parts = tuple(p for p in parts if p == "heads") if replica else parts
        batch = [job for job in jobs if job[2] == replica]
        env = {"ATEN_CPU_CAPABILITY": REPLICA_KERNEL} if replica else None  # a spawned process reads it
        done = run_jobs(_job, [(seed, H, rep, str(device), job_parts) for seed, H, rep in batch], workers=workers,
                        threads=THREADS, cost=_heads, env=env, progress=bar)  # the most heads (slowest) first
        runs.update(zip(batch, done))
    return [runs[job] for job in jobs]


def save_study(runs: list[Run], path: str | Path = STUDY_FILE, command: str = "", seconds: float | None = None) -> Path:
    """Write the runs as JSON, one run per line (small diffs when a study is re-run), with the
    command that made them and (``seconds``) how long it took."""
    about = {"what": "mha_lib.sentiment seed study (chapters 07 and 12)", "command": command,
             "parts": list(PARTS), "heads": list(HEADS), "replica_kernel": REPLICA_KERNEL}
    if seconds is not None:
        about["seconds"] = round(seconds)
    return _save_study(runs, path, about, header={"config": CONFIG})


def load_study(path: str | Path | None = None) -> Study:
    """The committed study (``mha_lib/sentiment/study.json``), or the file at ``path``."""
    return _load_study(path, default=STUDY_FILE, make="python -m mha_lib.sentiment study")
