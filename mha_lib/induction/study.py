"""The seed study: chapter 08's one- and two-layer models trained from many independent seeds.

One trained model is one sample. Chapter 08 therefore quotes what held over the runs of
this study, read from the committed file ``study.json`` next to this module
(:func:`load_study`), draws every run, and checks the model the learner trains against the
study's range. Re-run it with ``make study`` or ``python -m mha_lib.induction study --help``.

Every run is independent: seed ``s`` builds the model after ``seed_everything(s)`` (its own
initialisation) and trains on batches drawn from a generator seeded with ``s`` (its own
data); it is measured on its own held-out batch (generator ``EVAL_SEED + s``). A run holds:

- ``"untrained"``: each layer's head scores before training (a baseline, like uniform attention);
- ``"history"``: the loss on the predictable tokens every ``log_every`` steps;
- ``"phase_change"``: the first recorded step below :data:`BASELINES`'s threshold, or None;
- ``"loss"``: the held-out loss on the predictable and on the other tokens;
- ``"scores"``: per layer, each head's previous-token, self, duplicate-token and induction score;
- ``"ablation"``: per layer and head, the held-out predictable loss with that head silenced;
- ``"composition"`` (two layers): per first-layer head, the predictable loss and the second
  layer's best induction score when the head's output is removed from the second layer's
  query, key or value input only.

The thresholds the chapter uses come from baselines stated before any run is read
(:func:`baselines`): the loss of a model that cannot copy, and the score of a head that
attends uniformly to the past.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..device import seed_everything
from ..heads import silence_heads
from ..sentiment.study import Study, _progress, kernel_path
from .data import RepeatBatch, repeated_segments
from .model import AttentionOnlyTransformer
from .scores import (
    duplicate_token_score,
    induction_score,
    previous_token_score,
    self_score,
    uniform_induction_score,
    uniform_previous_token_score,
)
from .train import losses, phase_change_step, train_induction

__all__ = ["CONFIG", "CONFIGS", "EVAL_SEED", "FINDINGS", "THREADS", "MODEL_FILE", "STATED", "check_findings", "count_findings", "load_trained", "save_trained", "study_jobs", "top_head", "train_run", "STUDY_FILE", "Study", "baselines", "build_model", "eval_batch", "load_study",
           "measure", "role_threshold", "run_seed", "run_study", "save_study"]

STUDY_FILE = Path(__file__).with_name("study.json")
MODEL_FILE = Path(__file__).with_name("model_seed0.pt")  # exercise 8.3's trained model (save_trained)
EVAL_SEED = 1_000_000  # a run's held-out batch: generator EVAL_SEED + seed, never a training batch
# The chapter's set-up: the task, the model, its training; chapter 08 trains the same.
# "learned": learned positions added to the tokens (the chapter's models, one and two layers);
# "rotary": RoPE inside the heads and no positions in the residual stream (two layers, longer).
CONFIGS: dict[str, dict[str, Any]] = {
    "learned": {
        "task": {"seq_len": 24, "vocab_size": 64, "segment": [4, 8]},
        "model": {"d_model": 64, "num_heads": 4, "positions": "learned"},
        "training": {"steps": 800, "batch_size": 64, "lr": 1e-2, "log_every": 10},
        "layers": [1, 2], "seeds": 24,
    },
    "rotary": {
        "task": {"seq_len": 24, "vocab_size": 64, "segment": [4, 8]},
        "model": {"d_model": 64, "num_heads": 4, "positions": "rotary"},
        "training": {"steps": 2400, "batch_size": 64, "lr": 1e-2, "log_every": 10},
        "layers": [2], "seeds": 10,
    },
}
CONFIG = CONFIGS["learned"]
EVAL_SIZE = 512  # sequences in a run's held-out batch
THREADS = 1  # per run: a model this small trains fastest on one thread (two runs share the two cores)
Run = dict[str, Any]
SCORES: dict[str, Callable[..., torch.Tensor]] = {
    "previous_token": lambda w, b: previous_token_score(w),
    "self": lambda w, b: self_score(w),
    "duplicate": duplicate_token_score,
    "induction": induction_score,
}


def role_threshold(uniform: float) -> float:
    """A head "has a role" when its score is at least halfway from uniform attention to a head
    that puts all its weight on that key: ``uniform + (1 - uniform) / 2``."""
    return uniform + (1.0 - uniform) / 2


def baselines(config: dict[str, Any] = CONFIG) -> dict[str, float]:
    """What the thresholds are derived from, fixed before any trained run is read.

    - ``"no_copy_loss"``: ``ln V``, the loss of a model that cannot copy (the tokens are uniform).
    - ``"phase_threshold"``: half of it, halfway between not copying and copying perfectly.
    - ``"uniform_previous_token"``, ``"uniform_induction"``: the scores of uniform causal
      attention (the latter on a large batch of the task; the duplicate-token score shares it).
    - ``"previous_token_head"``, ``"induction_head"``: :func:`role_threshold` of those.
    """
    task = config["task"]
    big = repeated_segments(4096, task["seq_len"], task["vocab_size"], tuple(task["segment"]),
                            generator=torch.Generator().manual_seed(EVAL_SEED - 1))
    no_copy = math.log(task["vocab_size"])
    uniform_prev = uniform_previous_token_score(task["seq_len"])
    uniform_ind = uniform_induction_score(big)
    return {
        "no_copy_loss": no_copy,
        "phase_threshold": no_copy / 2,
        "uniform_previous_token": uniform_prev,
        "uniform_induction": uniform_ind,
        "previous_token_head": role_threshold(uniform_prev),
        "induction_head": role_threshold(uniform_ind),
    }


def _round(x: float, digits: int = 4) -> float:
    return round(float(x), digits)


def build_model(seed: int, num_layers: int, config: dict[str, Any] = CONFIG,
                device: torch.device | str = "cpu") -> AttentionOnlyTransformer:
    """The study's model for one run: ``seed_everything(seed)``, then build (its own initialisation)."""
    seed_everything(seed)
    task = config["task"]
    return AttentionOnlyTransformer(task["vocab_size"], num_layers=num_layers, max_len=task["seq_len"],
                                    **config["model"]).to(device)


def eval_batch(seed: int, config: dict[str, Any] = CONFIG) -> RepeatBatch:
    """A run's held-out batch (its own generator, ``EVAL_SEED + seed``), on the CPU."""
    task = config["task"]
    return repeated_segments(EVAL_SIZE, task["seq_len"], task["vocab_size"], tuple(task["segment"]),
                             generator=torch.Generator().manual_seed(EVAL_SEED + seed))


@torch.no_grad()
def _predictable_loss(model: AttentionOnlyTransformer, batch: RepeatBatch, **kwargs: Any) -> float:
    return losses(model(batch.tokens, **kwargs), batch)[1].item()


@torch.no_grad()
def measure(model: AttentionOnlyTransformer, batch: RepeatBatch, ablations: bool = True) -> dict[str, Any]:
    """Scores per layer and head, the held-out losses and (``ablations``) what each head is needed for."""
    model.eval()
    device = next(model.parameters()).device
    batch = batch.to(device)
    logits, weights = model(batch.tokens, return_weights=True)
    _, predictable, other = losses(logits, batch)
    out: dict[str, Any] = {
        "loss": {"predictable": _round(predictable), "other": _round(other)},
        "scores": [{name: [_round(s, 3) for s in fn(w, batch).tolist()] for name, fn in SCORES.items()}
                   for w in weights],
    }
    if not ablations:
        return out
    out["ablation"] = []
    for layer in model.layers:
        row = []
        for h in range(model.num_heads):
            with silence_heads(layer, [h]):
                row.append(_round(_predictable_loss(model, batch)))
        out["ablation"].append(row)
    if model.num_layers == 2:
        out["composition"] = {}
        for which in ("q", "k", "v"):
            loss, best_induction = [], []
            for h in range(model.num_heads):
                removed = {which: [(0, h)]}
                logits, weights = model(batch.tokens, return_weights=True, remove_from=removed)
                loss.append(_round(losses(logits, batch)[1]))
                best_induction.append(_round(induction_score(weights[1], batch).max(), 3))
            out["composition"][which] = {"loss": loss, "best_induction": best_induction}
    return out


def train_run(seed: int, num_layers: int, name: str = "learned",
              device: torch.device | str = "cpu") -> tuple[AttentionOnlyTransformer, dict[str, list[float]]]:
    """The model of one run of the study, trained: ``(model, history)``."""
    config = CONFIGS[name]
    model = build_model(seed, num_layers, config, device)
    task = config["task"]
    history = train_induction(model, seed=seed, seq_len=task["seq_len"], segment=tuple(task["segment"]),
                              reports=0, **config["training"])
    return model, history


def run_seed(seed: int, num_layers: int, name: str = "learned", device: torch.device | str = "cpu") -> Run:
    """Train and measure one run: the ``num_layers``-layer model of configuration ``name``, seed ``seed``."""
    config = CONFIGS[name]
    batch = eval_batch(seed, config)
    untrained = measure(build_model(seed, num_layers, config, device), batch, ablations=False)["scores"]
    model, history = train_run(seed, num_layers, name, device)
    run: Run = {"config": name, "seed": seed, "data_seed": seed, "eval_seed": EVAL_SEED + seed,
                "num_layers": num_layers, **kernel_path(device), "seconds": _round(history["seconds"][0], 1),
                "phase_change": phase_change_step(history, baselines(config)["phase_threshold"]),
                "history": [_round(x, 3) for x in history["loss"]],
                "untrained": untrained}
    return run | measure(model, batch)


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
    torch.set_num_threads(THREADS)
    seed, n, name, device = job
    return run_seed(seed, n, name, device)


def run_study(jobs: Sequence[tuple[int, int, str]], device: torch.device | str = "cpu", workers: int = 2,
              progress: bool = True) -> list[Run]:
    """Every job of :func:`study_jobs`, in ``workers`` processes of :data:`THREADS` thread(s) each,
    with a progress bar on stderr. Returns the runs in the order of ``jobs``."""
    jobs = [(seed, n, name, str(device)) for seed, n, name in jobs]
    cost = {job: CONFIGS[job[2]]["training"]["steps"] * (1 + job[1]) for job in jobs}
    order = sorted(jobs, key=cost.__getitem__, reverse=True)  # the longest first: the workers end together
    runs: dict[tuple, Run] = {}
    started = time.perf_counter()
    if workers > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for done, run in enumerate(pool.imap_unordered(_job, order), 1):
                runs[(run["seed"], run["num_layers"], run["config"])] = run
                if progress:
                    _progress("study", done, len(jobs), started, unit="runs")
    else:
        for done, job in enumerate(order, 1):
            runs[job[:3]] = _job(job)
            if progress:
                _progress("study", done, len(jobs), started, unit="runs")
    return [runs[job[:3]] for job in jobs]


def save_study(runs: list[Run], path: str | Path = STUDY_FILE, command: str = "") -> Path:
    """Write the runs as JSON, one run per line, with the configurations, when each history
    entry was recorded (``"steps"``) and the baselines."""
    path = Path(path)
    names = list(dict.fromkeys(run["config"] for run in runs))
    header = {"about": {"what": "mha_lib.induction seed study (chapter 08)", "command": command},
              "configs": {name: CONFIGS[name] for name in names},
              "steps": {name: _steps(CONFIGS[name]) for name in names},
              "baselines": {name: {k: _round(v) for k, v in baselines(CONFIGS[name]).items()} for name in names}}
    lines = [json.dumps(run, separators=(",", ":")) for run in runs]
    text = json.dumps(header, indent=1)[:-2] + ',\n "runs": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    path.write_text(text)
    return path


def _steps(config: dict[str, Any]) -> list[int]:
    steps, every = config["training"]["steps"], config["training"]["log_every"]
    return list(range(0, steps, every)) + [steps]


def load_study(path: str | Path | None = None) -> Study:
    """The committed study (``mha_lib/induction/study.json``), or the file at ``path``.

    ``study.config`` holds each configuration by name; ``study.about`` also holds
    ``"steps"`` (when each history entry was recorded) and ``"baselines"``, by configuration.
    """
    path = Path(path) if path is not None else STUDY_FILE
    if not path.exists():
        raise FileNotFoundError(f"no study at {path}; make one with `python -m mha_lib.induction study`")
    data = json.loads(path.read_text())
    about = dict(data.get("about", {}), steps=data["steps"], baselines=data["baselines"])
    return Study(runs=data["runs"], config=data["configs"], about=about)


# --- What held in every run of the committed study, as code --------------------------------
# Each finding names the runs it speaks to and a test on one run; its thresholds come from
# baselines() alone. Chapter 08 states them with their counts, and tests/test_induction_study.py
# checks that every committed run satisfies them.


_BASELINES: dict[str, dict[str, float]] = {}


def _base(run: Run) -> dict[str, float]:
    """The baselines of the run's configuration (computed once per configuration)."""
    name = run["config"]
    if name not in _BASELINES:
        _BASELINES[name] = baselines(CONFIGS[name])
    return _BASELINES[name]


def top_head(run: Run, layer: int, score: str) -> int:
    """The head of ``layer`` with the highest ``score`` (``"previous_token"``, ``"duplicate"``, ...)."""
    scores = run["scores"][layer][score]
    return max(range(len(scores)), key=scores.__getitem__)


def _is(config: str, layers: int, changed: bool = False) -> Callable[[Run], bool]:
    """The runs of ``config`` with ``layers`` layers (``changed``: only those that changed phase)."""
    return lambda run: (run["config"] == config and run["num_layers"] == layers
                        and (not changed or run["phase_change"] is not None))


def _all_induction_heads(run: Run) -> bool:
    return min(run["scores"][1]["induction"]) >= _base(run)["induction_head"]


# name -> (which runs it speaks to, the test on one run). What a trained model does is asked of
# the runs that changed phase: a run still on its plateau has learned no copying to take apart.
FINDINGS: dict[str, tuple[Callable[[Run], bool], Callable[[Run], bool]]] = {
    "untrained: no head has a role": (
        lambda r: True,
        lambda r: all(max(layer["previous_token"]) < _base(r)["previous_token_head"]
                      and max(layer["induction"]) < _base(r)["induction_head"]
                      and max(layer["duplicate"]) < _base(r)["induction_head"] for layer in r["untrained"])),
    "two layers change phase": (_is("learned", 2), lambda r: r["phase_change"] is not None),
    "one layer never changes phase": (_is("learned", 1), lambda r: r["phase_change"] is None),
    "one layer: no induction head": (
        _is("learned", 1), lambda r: max(r["scores"][0]["induction"]) < _base(r)["induction_head"]),
    "learned: all four layer-2 heads are induction heads": (_is("learned", 2, changed=True), _all_induction_heads),
    "learned: no previous-token head in layer 1": (
        _is("learned", 2), lambda r: max(r["scores"][0]["previous_token"]) < _base(r)["previous_token_head"]),
    "learned: a duplicate-token head in layer 1": (
        _is("learned", 2, changed=True), lambda r: max(r["scores"][0]["duplicate"]) >= _base(r)["induction_head"]),
    "learned: layer 2 needs it in its queries": (
        _is("learned", 2, changed=True),
        lambda r: r["composition"]["q"]["loss"][top_head(r, 0, "duplicate")] >= _base(r)["phase_threshold"]),
    "learned: no layer-1 head is needed in the keys": (
        _is("learned", 2, changed=True), lambda r: max(r["composition"]["k"]["loss"]) < _base(r)["phase_threshold"]),
    "rotary: two layers change phase": (_is("rotary", 2), lambda r: r["phase_change"] is not None),
    "rotary: all four layer-2 heads are induction heads": (_is("rotary", 2, changed=True), _all_induction_heads),
    "rotary: a previous-token head in layer 1": (
        _is("rotary", 2, changed=True),
        lambda r: max(r["scores"][0]["previous_token"]) >= _base(r)["previous_token_head"]),
    "rotary: layer 2 needs it in its keys": (
        _is("rotary", 2, changed=True),
        lambda r: r["composition"]["k"]["loss"][top_head(r, 0, "previous_token")] >= _base(r)["phase_threshold"]),
    "rotary: a duplicate-token head in layer 1": (
        _is("rotary", 2, changed=True), lambda r: max(r["scores"][0]["duplicate"]) >= _base(r)["induction_head"]),
    "rotary: no layer-1 head is needed in the queries": (
        _is("rotary", 2, changed=True), lambda r: max(r["composition"]["q"]["loss"]) < _base(r)["phase_threshold"]),
    "rotary: the queries still read the duplicate-token head": (
        _is("rotary", 2, changed=True),
        lambda r: r["composition"]["q"]["loss"][top_head(r, 0, "duplicate")] > r["loss"]["predictable"]),
}
# How many runs each finding holds in, in the committed study: chapter 08 states these counts,
# and tests/test_induction_study.py checks that the file gives them.
STATED: dict[str, tuple[int, int]] = {
    "untrained: no head has a role": (58, 58),
    "two layers change phase": (19, 24),
    "one layer never changes phase": (24, 24),
    "one layer: no induction head": (24, 24),
    "learned: all four layer-2 heads are induction heads": (19, 19),
    "learned: no previous-token head in layer 1": (24, 24),
    "learned: a duplicate-token head in layer 1": (19, 19),
    "learned: layer 2 needs it in its queries": (19, 19),
    "learned: no layer-1 head is needed in the keys": (19, 19),
    "rotary: two layers change phase": (10, 10),
    "rotary: all four layer-2 heads are induction heads": (9, 10),
    "rotary: a previous-token head in layer 1": (9, 10),
    "rotary: layer 2 needs it in its keys": (9, 10),
    "rotary: a duplicate-token head in layer 1": (8, 10),
    "rotary: no layer-1 head is needed in the queries": (9, 10),
    "rotary: the queries still read the duplicate-token head": (10, 10),
}


def check_findings(run: Run) -> dict[str, bool]:
    """``{finding: holds}`` for the :data:`FINDINGS` that speak to this run."""
    return {name: bool(test(run)) for name, (applies, test) in FINDINGS.items() if applies(run)}


def count_findings(study: Study) -> dict[str, tuple[int, int]]:
    """``{finding: (k, n)}``: each of :data:`FINDINGS` holds in ``k`` of the ``n`` runs it speaks to."""
    return {name: study.count(test, where=applies) for name, (applies, test) in FINDINGS.items()}
