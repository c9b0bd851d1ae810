"""Time and memory of four multi-head attention implementations against sequence length.

    python -m mha_lib.bench                       # 128 … 4096 on mha_lib.get_device()
    python -m mha_lib.bench --quick               # a small run, under a minute on a CPU
    python -m mha_lib.bench --batch 32 --lengths 100 --repeats 15   # the book's configuration
    python -m mha_lib.bench --plot bench.png      # also draw time and memory against length

The variants, all self-attention with the same weights:

- ``teaching``: :class:`mha_lib.MultiHeadAttention`, which stores every ``(B, H, L, L)`` weight;
- ``efficient``: :class:`mha_lib.EfficientMultiHeadAttention` (fused projection, fused kernel);
- ``nn.MHA(weights)``: ``torch.nn.MultiheadAttention`` with ``need_weights=True`` (its default);
- ``nn.MHA``: the same with ``need_weights=False``, the baseline of every ratio.

**Time.** "forward" runs under ``torch.no_grad()`` in eval mode (inference; there
``nn.MultiheadAttention`` takes its own fused "fast path", ``torch._native_multi_head_attention``);
"fwd+bwd" is a training step: forward, then ``out.backward(g)`` with a fixed random ``g``
(a dense upstream gradient, as a loss would send), gradients reset to None before each step.
Every variant is warmed up first; then each repetition times every variant once, in a
rotating order (round robin), so that a slow spell of a shared machine hits all of them
alike. The table shows the median over repetitions (``--stat min``: the fastest one, which
other programs on a busy machine disturb less). On CUDA the device is synchronised
before the clock starts and stops. Short steps are repeated inside one measurement, so that
each measurement lasts at least ``--min-time`` seconds.

**Peak memory** is the rise of allocated tensor memory during one step, above what was
allocated before it (inputs, weights):

- CUDA: ``torch.cuda.reset_peak_memory_stats`` and ``torch.cuda.max_memory_allocated``
  (the caching allocator's own count of live tensor bytes).
- CPU: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of
  PyTorch's CPU allocator with its size; the peak of their running sum is the peak rise.
  Its limits: it counts tensor memory only (not memory that libraries such as oneDNN or
  OpenMP take with their own ``malloc``), only allocations made on the calling thread (the
  kernels here allocate their buffers before their parallel loops), and not the process's
  RSS (glibc may keep freed pages). Measured in a separate pass, not while timing. Checked
  against the peak RSS of a fresh process (``resource.getrusage``, with
  ``MALLOC_MMAP_THRESHOLD_=65536`` so that glibc gives freed blocks back): within 3 MiB at
  L = 2048, where the teaching module's step takes about 400 MiB.
- Other devices: not measured ("-").

Variants whose ``(B, H, L, L)`` weights would not fit in the free memory (estimated) are
skipped at that length and marked "skip".
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .device import get_device
from .efficient import EfficientMultiHeadAttention
from .multi_head import MultiHeadAttention

__all__ = [
    "BASELINE",
    "VARIANTS",
    "Result",
    "make_variants",
    "main",
    "peak_memory",
    "plot_results",
    "run_benchmark",
    "format_table",
    "time_steps",
]

VARIANTS = ("teaching", "efficient", "nn.MHA(weights)", "nn.MHA")
BASELINE = "nn.MHA"  # need_weights=False
MODES = ("forward", "fwd+bwd")
EXPLICIT = ("teaching", "nn.MHA(weights)")  # the variants that store (B, H, L, L) weights
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
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


def make_variants(
    d_model: int, num_heads: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> dict[str, Callable[[Tensor], Tensor]]:
    """The four implementations with the same weights, as ``x (B, L, D) -> output (B, L, D)``.

    Each callable has a ``.module`` attribute (for ``train()``/``eval()`` and its parameters).
    """
    torch.manual_seed(seed)
    teaching = MultiHeadAttention(d_model, num_heads)
    efficient = EfficientMultiHeadAttention.from_module(teaching)
    torch_mha = nn.MultiheadAttention(d_model, num_heads, batch_first=True)
    with torch.no_grad():  # nn.MultiheadAttention's in_proj_weight is laid out like W_qkv
        torch_mha.in_proj_weight.copy_(efficient.W_qkv.weight)
        torch_mha.in_proj_bias.copy_(efficient.W_qkv.bias)
        torch_mha.out_proj.weight.copy_(efficient.W_o.weight)
        torch_mha.out_proj.bias.copy_(efficient.W_o.bias)
    for module in (teaching, efficient, torch_mha):
        module.to(device, dtype)

    def named(fn: Callable[[Tensor], Tensor], module: nn.Module) -> Callable[[Tensor], Tensor]:
        fn.module = module  # type: ignore[attr-defined]
        return fn

    return {
        "teaching": named(lambda x: teaching(x, x, x), teaching),
        "efficient": named(lambda x: efficient(x, x, x), efficient),
        "nn.MHA(weights)": named(lambda x: torch_mha(x, x, x, need_weights=True)[0], torch_mha),
        "nn.MHA": named(lambda x: torch_mha(x, x, x, need_weights=False)[0], torch_mha),
    }


def make_step(fn: Callable[[Tensor], Tensor], x: Tensor, mode: str) -> Callable[[], None]:
    """One inference forward (``"forward"``) or one training step (``"fwd+bwd"``) of ``fn`` on ``x``."""
    module: nn.Module = fn.module  # type: ignore[attr-defined]
    if mode == "forward":

        def forward() -> None:
            module.eval()
            with torch.no_grad():
                fn(x)

        return forward
    if mode == "fwd+bwd":

        upstream = torch.randn_like(x)  # a dense gradient, as a loss would send back

        def train_step() -> None:
            module.train()
            for p in module.parameters():
                p.grad = None
            fn(x).backward(upstream)

        return train_step
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_steps(
    steps: dict[str, Callable[[], None]],
    device: torch.device | str = "cpu",
    repeats: int = 5,
    warmup: int = 1,
    min_time: float = 0.05,
) -> dict[str, list[float]]:
    """Seconds per call of each step, one entry per repetition, measured round robin.

    Every step is warmed up ``warmup`` times (at least once); the fastest warm-up call sets
    how many calls one measurement makes (enough to last ``min_time`` seconds). Repetition ``r`` runs the
    steps in an order rotated by ``r``, so that none always runs first or last.
    """
    device = torch.device(device)
    names = list(steps)
    calls = {}
    for name in names:
        elapsed = math.inf
        for _ in range(max(1, warmup)):
            _synchronize(device)
            start = time.perf_counter()
            steps[name]()
            _synchronize(device)
            elapsed = min(elapsed, time.perf_counter() - start)
        calls[name] = max(1, math.ceil(min_time / max(elapsed, 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            step, n = steps[name], calls[name]
            _synchronize(device)
            start = time.perf_counter()
            for _ in range(n):
                step()
            _synchronize(device)
            times[name].append((time.perf_counter() - start) / n)
    return times


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2: the profiler's C++ library prints a line at start and stop."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_peak_memory(step: Callable[[], None]) -> int:
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocations = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            allocations.append((event.start_time_ns, event.extra_fields.alloc_size))  # free: size < 0
    live = peak = 0
    for _, size in sorted(allocations):
        live += size
        peak = max(peak, live)
    return peak


def peak_memory(step: Callable[[], None], device: torch.device | str = "cpu") -> int | None:
    """Peak rise of allocated tensor memory, in bytes, while ``step()`` runs once.

    CUDA: the caching allocator's peak statistics. CPU: the running sum of the allocations
    and frees that ``torch.profiler`` records (see the module's docstring for the limits).
    Other devices: None.
    """
    device = torch.device(device)
    if device.type == "cuda":
        _synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        _synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type == "cpu":
        return _cpu_peak_memory(step)
    return None


def free_memory(device: torch.device | str) -> int | None:
    """Bytes the device can still allocate (CPU: MemAvailable of /proc/meminfo), or None."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


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
) -> list[Result]:
    """Time (and measure the peak memory of) every variant at every length; see the module docstring."""
    device = torch.device(device)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    functions = make_variants(d_model, num_heads, device, dtype)
    itemsize = torch.empty((), dtype=dtype).element_size()
    results = []
    for length in lengths:
        x = torch.randn(batch, length, d_model).to(device, dtype)
        budget = free_memory(device)
        weights_bytes = batch * num_heads * length * length * itemsize
        runnable, skipped = [], {}
        for v in variants:
            if v in EXPLICIT and budget is not None and EXPLICIT_COPIES * weights_bytes > 0.8 * budget:
                skipped[v] = f"needs ~{EXPLICIT_COPIES * weights_bytes / 2**30:.0f} GiB"
            else:
                runnable.append(v)
        for mode in modes:
            steps = {v: make_step(functions[v], x, mode) for v in runnable}
            times = time_steps(steps, device, repeats=repeats, warmup=warmup, min_time=min_time)
            for v in variants:
                if v in skipped:
                    results.append(Result(length, v, mode, skipped=skipped[v]))
                    continue
                median = statistics.median(times[v])
                for p in functions[v].module.parameters():  # freed now, not inside the measured step
                    p.grad = None
                peak = peak_memory(steps[v], device) if memory else None
                results.append(Result(length, v, mode, median, min(times[v]), peak))
            if log is not None:
                log(f"  L={length:<6d} {mode:8s} done")
        del x
    return results


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
                memory = "-" if r.peak_bytes is None else f"{r.peak_bytes / 2**20:.1f}"
                line += (
                    f" | {time_ms:>12} {_ratio(getattr(r, field), base and getattr(base, field)):>6}"
                    f" {memory:>10} {_ratio(r.peak_bytes, base and base.peak_bytes):>6}"
                )
            lines.append(line)
    skipped = sorted({f"{r.variant} at L={r.length}: {r.skipped}" for r in results if r.skipped})
    if skipped:
        lines.append("skipped (the (B, H, L, L) weights would not fit): " + "; ".join(skipped))
    return "\n".join(lines)


STYLES = {"teaching": "o-", "efficient": "s-", "nn.MHA(weights)": "^--", "nn.MHA": "v--"}  # some lines overlap


def plot_results(results: Sequence[Result], path: str | os.PathLike | None = None, title: str | None = None,
                 stat: str = "median"):
    """Time (top row) and peak memory (bottom row, where measured) against length, one column per
    mode and one line per variant, on log-log axes. Saves to ``path`` if given; returns the figure."""
    import matplotlib.pyplot as plt

    time_field = "seconds" if stat == "median" else "fastest"
    modes = [m for m in MODES if any(r.mode == m for r in results)]
    rows = [(time_field, f"{stat} time per step (ms)", 1e3)]
    if any(r.peak_bytes for r in results):
        rows.append(("peak_bytes", "peak memory rise (MiB)", 2.0**-20))
    lengths = sorted({r.length for r in results})
    fig, axes = plt.subplots(len(rows), len(modes), figsize=(5.2 * len(modes), 3.6 * len(rows)), squeeze=False)
    for i, (field, ylabel, scale) in enumerate(rows):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for v in VARIANTS:
                points = sorted((r.length, getattr(r, field)) for r in results
                                if r.variant == v and r.mode == mode and getattr(r, field))
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, [y * scale for y in ys], STYLES[v], label=v, alpha=0.85)
            ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel=ylabel,
                   title=f"{mode}: {'memory' if field == 'peak_bytes' else 'time'}")
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _device(text: str) -> torch.device:
    if text == "auto":
        return get_device()
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"device {text!r}: CUDA is not available on this machine")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"device {text!r}: MPS is not available on this machine")
    if device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"unsupported device {text!r}; use auto, cpu, cuda, cuda:N or mps")
    return device


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mha_lib.bench",
        description="Time and peak memory of the teaching MultiHeadAttention, EfficientMultiHeadAttention "
        "and torch.nn.MultiheadAttention (need_weights=True / False) against sequence length.",
        epilog="Ratios are to nn.MHA (nn.MultiheadAttention with need_weights=False) at the same length. "
        "See the module docstring (python -c 'import mha_lib.bench; help(mha_lib.bench)') for how time "
        "and memory are measured.",
    )
    parser.add_argument("--device", type=_device, default="auto",
                        help="auto (mha_lib.get_device(), MHA_DEVICE overrides it), cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--batch", type=_positive_int, default=1, help="batch size B (default 1)")
    parser.add_argument("--d-model", type=_positive_int, default=512, help="model width (default 512)")
    parser.add_argument("--heads", type=_positive_int, default=8, help="number of heads H (default 8)")
    parser.add_argument("--lengths", type=_positive_int, nargs="+", metavar="L",
                        help=f"sequence lengths (default {' '.join(map(str, DEFAULT_LENGTHS))}; "
                        f"with --quick {' '.join(map(str, QUICK_LENGTHS))})")
    parser.add_argument("--repeats", type=_positive_int, help="timed repetitions per variant (default 5; --quick 3)")
    parser.add_argument("--warmup", type=_positive_int, default=1, help="untimed calls per variant first (default 1)")
    parser.add_argument("--min-time", type=float, help="seconds one measurement lasts at least (default 0.1; --quick 0.02)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--stat", choices=("median", "min"), default="median",
                        help="time to report: the median over the repetitions (default), or the fastest, "
                        "which other programs on a shared machine disturb less")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory pass")
    parser.add_argument("--quick", action="store_true", help="short lengths, fewer repetitions")
    parser.add_argument("--plot", metavar="FILE", help="also save a plot of time and memory against length")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (argument errors exit with status 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.d_model % args.heads != 0:
        parser.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    if args.min_time is not None and args.min_time < 0:
        parser.error(f"--min-time must be >= 0, got {args.min_time}")
    if BASELINE not in args.variants:
        parser.error(f"--variants must include the baseline {BASELINE!r}, to which the ratios refer")
    if args.plot:
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):
            parser.error(f"--plot {args.plot}: folder {folder} does not exist")
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    repeats = args.repeats or (3 if args.quick else 5)
    min_time = args.min_time if args.min_time is not None else (0.02 if args.quick else 0.1)
    dtype = DTYPES[args.dtype]
    device = args.device

    method = {"cuda": "torch.cuda.max_memory_allocated", "cpu": "torch.profiler allocation events"}
    print(f"torch {torch.__version__} on {device.type}"
          f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, "
          f"{torch.get_num_threads()} CPU threads, {args.dtype}")
    print(f"B={args.batch}, d_model={args.d_model}, H={args.heads}; {args.stat} of {repeats} round-robin repetitions "
          f"after {args.warmup} warm-up; peak memory: {method.get(device.type, 'not measured')}")
    results = run_benchmark(
        lengths, args.batch, args.d_model, args.heads, device, dtype, repeats=repeats, warmup=args.warmup,
        min_time=min_time, modes=args.modes, variants=args.variants, memory=not args.no_memory,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(format_table(results, stat=args.stat))
    if args.plot:
        plot_results(results, args.plot, stat=args.stat,
                     title=f"{device.type}, {args.dtype}, B={args.batch}, d_model={args.d_model}, H={args.heads}")
        print(f"plot saved to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
