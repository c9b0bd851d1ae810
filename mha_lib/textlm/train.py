"""Training the language model: AdamW on random windows of the corpus, with a progress bar.

Every step draws ``batch_size`` windows of ``max_len + 1`` tokens from the training ids at
random starts (a CPU generator seeded with the run's seed: each run its own data order, the
same on every device), and minimises the mean next-token cross-entropy. The learning rate
rises linearly over ``warmup`` steps, then decays along a cosine to ``final_lr`` of its peak
(:func:`learning_rate`); gradients are clipped to norm 1.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import Tensor

from ..validation import check_positive_int
from .model import TextTransformer

__all__ = ["TrainConfig", "batches", "lace_repeats", "learning_rate", "evaluate_loss", "train_lm"]


@dataclass(frozen=True)
class TrainConfig:
    """How a run trains; saved with every checkpoint."""

    steps: int = 2000
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 200
    final_lr: float = 0.1  # the learning rate at the last step, as a share of lr (cosine decay)
    weight_decay: float = 0.01
    eval_every: int = 100
    seed: int = 0
    repeat: float = 0.0  # the share of training windows given a repeated span (:func:`lace_repeats`)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def learning_rate(config: TrainConfig, step: int) -> float:
    """The learning rate at ``step``: a linear warm-up over ``config.warmup`` steps, then a cosine
    decay to ``config.final_lr`` of ``config.lr`` at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    done = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (config.final_lr + (1 - config.final_lr) * 0.5 * (1 + math.cos(math.pi * done)))


def batches(ids: Tensor, batch_size: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Inputs and targets ``(B, length)``: windows at random starts, the targets one token later."""
    if ids.dim() != 1 or ids.numel() <= length + 1:
        raise ValueError(f"ids must be a 1-D tensor longer than length + 1 = {length + 1}, got {tuple(ids.shape)}")
    starts = torch.randint(ids.numel() - length - 1, (batch_size,), generator=generator)
    windows = torch.stack([ids[s : s + length + 1] for s in starts.tolist()])  # (B, length + 1)
    return windows[:, :-1], windows[:, 1:]


def lace_repeats(inputs: Tensor, targets: Tensor, share: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Give about ``share`` of the windows a repeated span: a span of L/8 to L/4 tokens from the
    first half of the window is copied over a later stretch of the same window, so that the
    second copy can be predicted from the first (the text stays real text elsewhere).

    Args:
        inputs, targets: ``(B, L)`` windows and their next tokens, as :func:`batches` returns.
        share: the chance that a window gets a span, in [0, 1].

    Returns new ``(B, L)`` inputs and targets; the arguments are left as they were.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be between 0 and 1, got {share}")
    L = inputs.size(1)
    if L < 16:
        raise ValueError(f"windows need at least 16 tokens for a repeated span, got {L}")
    full = torch.cat([inputs, targets[:, -1:]], dim=1).clone()  # (B, L + 1): the window and its last target
    for row in range(full.size(0)):
        if torch.rand((), generator=generator).item() >= share:
            continue
        n = int(torch.randint(L // 8, L // 4 + 1, (), generator=generator))
        first = int(torch.randint(0, L // 2 - n + 1, (), generator=generator))
        second = int(torch.randint(first + n, L + 2 - n, (), generator=generator))
        full[row, second : second + n] = full[row, first : first + n].clone()
    return full[:, :-1], full[:, 1:]


@torch.no_grad()
def evaluate_loss(model: TextTransformer, inputs: Tensor, targets: Tensor, chunk: int = 32) -> float:
    """Mean next-token cross-entropy (nats per token) of ``model`` on fixed windows ``(N, L)``."""
    total, count = 0.0, 0
    device = model.unembed.weight.device
    for i in range(0, inputs.size(0), chunk):
        x, y = inputs[i : i + chunk].to(device), targets[i : i + chunk].to(device)
        logits = model(x)
        total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        count += y.numel()
    return total / count


def _bar(step: int, steps: int, started: float, loss: float, stream: TextIO) -> None:
    done = step / steps
    elapsed = time.perf_counter() - started
    left = elapsed / done - elapsed if done else float("nan")
    bar = "#" * int(30 * done) + "-" * (30 - int(30 * done))
    line = f"[{bar}] step {step:>5}/{steps}  val loss {loss:.3f}  {elapsed:5.0f} s, ~{left:4.0f} s left"
    end = "\r" if stream.isatty() and step < steps else "\n"
    print(line, end=end, file=stream, flush=True)


def train_lm(
    model: TextTransformer,
    train_ids: Tensor,
    val_inputs: Tensor,
    val_targets: Tensor,
    config: TrainConfig = TrainConfig(),
    *,
    progress: bool | TextIO = True,
    on_eval: Callable[[int, TextTransformer], dict[str, Any]] | None = None,
) -> dict[str, list]:
    """Train ``model`` in place; returns its history and leaves it in eval mode.

    Args:
        train_ids: the training corpus as token ids ``(N,)``.
        val_inputs, val_targets: fixed validation windows ``(M, L)``, scored every
            ``config.eval_every`` steps and after the last one.
        progress: print a progress bar (to stderr, or to the stream given).
        on_eval: called as ``on_eval(step, model)`` (model in eval mode, no grad) at each
            evaluation; what it returns is kept in the history under ``"probes"``.

    Returns:
        ``{"step": [...], "val_loss": [...], "train_loss": [...], "probes": [...], "seconds": float}``;
        ``train_loss`` is the mean over the steps since the previous evaluation.
    """
    check_positive_int(config.steps, "steps")
    generator = torch.Generator().manual_seed(config.seed)
    device = model.unembed.weight.device
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    stream = sys.stderr if progress is True else (progress or None)
    history: dict[str, list] = {"step": [], "val_loss": [], "train_loss": [], "probes": []}
    running, seen = 0.0, 0
    started = time.perf_counter()

    def record(step: int) -> None:
        model.eval()
        with torch.no_grad():
            loss = evaluate_loss(model, val_inputs, val_targets)
            history["step"].append(step)
            history["val_loss"].append(round(loss, 4))
            history["train_loss"].append(round(running / seen, 4) if seen else None)
            if on_eval is not None:
                history["probes"].append(on_eval(step, model))
        model.train()
        if stream is not None:
            _bar(step, config.steps, started, loss, stream)

    model.train()
    for step in range(config.steps):
        if step % config.eval_every == 0:
            record(step)
            running, seen = 0.0, 0
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        inputs, targets = batches(train_ids, config.batch_size, model.config.max_len, generator)
        if config.repeat:
            inputs, targets = lace_repeats(inputs, targets, config.repeat, generator)
        logits = model(inputs.to(device))
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.to(device).reshape(-1))
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"the training loss is {loss.item()} at step {step}: lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        running, seen = running + loss.item(), seen + 1
    record(config.steps)
    model.eval()
    history["seconds"] = round(time.perf_counter() - started, 1)
    return history
