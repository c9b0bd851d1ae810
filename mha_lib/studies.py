"""What every seed study shares: running many independent jobs, and the JSON file of their runs.

A seed study trains one small model per job (a seed and a configuration), measures it, and
keeps one *run record* per job: a dict of plain JSON values. The chapters then quote what
held over the runs. :mod:`mha_lib.sentiment.study` and :mod:`mha_lib.induction.study` are two;
a new study needs only its own job function, run record and findings, and this module for
the rest:

- **Running the jobs** (:func:`run_jobs`): ``fn(job)`` for every job, in ``workers`` processes
  of one thread each (or here, with one worker), the longest first if a ``cost`` is given, with
  a progress bar on stderr (:class:`Progress`, :func:`progress_line`). The records come back in
  the order of the jobs, whatever order they finished in; a job that fails stops the study with
  a :class:`JobError` that names it.
- **Seeding is the job's own.** Worker processes are reused from one job to the next, so a job
  function seeds every generator it draws from with its job's seed (as ``run_seed`` does with
  :func:`~mha_lib.device.seed_everything` and its own ``torch.Generator``), and its record
  says which (``"seed"``, ``"data_seed"``). Then a run is the same whichever worker ran it.
- **What computed a run**: :func:`kernel_path`, for each record (the CPU kernel path, PyTorch's
  version, the threads); :func:`made_with`, for the whole file.
- **The file** (:func:`save_study`, :func:`read_study`, :func:`load_study`): one JSON object,
  ``{"format": 1, "about": {...}, <the study's own header>, "runs": [one record per line]}``,
  so that a re-run gives a small diff. ``"about"`` says how the file was made (``"what"``,
  ``"command"``, ``"seconds"``, :func:`made_with`). Files written before ``"format"`` existed
  are format 1; a file of a later format is refused, with what to do.
- **Reading the runs back**: :class:`Study` (counts, spans, the runs of one configuration).
- **The command line**: :func:`parse_seeds` and :func:`add_study_arguments` (``--seeds``,
  ``--workers``, ``--output``, ``--device``), which every ``python -m mha_lib.<study> study`` takes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import torch

__all__ = ["FORMAT", "JobError", "Progress", "Record", "Study", "add_study_arguments", "kernel_path", "load_study",
           "made_with", "parse_seeds", "progress_line", "read_study", "run_jobs", "save_study"]

FORMAT = 1  # the file's layout; raise it when a reader of today could misread a new file
Record = dict[str, Any]  # one run: plain JSON values
Job = TypeVar("Job")
Result = TypeVar("Result")


# --- Progress -------------------------------------------------------------------------------


def progress_line(label: str, done: int, total: int, started: float, unit: str = "seeds",
                  stream: TextIO | None = None) -> None:
    """A plain-text progress bar (``stream``, default stderr): ``"   study [######......] 3/12 runs, 41 s"``,
    redrawn in place on a terminal, one line per step otherwise. ``started``: a ``time.perf_counter()``."""
    stream = sys.stderr if stream is None else stream
    width = 24
    filled = round(width * done / total)
    line = f"{label:>8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}, {time.perf_counter() - started:.0f} s"
    if stream.isatty():
        stream.write("\r" + line + ("\n" if done == total else ""))
    else:
        stream.write(line + "\n")
    stream.flush()


class Progress:
    """A progress bar over ``total`` jobs, which several calls of :func:`run_jobs` may share
    (a study that runs its jobs in batches counts them all on one bar)."""

    def __init__(self, total: int, label: str = "study", unit: str = "runs", stream: TextIO | None = None) -> None:
        self.total, self.label, self.unit, self.stream = total, label, unit, stream
        self.done = 0
        self.started = time.perf_counter()

    def step(self) -> None:
        """One more job done: draw the bar."""
        self.done += 1
        progress_line(self.label, self.done, self.total, self.started, self.unit, self.stream)


# --- Running the jobs -----------------------------------------------------------------------


class JobError(RuntimeError):
    """A job of a study failed; the message names the job and gives the error (and, from a
    worker process, its traceback)."""


def _work(task: tuple[Callable[[Any], Any], int, Any, int | None]) -> tuple[int, Any, str | None]:
    """In a worker process: ``(index, fn(job), None)``, or ``(index, None, traceback)`` if it failed
    (a traceback always pickles; some exceptions do not)."""
    fn, index, job, threads = task
    if threads is not None:
        torch.set_num_threads(threads)  # this process is the study's
    try:
        return index, fn(job), None
    except Exception:
        return index, None, traceback.format_exc()


def _failed(job: Any, error: str) -> JobError:
    last = error.strip().splitlines()[-1]
    return JobError(f"job {job!r} failed: {last}\n\nin the worker process:\n{error}")


def run_jobs(fn: Callable[[Job], Result], jobs: Sequence[Job], workers: int = 2, threads: int | None = 1,
             cost: Callable[[Job], float] | None = None, env: Mapping[str, str] | None = None,
             progress: bool | Progress = True) -> list[Result]:
    """``[fn(job) for job in jobs]``, computed in ``workers`` processes side by side.

    Args:
        fn: a module-level function (worker processes import it by name), which takes one job
            and returns its record.
        jobs: anything that pickles, e.g. ``(seed, num_heads)`` tuples.
        workers: processes side by side (spawned: each imports PyTorch afresh). With 1 and no
            ``env``, the jobs run here, one after the other.
        threads: PyTorch's threads per job (``torch.set_num_threads``); here, restored after
            the jobs. None leaves them as they are.
        cost: if given, the jobs with the highest cost start first, so that the workers end
            together; the order of the results does not change.
        env: environment variables the worker processes start with (e.g. ``ATEN_CPU_CAPABILITY``,
            which PyTorch reads when it is imported); always in processes, even with one worker.
        progress: True for a bar on stderr, a :class:`Progress` to advance one shared with other
            calls, or False.

    Returns the results in the order of ``jobs``, whatever order they finished in. Raises
    :class:`JobError`, naming the job, at the first job that fails (the other workers stop).
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if not jobs:
        return []
    bar = Progress(len(jobs)) if progress is True else progress if isinstance(progress, Progress) else None
    order = list(range(len(jobs)))
    if cost is not None:
        order.sort(key=lambda i: -cost(jobs[i]))  # stable: equal costs keep the jobs' order
    results: dict[int, Result] = {}
    if workers == 1 and env is None:
        old = torch.get_num_threads()
        try:
            if threads is not None:
                torch.set_num_threads(threads)
            for i in order:
                try:
                    results[i] = fn(jobs[i])
                except Exception as error:
                    raise JobError(f"job {jobs[i]!r} failed: {type(error).__name__}: {error}") from error
                if bar:
                    bar.step()
        finally:
            torch.set_num_threads(old)
        return [results[i] for i in range(len(jobs))]

    import multiprocessing

    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})  # a spawned process starts with the environment of this one
    try:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for i, result, error in pool.imap_unordered(_work, [(fn, i, jobs[i], threads) for i in order]):
                if error is not None:
                    raise _failed(jobs[i], error)
                results[i] = result
                if bar:
                    bar.step()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return [results[i] for i in range(len(jobs))]


# --- What computed a run ---------------------------------------------------------------------


def kernel_path(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What computed a run, for its record: ``path`` (``"AVX512"``, ``"DEFAULT"``, ... or ``"CUDA"``),
    the ``ATEN_CPU_CAPABILITY`` setting, PyTorch's version and the number of CPU threads."""
    device = torch.device(device)
    return {
        "path": "CUDA" if device.type == "cuda" else torch.backends.cpu.get_cpu_capability(),
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY") or None,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def made_with() -> dict[str, str]:
    """What wrote a study file, for its ``"about"``: Python's and PyTorch's versions, this
    process's CPU kernel path and the platform. Each run's record has its own :func:`kernel_path`."""
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "platform": f"{platform.system()} {platform.machine()}"}


# --- The file --------------------------------------------------------------------------------


def save_study(runs: Sequence[Record], path: str | Path, about: Mapping[str, Any],
               header: Mapping[str, Any] | None = None) -> Path:
    """Write a study file: ``{"format", "about", <header>, "runs"}``, one run per line.

    ``about``: how it was made (``"what"``, ``"command"``, ``"seconds"``, ...), to which
    :func:`made_with` is added; ``header``: the study's own entries (its configuration, its
    baselines). Returns ``path``."""
    header = dict(header or {})
    if clash := {"format", "about", "runs"} & set(header):
        raise ValueError(f"the header may not hold {sorted(clash)}: save_study writes them")
    head = {"format": FORMAT, "about": {**about, "made_with": made_with()}, **header}
    lines = [json.dumps(run, separators=(",", ":")) for run in runs]
    path = Path(path)
    path.write_text(json.dumps(head, indent=1)[:-2] + ',\n "runs": [\n' + ",\n".join(lines) + "\n ]\n}\n")
    return path


def read_study(path: str | Path | None, *, default: Path, make: str) -> dict[str, Any]:
    """The parsed study file at ``path``, or at ``default`` (the shipped one) if None.

    ``make``: the command that makes one, which the errors name. Raises FileNotFoundError for a
    missing file and ValueError for one that is not a study file or of a format newer than
    :data:`FORMAT` (a file without ``"format"`` is format 1)."""
    path = Path(path) if path is not None else default
    if not path.exists():
        raise FileNotFoundError(f"no study at {path}; make one with `{make}`")
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path} is not a study file: it has no list of \"runs\"")
    version = data.get("format", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT:
        raise ValueError(f"{path} is a study file of format {version!r}, and this mha_lib reads format "
                         f"1 to {FORMAT}: update mha_lib (git pull), or make the file again with `{make}`")
    return data


def load_study(path: str | Path | None, *, default: Path, make: str) -> Study:
    """:func:`read_study`, as a :class:`Study` of its ``"runs"``, ``"config"`` and ``"about"``."""
    data = read_study(path, default=default, make=make)
    return Study(runs=data["runs"], config=data.get("config", {}), about=data.get("about", {}))


# --- Reading the runs back --------------------------------------------------------------------


@dataclass
class Study:
    """The runs of a seed study, and small helpers to read them.

    Attributes:
        runs: one record per run, in the order of the file.
        config: the data, model and training set-up the runs used.
        about: how the file was made (and what else the study's own header holds).
    """

    runs: list[Record]
    config: dict[str, Any] = field(default_factory=dict)
    about: dict[str, Any] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        """The kernel paths in the study (:func:`kernel_path`), in the order of their first run."""
        return list(dict.fromkeys(run["path"] for run in self.runs))

    @property
    def seeds(self) -> list[int]:
        """Every seed of the study, sorted, once each."""
        return sorted({run["seed"] for run in self.runs})

    def select(self, **fields: Any) -> list[Record]:
        """The runs whose fields have these values, e.g. ``select(config="learned", num_layers=2)``."""
        return [run for run in self.runs if all(run.get(name) == value for name, value in fields.items())]

    def values(self, fn: Callable[[Record], Any], path: str | None = None,
               where: Callable[[Record], bool] | None = None) -> list[Any]:
        """``fn(run)`` for every run (of one kernel path, and for which ``where`` holds, if given)."""
        return [fn(run) for run in self.runs
                if (path is None or run["path"] == path) and (where is None or where(run))]

    def count(self, predicate: Callable[[Record], bool], path: str | None = None,
              where: Callable[[Record], bool] | None = None) -> tuple[int, int]:
        """``(k, n)``: the predicate holds in ``k`` of the ``n`` runs (selected as in :meth:`values`)."""
        hits = self.values(predicate, path, where)
        return sum(map(bool, hits)), len(hits)

    def span(self, fn: Callable[[Record], float], path: str | None = None,
             where: Callable[[Record], bool] | None = None) -> tuple[float, float]:
        """``(min, max)`` of ``fn(run)`` over the runs (selected as in :meth:`values`)."""
        values = self.values(fn, path, where)
        return min(values), max(values)


# --- The command line -------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``"0-19"`` or ``"0,3,5-7"`` -> a list of seeds (an ``argparse`` type)."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            seeds += range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must look like 0-19 or 0,3,5-7, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"seeds must be non-negative and at least one, got {text!r}")
    return list(dict.fromkeys(seeds))


def add_study_arguments(parser: argparse.ArgumentParser, output: str) -> None:
    """The options every study's command takes: ``--seeds``, ``--workers`` (check ``>= 1`` with
    ``parser.error``), ``--output`` (default ``output``, in the current folder) and ``--device``."""
    parser.add_argument("--seeds", type=parse_seeds, default=None,
                        help="e.g. 100-104 or 0,3,5-7 (default: each configuration's own, from 0)")
    parser.add_argument("--workers", type=int, default=2, help="processes training side by side (default: 2)")
    parser.add_argument("--output", type=Path, default=Path(output),
                        help=f"the JSON file to write (default: {output} here)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the models train")
