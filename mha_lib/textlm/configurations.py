"""The configurations tried next to the shipped one: one run each, measured as the study measures.

Chapter 09's model was chosen by trying variations on 2 CPU cores; this module makes that search
reproducible. Each entry of :data:`CONFIGURATIONS` changes the shipped configuration
(:mod:`.config`) in one or two places, trains one run from seed 0 (the study's seed 0, so the
shipped row is the study's first run) and keeps the study's record of it (:func:`~.study.run_seed`).
One run per configuration is a search, not a study: a count over them says where to look, not
what a configuration always does. The five runs took 4,499 s, two side by side on 2 cores shared
with other work (one thread each; 5 to 50 minutes a run).

``python -m mha_lib.textlm configurations`` writes :data:`CONFIGURATIONS_FILE`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..studies import run_jobs
from .study import Record, run_seed

__all__ = ["CONFIGURATIONS", "CONFIGURATIONS_FILE", "run_configurations", "save_configurations",
           "load_configurations", "summary"]

CONFIGURATIONS_FILE = Path(__file__).with_name("configurations.json")

# name: (what it changes in the model's configuration, what it changes in training)
CONFIGURATIONS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "attention only": ({"mlp": False}, {}),
    "context 32": ({"max_len": 32}, {}),
    "context 128, batch 16": ({"max_len": 128}, {"batch_size": 16}),
    "repeats in half the windows": ({}, {"repeat": 0.5}),
    "context 32, repeats in half": ({"max_len": 32}, {"repeat": 0.5}),
}


def _job(job: tuple[str, dict[str, Any], dict[str, Any], str]) -> Record:
    name, model_config, train_config, device = job
    record = run_seed(0, model_config=model_config, train_config=train_config, device=device)
    return {"name": name, **record}


def run_configurations(names: Sequence[str] | None = None, workers: int = 2, device: str = "cpu") -> list[Record]:
    """One run from seed 0 for each configuration named (default: all of :data:`CONFIGURATIONS`)."""
    names = list(CONFIGURATIONS) if names is None else list(names)
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; the known ones are {list(CONFIGURATIONS)}")
    jobs = [(n, *CONFIGURATIONS[n], device) for n in names]
    return run_jobs(_job, jobs, workers=workers)


def save_configurations(runs: list[Record], path: str | Path = CONFIGURATIONS_FILE, command: str = "",
                        seconds: float | None = None) -> Path:
    """Write the runs (and how they were made) as JSON; returns the path."""
    about: dict[str, Any] = {"command": command}
    if seconds is not None:
        about["seconds"] = round(seconds)
    path = Path(path)
    path.write_text(json.dumps({"about": about, "runs": runs}, indent=1) + "\n")
    return path


def load_configurations(path: str | Path = CONFIGURATIONS_FILE) -> list[Record]:
    """The runs :func:`save_configurations` wrote."""
    return json.loads(Path(path).read_text())["runs"]


def summary(run: Record) -> dict[str, float]:
    """What the chapter's table shows of one run: the held-out loss at the last step, the
    strongest previous-token and induction scores over heads and evaluations with uniform
    attention's, and how much easier the second copy of a held-out passage is than the first
    at the last step (first minus second, nats per token; positive: the copy is easier), with
    the first copy's loss (a perfect copier's gain)."""
    probes = run["probes"]
    last = probes[-1]

    def best(role: str) -> float:
        return max(s for p in probes for row in p["scores"][role] for s in row)

    return {"val_loss": run["val_loss"][-1], "previous": best("previous"),
            "previous_uniform": last["scores"]["uniform"]["previous"], "induction": best("induction"),
            "induction_uniform": last["scores"]["uniform"]["induction"],
            "first_copy": last["first_copy"], "copy_gain": last["first_copy"] - last["second_copy"]}
