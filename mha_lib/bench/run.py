"""Run the benchmark (every variant, length and mode) and print its results as a table."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from . import memory
from .steps import BASELINE, EXPLICIT, MODES, VARIANTS, Step, make_mask, make_step, make_variants
from .timing import time_steps

__all__ = ["QUICK_LENGTHS", "DEFAULT_LENGTHS", "Result", "format_table", "run_benchmark"]

DEFAULT_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
QUICK_LENGTHS = (128, 256, 512)
# Peak memory of an explicit step, in (B, H, L, L) weight matrices (measured on CPU: ~3.2).
EXPLICIT_COPIES = 4


@dataclass
class Result:
    """One variant at one length in one mode. ``seconds`` is the median time per step over the
    repetitions, ``fastest`` the fastest repetition; ``peak_bytes`` the peak memory rise (None
    where not measured); ``skipped`` says why the variant was not run."""

    length: int
    variant: str
    mode: str
    seconds: float | None = None
    fastest: float | None = None
    peak_bytes: int | None = None
    skipped: str | None = None


def _skipped(variants: Sequence[str], weights_bytes: int, budget: int | None, mask: str) -> dict[str, str]:
    """The variants whose (B, H, L, L) weights would not fit in ``budget`` bytes, and why."""
    stores = EXPLICIT if mask == "none" else VARIANTS  # with a mask, assume any variant may store them
    if budget is None or EXPLICIT_COPIES * weights_bytes <= 0.8 * budget:
        return {}
    return {v: f"needs ~{EXPLICIT_COPIES * weights_bytes / 2**30:.0f} GiB" for v in variants if v in stores}


def run_benchmark(
    lengths: Sequence[int] = QUICK_LENGTHS,
    batch: int = 1,
    d_model: int = 512,
    num_heads: int = 8,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    warmup: int = 1,
    min_time: float = 0.05,
    modes: Sequence[str] = MODES,
    variants: Sequence[str] = VARIANTS,
    memory: bool = True,
    log: Callable[[str], None] | None = None,
    mask: str = "none",
    dropout: float = 0.0,
) -> list[Result]:
    """Time every variant at every length in every mode, and measure its peak memory rise.

    ``mask`` is a key of :data:`~mha_lib.bench.MASKS`; ``dropout`` acts in training steps
    only. Time: :func:`~mha_lib.bench.time_steps`; memory: :func:`~mha_lib.bench.peak_memories`
    (on the CPU in a worker process, after the timing). Variants whose ``(B, H, L, L)``
    weights would not fit in the free memory (estimated) are skipped.
    """
    device = torch.device(device)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    functions = make_variants(d_model, num_heads, device, dtype, dropout=dropout)
    itemsize = torch.empty((), dtype=dtype).element_size()
    steps: dict[tuple[int, str, str], Callable[[], None]] = {}
    skipped: dict[int, dict[str, str]] = {}
    for length in lengths:
        x = torch.randn(batch, length, d_model).to(device, dtype)
        attn_mask = make_mask(mask, length, num_heads, device, dtype)
        skipped[length] = _skipped(variants, batch * num_heads * length * length * itemsize, _free(device), mask)
        for mode in modes:
            for v in variants:
                if v not in skipped[length]:
                    steps[(length, mode, v)] = make_step(functions[v], x, mode, attn_mask)
    # Every step at every length in one round robin: a busy stretch of the machine slows all the
    # lengths alike, instead of bending the curve at the one length it happened to hit.
    if log is not None:
        log(f"  timing {len(steps)} steps, round robin, {repeats} repetitions")
    times = time_steps(steps, device, repeats=repeats, warmup=warmup, min_time=min_time)
    results, to_measure = [], []
    for length in lengths:
        for mode in modes:
            for v in variants:
                if v in skipped[length]:
                    results.append(Result(length, v, mode, skipped=skipped[length][v]))
                    continue
                key = (length, mode, v)
                results.append(Result(length, v, mode, statistics.median(times[key]), min(times[key])))
                to_measure.append(results[-1])
    del steps
    if memory and to_measure:
        if log is not None:
            log(f"  measuring the peak memory of {len(to_measure)} steps")
        steps = [Step(r.variant, r.mode, r.length, batch, d_model, num_heads, dtype, device, mask, dropout)
                 for r in to_measure]
        for r, peak in zip(to_measure, _peaks(steps, device)):
            r.peak_bytes = peak
    return results


def _free(device: torch.device) -> int | None:
    return memory.free_memory(device)  # looked up at call time, so that a test can replace it


def _peaks(steps: Sequence[Step], device: torch.device) -> list[int | None]:
    return memory.peak_memories(steps, device)


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or base <= 0:
        return "-"
    return f"{value / base:.2f}x"


def format_table(results: Sequence[Result], baseline: str = BASELINE, stat: str = "median") -> str:
    """A text table: per length and variant, the time (``stat``: "median" or "min" over the
    repetitions) and the peak memory rise of each mode, and their ratios to ``baseline``."""
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
    field = "seconds" if stat == "median" else "fastest"
    modes = [m for m in MODES if any(r.mode == m for r in results)]
    by_key = {(r.length, r.variant, r.mode): r for r in results}
    lengths = sorted({r.length for r in results})
    variants = [v for v in VARIANTS if any(r.variant == v for r in results)]
    head = f"{'L':>6}  {'variant':<16}"
    for m in modes:
        head += f" | {m + ' ms':>12} {'ratio':>6} {'peak MiB':>10} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for length in lengths:
        for v in variants:
            line = f"{length:>6}  {v:<16}"
            for m in modes:
                r, base = by_key.get((length, v, m)), by_key.get((length, baseline, m))
                if r is None or r.skipped:
                    line += f" | {'skip':>12} {'':>6} {'':>10} {'':>6}"
                    continue
                time_ms = f"{1e3 * getattr(r, field):.2f}"
                mib = "-" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.1f}"
                line += (
                    f" | {time_ms:>12} {_ratio(getattr(r, field), base and getattr(base, field)):>6}"
                    f" {mib:>10} {_ratio(r.peak_bytes, base and base.peak_bytes):>6}"
                )
            lines.append(line)
    skipped = sorted({f"{r.variant} at L={r.length}: {r.skipped}" for r in results if r.skipped})
    if skipped:
        lines.append("skipped (the (B, H, L, L) weights would not fit): " + "; ".join(skipped))
    return "\n".join(lines)
