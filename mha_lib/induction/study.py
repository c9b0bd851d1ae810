"""The seed study: chapter 08's one- and two-layer models trained from many independent seeds.

One trained model is one sample. Chapter 08 therefore quotes what held over the runs of
this study, read from the committed file ``study.json`` next to this module
(:func:`load_study`), draws every run, and checks the model the learner trains against the
study's range. Re-run it with ``make study`` or ``python -m mha_lib.induction study --help``.

Each run is independent (its own initialisation and data) and measured as the chapter
measures: :mod:`.run` trains and measures one. This module runs many of them
(:func:`study_jobs`, :func:`run_study`, in worker processes), writes and reads the file
(:func:`save_study`, :func:`load_study`, read back as a :class:`~mha_lib.studies.Study`), with
the machinery every seed study shares (:mod:`mha_lib.studies`), and ships one trained run, the model exercise 8.3
takes apart (:func:`save_trained`, :func:`load_trained`). What the chapter states about the
runs, with the counts, is in :mod:`.findings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..studies import Study, read_study, run_jobs
from ..studies import save_study as _save_study
from .model import AttentionOnlyTransformer
from .run import CONFIGS, Run, baselines, build_model, run_seed, train_run

__all__ = ["MODEL_FILE", "STUDY_FILE", "THREADS", "load_study", "load_trained", "run_study", "save_study",
           "save_trained", "study_jobs"]

STUDY_FILE = Path(__file__).with_name("study.json")
MODEL_FILE = Path(__file__).with_name("model_seed0.pt")  # exercise 8.3's trained model (save_trained)
THREADS = 1  # per run: a model this small trains fastest on one thread (two runs share the two cores)


def save_trained(path: str | Path = MODEL_FILE, seed: int = 0) -> Path:
    """Train the two-layer model of the study's seed ``seed`` (learned positions, one thread) and
    save its weights: the trained model exercise 8.3 takes apart (:func:`load_trained`)."""
    old = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        model, _ = train_run(seed, 2, "learned")
    finally:
        torch.set_num_threads(old)
    path = Path(path)
    torch.save({"seed": seed, "config": "learned", "num_layers": 2, "state_dict": model.state_dict()}, path)
    return path


def load_trained(path: str | Path | None = None, device: torch.device | str = "cpu") -> AttentionOnlyTransformer:
    """The shipped trained model (``model_seed0.pt``): the study's two-layer run of seed 0, trained
    once and saved, so that it is the same model on every machine. In evaluation mode."""
    path = Path(path) if path is not None else MODEL_FILE
    if not path.exists():
        raise FileNotFoundError(f"no trained model at {path}; make one with `python -m mha_lib.induction model`")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(saved["seed"], saved["num_layers"], CONFIGS[saved["config"]])
    model.load_state_dict(saved["state_dict"])
    return model.to(device).eval()


def study_jobs(seeds: Sequence[int] | None = None, names: Iterable[str] = CONFIGS) -> list[tuple[int, int, str]]:
    """``(seed, num_layers, name)`` for every run of the study; ``seeds`` overrides each configuration's own."""
    return [(seed, n, name) for name in names for n in CONFIGS[name]["layers"]
            for seed in (seeds if seeds is not None else range(CONFIGS[name]["seeds"]))]


def _job(job: tuple[int, int, str, str]) -> Run:
    seed, n, name, device = job
    return run_seed(seed, n, name, device)


def _cost(job: tuple[int, int, str, str]) -> int:
    """A run's rough cost, its training steps times (1 + its layers): the longest runs start first."""
    return CONFIGS[job[2]]["training"]["steps"] * (1 + job[1])


def run_study(jobs: Sequence[tuple[int, int, str]], device: torch.device | str = "cpu", workers: int = 2,
              progress: bool = True) -> list[Run]:
    """Every job of :func:`study_jobs`, in ``workers`` processes of :data:`THREADS` thread(s) each
    (:func:`~mha_lib.studies.run_jobs`; in this process with one worker), with a progress bar on stderr.
    Returns the runs in the order of ``jobs``."""
    return run_jobs(_job, [(seed, n, name, str(device)) for seed, n, name in jobs], workers=workers,
                    threads=THREADS, cost=_cost, progress=progress)


def save_study(runs: list[Run], path: str | Path = STUDY_FILE, command: str = "", seconds: float | None = None) -> Path:
    """Write the runs as JSON, one run per line, with the configurations, when each history
    entry was recorded (``"steps"``), the baselines, the command and (``seconds``) how long it took."""
    names = list(dict.fromkeys(run["config"] for run in runs))
    about: dict[str, Any] = {"what": "mha_lib.induction seed study (chapter 08)", "command": command}
    if seconds is not None:
        about["seconds"] = round(seconds)
    header = {"configs": {name: CONFIGS[name] for name in names},
              "steps": {name: _steps(CONFIGS[name]) for name in names},
              "baselines": {name: {k: round(float(v), 4) for k, v in baselines(CONFIGS[name]).items()}
                            for name in names}}
    return _save_study(runs, path, about, header)


def _steps(config: dict[str, Any]) -> list[int]:
    steps, every = config["training"]["steps"], config["training"]["log_every"]
    return list(range(0, steps, every)) + [steps]


def load_study(path: str | Path | None = None) -> Study:
    """The committed study (``mha_lib/induction/study.json``), or the file at ``path``.

    ``study.config`` holds each configuration by name; ``study.about`` also holds
    ``"steps"`` (when each history entry was recorded) and ``"baselines"``, by configuration.
    """
    data = read_study(path, default=STUDY_FILE, make="python -m mha_lib.induction study")
    about = dict(data.get("about", {}), steps=data["steps"], baselines=data["baselines"])
    return Study(runs=data["runs"], config=data["configs"], about=about)
