"""One run of chapter 08's seed study: a one- or two-layer model built and trained from one
seed, then measured as the chapter measures it (:func:`run_seed`).

Every run is independent: seed ``s`` builds the model after ``seed_everything(s)`` (its own
initialisation) and trains on batches drawn from a generator seeded with ``s`` (its own
data); it is measured on its own held-out batch (generator ``EVAL_SEED + s``). A run holds:

- ``"untrained"``, ``"untrained_copying"``: each layer's head scores and copying scores before
  training (a baseline, like uniform attention and random weights);
- ``"history"``: the loss on the predictable tokens every ``log_every`` steps;
- ``"phase_change"``: the first recorded step of :data:`~mha_lib.induction.train.PHASE_RECORDS`
  records in a row below :func:`baselines`'s threshold, or None;
- ``"loss"``: the held-out loss on the predictable and on the other tokens;
- ``"scores"``: per layer, each head's previous-token, self, duplicate-token and induction score;
- ``"ablation"``: per layer and head, the held-out predictable loss with that head silenced;
- ``"composition"`` (two layers): per first-layer head, the predictable loss and the second
  layer's best induction score when the head's output is removed from the second layer's
  query, key or value input only, and (``"all"``) the loss with all of them removed there;
- ``"parts"`` (two layers): the same losses with only the token, position or bias part of each
  first-layer head removed (:func:`~mha_lib.induction.circuits.remove_parts`), and
  ``"parts_all"`` with that part of every first-layer head removed at once (rotary runs have no
  position part);
- ``"mean_ablation"`` (two layers): the predictable loss with each first-layer head replaced by
  its mean over the batch in the second layer's query input (next to ``composition["q"]``'s zero);
- ``"copying"``: per layer and head, the copying score and the positive-eigenvalue measure of
  its OV circuit (:mod:`~mha_lib.induction.circuits`);
- ``"weight_composition"`` (two layers, not rotary): Elhage et al.'s Q-, K-, V-composition scores,
  ``[layer-1 head][layer-2 head]``.

The thresholds the chapter uses come from baselines stated before any run is read
(:func:`baselines`): the loss of a model that cannot copy, the score of a head that attends
uniformly to the past, what random weights score for copying and composition. Many runs make the study (:mod:`.study`); what the chapter
states about them is in :mod:`.findings`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..device import seed_everything
from ..heads import silence_heads
from ..studies import kernel_path
from .circuits import (
    composition_scores,
    copying_eigenvalues,
    copying_score,
    head_parts,
    mean_ablate,
    random_composition_scores,
)
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

__all__ = ["CONFIG", "CONFIGS", "EVAL_SEED", "Run", "baselines", "build_model", "eval_batch", "measure",
           "role_threshold", "run_seed", "train_run"]

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
    - ``"random_copying"``: ``1 / V``, the copying score of a random OV circuit (its own token
      is the top one by chance); ``"copying_head"``: :func:`role_threshold` of it. The
      positive-eigenvalue measure of random weights is about 0; a head copies by it at
      ``role_threshold(0) = 0.5``.
    - ``"random_composition"``: the mean composition score of random matrices of the model's
      shapes (1,000 draws, :func:`~mha_lib.induction.circuits.random_composition_scores`;
      Q, K and V scores of random heads share one distribution), and
      ``"random_composition_p99"``: their 99th percentile, above which a score is "high".
    """
    task = config["task"]
    big = repeated_segments(4096, task["seq_len"], task["vocab_size"], tuple(task["segment"]),
                            generator=torch.Generator().manual_seed(EVAL_SEED - 1))
    no_copy = math.log(task["vocab_size"])
    uniform_prev = uniform_previous_token_score(task["seq_len"])
    uniform_ind = uniform_induction_score(big)
    model = config["model"]
    random = torch.cat(list(random_composition_scores(model["d_model"], model["d_model"] // model["num_heads"]).values()))
    return {
        "no_copy_loss": no_copy,
        "phase_threshold": no_copy / 2,
        "uniform_previous_token": uniform_prev,
        "uniform_induction": uniform_ind,
        "previous_token_head": role_threshold(uniform_prev),
        "induction_head": role_threshold(uniform_ind),
        "random_copying": 1 / task["vocab_size"],
        "copying_head": role_threshold(1 / task["vocab_size"]),
        "copying_eigen_head": role_threshold(0.0),
        "random_composition": random.mean().item(),
        "random_composition_p99": random.quantile(0.99).item(),
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
def measure(model: AttentionOnlyTransformer, batch: RepeatBatch, ablations: bool = True,
            mechanism: bool = True) -> dict[str, Any]:
    """Scores per layer and head, the held-out losses, (``ablations``) what each head is needed for
    and through which input, and (``mechanism``, two layers) the parts, mean-ablation, copying and
    weight-composition records (see the module's docstring)."""
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
    out["copying"] = {
        "score": [[_round(copying_score(model, layer, h), 3) for h in range(model.num_heads)]
                  for layer in range(model.num_layers)],
        "eigen": [[_round(copying_eigenvalues(model, layer, h), 3) for h in range(model.num_heads)]
                  for layer in range(model.num_layers)],
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
    if not mechanism:
        if model.num_layers == 2:
            out["composition"] = _composition(model, batch, parts=False)["composition"]
        return out
    if model.num_layers == 2:
        out |= _composition(model, batch)
    return out


@torch.no_grad()
def _composition(model: AttentionOnlyTransformer, batch: RepeatBatch, parts: bool = True) -> dict[str, Any]:
    """What the second layer reads from the first, and through which input (see the module's docstring)."""
    H, tokens = model.num_heads, batch.tokens
    out: dict[str, Any] = {"composition": {}, "parts": {}, "parts_all": {}}
    for which in ("q", "k", "v"):
        loss, best_induction = [], []
        for h in range(H):
            logits, weights = model(tokens, return_weights=True, remove_from={which: [(0, h)]})
            loss.append(_round(losses(logits, batch)[1]))
            best_induction.append(_round(induction_score(weights[1], batch).max(), 3))
        every = _predictable_loss(model, batch, remove_from={which: [(0, h) for h in range(H)]})
        out["composition"][which] = {"loss": loss, "best_induction": best_induction, "all": _round(every)}
    if not parts:
        return out
    parts = head_parts(model, tokens)  # {part: (B, H, L, D)}
    names = [p for p in parts if not (p == "position" and model.position_embedding is None)]
    for which in ("q", "k", "v"):
        out["parts"][which] = {
            name: [_round(_predictable_loss(model, batch, subtract={which: parts[name][:, h]})) for h in range(H)]
            for name in names}
        out["parts_all"][which] = {
            name: _round(_predictable_loss(model, batch, subtract={which: parts[name].sum(1)})) for name in names}
    out["mean_ablation"] = {"q": [_round(losses(mean_ablate(model, tokens, {"q": [h]}), batch)[1]) for h in range(H)]}
    if model.positions != "rotary":
        out["weight_composition"] = {name: [[_round(x, 3) for x in row] for row in scores.tolist()]
                                     for name, scores in composition_scores(model).items()}
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
    untrained = measure(build_model(seed, num_layers, config, device), batch, ablations=False)
    model, history = train_run(seed, num_layers, name, device)
    run: Run = {"config": name, "seed": seed, "data_seed": seed, "eval_seed": EVAL_SEED + seed,
                "num_layers": num_layers, **kernel_path(device), "seconds": _round(history["seconds"][0], 1),
                "phase_change": phase_change_step(history, baselines(config)["phase_threshold"]),
                "history": [_round(x, 3) for x in history["loss"]],
                "untrained": untrained["scores"], "untrained_copying": untrained["copying"]}
    return run | measure(model, batch)
