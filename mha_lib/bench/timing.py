"""Time per step, measured round robin so that a busy moment of the machine hits every step alike."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Mapping

import torch

from ..validation import check_device, check_positive_int, check_positive_number, check_whole

__all__ = ["synchronize", "time_steps"]


def synchronize(device: torch.device) -> None:
    """Wait for the device to finish its queued work (CUDA, MPS); the CPU needs no wait."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_steps(
    steps: dict[Hashable, Callable[[], None]],
    device: torch.device | str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
    min_time: float = 0.05,
) -> dict[Hashable, list[float]]:
    """Seconds per call of each step, one entry per repetition, measured round robin.

    Every step is warmed up ``warmup`` times (at least once); the fastest warm-up call sets
    how many calls one measurement makes (enough to last ``min_time`` seconds). Repetition
    ``r`` runs the steps in an order rotated by ``r``, so that none always runs first or last.
    On CUDA and MPS the device is synchronised before the clock starts and stops.
    """
    if not isinstance(steps, Mapping) or not all(callable(step) for step in steps.values()):
        raise TypeError(f"steps must be a dict of functions that take no arguments, {{name: step}}, got {steps!r}")
    repeats, min_time = check_positive_int(repeats, "repeats"), check_positive_number(min_time, "min_time", zero=True)
    warmup = check_whole(warmup, "warmup", "an int >= 0")
    if warmup < 0:
        raise ValueError(f"warmup must be an int >= 0 (0 still runs each step once first), got {warmup}")
    device = check_device(device)
    names = list(steps)
    calls = {}
    for name in names:
        elapsed = math.inf
        for _ in range(max(1, warmup)):
            synchronize(device)
            start = time.perf_counter()
            steps[name]()
            synchronize(device)
            elapsed = min(elapsed, time.perf_counter() - start)
        calls[name] = max(1, math.ceil(min_time / max(elapsed, 1e-9)))
    times: dict[Hashable, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            step, n = steps[name], calls[name]
            synchronize(device)
            start = time.perf_counter()
            for _ in range(n):
                step()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / n)
    return times
