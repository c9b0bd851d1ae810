"""Training on :func:`~mha_lib.induction.repeated_segments`, and finding the phase change.

:func:`train_induction` trains next-token prediction on every position (the usual language
model loss) and records the loss on the predictable tokens (the second copy after its first
token) and on the rest separately. Nothing can predict the rest better than uniform,
``ln V``; the predictable tokens can be predicted perfectly, by copying.
:func:`phase_change_step` finds the step where the predictable loss drops and stays down
(:data:`PHASE_RECORDS` records in a row).
"""

from __future__ import annotations

import math
import numbers
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from ..validation import check_positive_int, check_positive_number, describe
from .data import RepeatBatch, check_task, repeated_segments
from .model import AttentionOnlyTransformer

__all__ = ["PHASE_RECORDS", "losses", "phase_change_step", "train_induction"]


def losses(logits: Tensor, batch: RepeatBatch) -> tuple[Tensor, Tensor, Tensor]:
    """``(all, predictable, other)``: mean next-token cross-entropy over all, the predictable, the other tokens.

    ``logits`` ``(B, L, V)``: position ``t`` predicts token ``t + 1``, so token 0 is never scored.
    """
    if not isinstance(batch, RepeatBatch):
        raise TypeError(f"batch must be a RepeatBatch (from repeated_segments), got {type(batch).__name__}")
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.dim() != 3:
        raise ValueError(f"logits must be a float tensor (B, L, V), the model's output, got {describe(logits)}")
    if logits.shape[:2] != batch.tokens.shape or logits.size(-1) <= batch.tokens.max():
        raise ValueError(f"logits {tuple(logits.shape)} don't fit the batch's tokens {tuple(batch.tokens.shape)}: "
                         "they must be (B, L, V) with V above every token id, model(batch.tokens)")
    return _losses(logits, batch)


def _losses(logits: Tensor, batch: RepeatBatch) -> tuple[Tensor, Tensor, Tensor]:
    V = logits.size(-1)
    per_token = F.cross_entropy(logits[:, :-1].reshape(-1, V), batch.tokens[:, 1:].reshape(-1), reduction="none")
    predictable = batch.predictable[:, 1:].reshape(-1)  # (B * (L - 1),)
    return per_token.mean(), per_token[predictable].mean(), per_token[~predictable].mean()


def train_induction(
    model: AttentionOnlyTransformer,
    steps: int = 600,
    batch_size: int = 64,
    lr: float = 1e-2,
    seed: int = 0,
    *,
    seq_len: int | None = None,
    segment: tuple[int, int] = (6, 10),
    weight_decay: float = 0.01,
    log_every: int = 10,
    reports: int = 4,
    threads: int | None = None,
) -> dict[str, list[float]]:
    """Train with AdamW on fresh batches, printing a progress line ``reports`` times.

    Every step draws a new batch from a CPU generator seeded with ``seed`` (each seed its own
    data, the same on every device). The loss is the mean cross-entropy over all positions.
    The weights' starting values are the caller's: seed before building the model.

    Args:
        seq_len: length of the sequences (default: ``model.max_len``).
        segment: ``(shortest, longest)`` length of the repeated segment.
        log_every: record the losses of every ``log_every``-th step's batch (measured
            before that step's update; the first record is step 0, the untrained model).
        threads: if given, train on that many CPU threads and restore the count afterwards.

    Returns:
        history: ``"step"``, ``"loss"`` (predictable tokens), ``"loss_other"`` (the rest),
        ``"loss_all"``, one entry per record, and ``"seconds"``: the training time. Leaves
        the model in eval mode and PyTorch's global state (threads, grad mode, RNG) as found.
    """
    if not isinstance(model, AttentionOnlyTransformer):
        raise TypeError(f"model must be an AttentionOnlyTransformer, got {type(model).__name__}")
    steps = check_positive_int(steps, "steps")
    lr, weight_decay = check_positive_number(lr, "lr"), check_positive_number(weight_decay, "weight_decay", zero=True)
    batch_size = check_positive_int(batch_size, "batch_size")
    log_every = check_positive_int(log_every, "log_every")
    seq_len = model.max_len if seq_len is None else seq_len
    seq_len, _, segment = check_task(seq_len, model.vocab_size, segment)
    if seq_len > model.max_len:
        raise ValueError(f"seq_len={seq_len} is longer than the model's max_len={model.max_len}")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history: dict[str, list[float]] = {"step": [], "loss": [], "loss_other": [], "loss_all": []}
    report_every = max(1, math.ceil(steps / max(reports, 1)))
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_positive_int(threads, "threads"))
    start = time.perf_counter()
    try:
        with torch.enable_grad():
            model.train()
            for step in range(steps + 1):
                batch = repeated_segments(batch_size, seq_len, model.vocab_size, segment, generator=generator).to(device)
                with torch.set_grad_enabled(step < steps):  # the last record only measures
                    everything, predictable, other = _losses(model(batch.tokens), batch)
                if step == steps or step % log_every == 0:  # this batch's losses, before its update
                    history["step"].append(step)
                    history["loss"].append(predictable.item())
                    history["loss_other"].append(other.item())
                    history["loss_all"].append(everything.item())
                if reports and step and (step % report_every == 0 or step == steps):
                    print(f"step {step:4d}/{steps}  loss on predictable tokens {history['loss'][-1]:.2f}, "
                          f"on the others {history['loss_other'][-1]:.2f}  ({time.perf_counter() - start:.1f} s)",
                          flush=True)
                if step == steps:
                    break
                optimizer.zero_grad()
                everything.backward()
                optimizer.step()
    finally:
        torch.set_num_threads(old_threads)
        model.eval()
    history["seconds"] = [time.perf_counter() - start]
    return history


PHASE_RECORDS = 5  # records in a row below the threshold that make a phase change (one noisy batch can't)


def phase_change_step(history: dict[str, list[float]], threshold: float, consecutive: int = PHASE_RECORDS) -> int | None:
    """The first recorded step from which ``consecutive`` records in a row have a predictable loss
    below ``threshold``, or None.

    Each record is the loss of one training batch, and one batch can dip below the threshold by
    chance; ``consecutive`` independent batches in a row (default :data:`PHASE_RECORDS`, 50
    steps when a record is taken every 10) cannot be one noisy batch. A run that drops in its
    last ``consecutive - 1`` records is not counted. A natural threshold is
    ``math.log(V) / 2``: halfway between a model that knows nothing (uniform over the
    vocabulary, ``ln V``) and one that copies perfectly (0).
    """
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or math.isnan(threshold):
        raise ValueError(f"threshold must be a number (a loss, e.g. math.log(vocab_size) / 2), got {threshold!r}")
    consecutive = check_positive_int(consecutive, "consecutive")
    below = [loss < threshold for loss in history["loss"]]
    for i, step in enumerate(history["step"]):
        if all(below[i:i + consecutive]) and len(below[i:i + consecutive]) == consecutive:
            return int(step)
    return None
