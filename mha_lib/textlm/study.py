"""Chapter 09's seed study: the language model trained from several seeds, its heads measured.

Every run is independent: its own initialisation (``seed``) and its own order of training
windows (``data_seed``), the same corpus, tokenizer and configuration (:mod:`.config`). At
every evaluation a run records its held-out loss and the probes of :func:`probe`; after the
last step, what mean-ablating each head costs per token class (:mod:`.ablation`). The runs
go through the machinery every seed study shares (:mod:`mha_lib.studies`), and chapter 09
quotes only what held over them (:mod:`.findings`).

``python -m mha_lib.textlm study`` re-trains it (seeds 0-5; the 6 runs took
16.5 min on 2 quiet cores, 39 min on busy ones);
``python -m mha_lib.textlm study --help`` says more.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..device import seed_everything
from ..studies import Record, Study, kernel_path, read_study, run_jobs
from ..studies import load_study as _load_study
from ..studies import save_study as _save_study
from .ablation import CLASSES, ablation_losses, token_classes
from .checkpoint import CHECKPOINT_FILE, save_checkpoint
from .config import MODEL, TRAIN
from .corpus import Corpus, load_corpus
from .model import ModelConfig, TextTransformer
from .scores import delimiter_keys, head_scores, repeat_batch
from .train import TrainConfig, train_lm

__all__ = ["STUDY_FILE", "Probes", "icl_score", "load_study", "probe", "run_seed", "run_study", "save_study"]

STUDY_FILE = Path(__file__).with_name("study.json")
MAKE = "python -m mha_lib.textlm study"
VAL_WINDOWS = 128  # held-out windows for the loss, the text scores and the ablation
REPEAT_SEED = 1  # the random tokens with a repeated segment, the same for every run


def icl_score(losses: torch.Tensor) -> float:
    """Olsson et al.'s in-context learning score on a context of L tokens: the mean loss of the
    last quarter of positions minus that of positions L/8 to L/4 (they take token 500 minus
    token 50). Negative: later tokens, which see more context, are predicted better.

    Args:
        losses: ``(L,)`` mean loss per position.
    """
    L = losses.numel()
    if L < 8:
        raise ValueError(f"the in-context learning score needs a context of at least 8 tokens, got {L}")
    return (losses[3 * L // 4 :].mean() - losses[L // 8 : L // 4].mean()).item()


class Probes:
    """The fixed inputs every evaluation measures a model on (the same for every run)."""

    def __init__(self, corpus: Corpus, seq_len: int) -> None:
        self.seq_len = seq_len
        self.inputs, self.targets = corpus.val_windows(VAL_WINDOWS, seq_len)
        self.newline = corpus.tokenizer.encode("\n")[0]
        self.delimiters = delimiter_keys(corpus.tokenizer, self.inputs)  # quote, indent, punctuation keys
        self.repeats = repeat_batch(len(corpus.tokenizer), seq_len, 64, seed=REPEAT_SEED)
        # A held-out passage of L/2 tokens, then the same passage again: is the copy easier?
        half = seq_len // 2
        g = torch.Generator().manual_seed(7)
        starts = torch.randint(corpus.val.numel() - half, (32,), generator=g).tolist()
        passages = torch.stack([corpus.val[s : s + half] for s in starts])
        self.twice = torch.cat([passages, passages], dim=1)  # (32, 2·half)
        self.classes = token_classes(corpus.tokenizer, self.inputs, self.targets)


@torch.no_grad()
def probe(model: TextTransformer, probes: Probes) -> dict[str, Any]:
    """One evaluation's measurements, rounded for the study file.

    ``scores``: every head's role scores (:func:`~.scores.head_scores`; ``"uniform"`` holds the
    baselines); ``icl``: :func:`icl_score` on the held-out windows; ``first_copy``,
    ``second_copy``: the mean loss on a held-out passage and on the same passage repeated.
    """
    device = model.unembed.weight.device
    scores = head_scores(model, probes.inputs, probes.newline, probes.repeats, probes.delimiters)
    rounded = {role: [[round(s, 4) for s in row] for row in rows] for role, rows in scores.items() if role != "uniform"}
    rounded["uniform"] = {role: round(v, 4) for role, v in scores["uniform"].items()}
    logits = model(probes.inputs.to(device)).float().cpu()
    per_pos = F.cross_entropy(logits.transpose(1, 2), probes.targets, reduction="none").mean(0)
    twice = probes.twice.to(device)
    logits = model(twice[:, :-1]).float().cpu()
    loss = F.cross_entropy(logits.transpose(1, 2), probes.twice[:, 1:], reduction="none").mean(0)
    half = probes.twice.size(1) // 2
    return {"scores": rounded, "icl": round(icl_score(per_pos), 4),
            "first_copy": round(loss[: half - 1].mean().item(), 4), "second_copy": round(loss[half:].mean().item(), 4)}


def run_seed(seed: int, model_config: dict[str, Any] | None = None, train_config: dict[str, Any] | None = None,
             device: torch.device | str = "cpu", checkpoint: str | Path | None = None,
             corpus: Corpus | None = None) -> Record:
    """Train one run from ``seed`` (initialisation ``seed``, data order ``data_seed = 1000 + seed``)
    and measure it; the run record. ``checkpoint``: also save the trained model there."""
    model_config = {**MODEL, **(model_config or {})}
    train_config = {**TRAIN, **(train_config or {}), "seed": 1000 + seed}
    corpus = corpus if corpus is not None else load_corpus()
    probes = Probes(corpus, model_config["max_len"])
    seed_everything(seed)
    model = TextTransformer(ModelConfig(vocab_size=len(corpus.tokenizer), **model_config)).to(device)
    started = time.perf_counter()
    history = train_lm(model, corpus.train, probes.inputs, probes.targets, TrainConfig(**train_config),
                       progress=False, on_eval=lambda step, m: probe(m, probes))
    ablation = ablation_losses(model, probes.inputs.to(device), probes.targets.to(device), probes.classes.to(device))
    if checkpoint is not None:
        save_checkpoint(checkpoint, model, corpus.tokenizer, TrainConfig(**train_config), history)
    return {
        "seed": seed, "data_seed": train_config["seed"], "model": model_config, "train": train_config,
        "kernel_path": kernel_path(device), "seconds": round(time.perf_counter() - started, 1),
        "steps": history["step"], "val_loss": history["val_loss"], "train_loss": history["train_loss"],
        "probes": history["probes"],
        "ablation": {"classes": list(CLASSES), "clean": [round(v, 4) for v in ablation["clean"].tolist()],
                     "increase": [[[round(v, 4) for v in head] for head in layer]
                                  for layer in ablation["increase"].tolist()],
                     "class_share": [round((probes.classes == c).double().mean().item(), 4)
                                     for c in range(len(CLASSES))]},
    }


def _job(job: tuple[int, str, list[str], dict[str, Any]]) -> Record:
    seed, device, checkpoints, train_config = job
    record = run_seed(seed, train_config=train_config, device=device, checkpoint=checkpoints[0] if checkpoints else None)
    for extra in checkpoints[1:]:  # the same file again, under another name
        Path(extra).write_bytes(Path(checkpoints[0]).read_bytes())
    return record


def run_study(seeds: Sequence[int], workers: int = 2, device: torch.device | str = "cpu",
              checkpoint: str | Path | None = None, train_config: dict[str, Any] | None = None,
              checkpoint_dir: str | Path | None = None) -> list[Record]:
    """One run per seed (:func:`run_seed`), ``workers`` at a time, with a progress bar on stderr;
    ``checkpoint``: where to save the first seed's model (the shipped one: :data:`CHECKPOINT_FILE`);
    ``checkpoint_dir``: also save every run's model there, as ``model_seed<N>.pt`` (to score
    roles the study did not record without training again)."""
    if checkpoint_dir is not None:
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)

    def paths(i: int, seed: int) -> list[str]:
        out = [str(checkpoint)] if checkpoint and i == 0 else []
        return out + ([str(Path(checkpoint_dir) / f"model_seed{seed}.pt")] if checkpoint_dir is not None else [])

    jobs = [(seed, str(device), paths(i, seed), dict(train_config or {})) for i, seed in enumerate(seeds)]
    return run_jobs(_job, jobs, workers=workers)


def save_study(runs: list[Record], path: str | Path = STUDY_FILE, command: str = "",
               seconds: float | None = None) -> Path:
    """Write the runs to the study file (one JSON object, one line per run)."""
    about = {"what": "chapter 09's language model of Python's test suite, trained from several seeds",
             "command": command or MAKE, "seconds": seconds}
    return _save_study(runs, path, about)


def load_study(path: str | Path | None = None) -> Study:
    """The study's runs (the shipped file by default)."""
    return _load_study(path, default=STUDY_FILE, make=MAKE)


def read_study_file(path: str | Path | None = None) -> dict[str, Any]:
    """The whole study file, header and runs."""
    return read_study(path, default=STUDY_FILE, make=MAKE)
