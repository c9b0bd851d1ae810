"""The command line, ``python -m mha_lib.bench`` (``--help`` lists every option)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import torch

from ..device import get_device, parse_device
from .memory import cpu_memory_supported
from .plots import plot_results
from .run import DEFAULT_LENGTHS, QUICK_LENGTHS, format_table, run_benchmark
from .steps import BASELINE, DTYPES, MASKS, MODES, VARIANTS

__all__ = ["build_parser", "main", "positive_int"]


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (both benchmarks' sizes and counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _device(text: str) -> torch.device | str:
    if text == "auto":
        return text  # main() asks get_device(), and reports its message if MHA_DEVICE is wrong
    try:
        return parse_device(text, "--device")
    except (ValueError, RuntimeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _dropout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mha_lib.bench",
        description="Time and peak memory of the teaching MultiHeadAttention, EfficientMultiHeadAttention "
        "and torch.nn.MultiheadAttention (need_weights=True / False) against sequence length.",
        epilog="Ratios are to nn.MHA (nn.MultiheadAttention with need_weights=False) at the same length. "
        "See python -c 'import mha_lib.bench; help(mha_lib.bench)' for how time and memory are measured.",
    )
    parser.add_argument("--device", type=_device, default="auto",
                        help="auto (mha_lib.get_device(), MHA_DEVICE overrides it), cpu, cuda, cuda:N or mps")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--batch", type=positive_int, default=1, help="batch size B (default 1)")
    parser.add_argument("--d-model", type=positive_int, default=512, help="model width (default 512)")
    parser.add_argument("--heads", type=positive_int, default=8, help="number of heads H (default 8)")
    parser.add_argument("--lengths", type=positive_int, nargs="+", metavar="L",
                        help=f"sequence lengths (default {' '.join(map(str, DEFAULT_LENGTHS))}; "
                        f"with --quick {' '.join(map(str, QUICK_LENGTHS))})")
    parser.add_argument("--mask", choices=list(MASKS), default="none",
                        help="; ".join(f"{k}: {v}" for k, v in MASKS.items()) + " (default none)")
    parser.add_argument("--dropout", type=_dropout, default=0.0,
                        help="dropout on the attention weights, in training steps only (default 0)")
    parser.add_argument("--repeats", type=positive_int, help="timed repetitions per variant (default 5; --quick 3)")
    parser.add_argument("--warmup", type=positive_int, default=1, help="untimed calls per variant first (default 1)")
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


def _memory_method(device: torch.device) -> str:
    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated"
    if device.type == "cpu" and cpu_memory_supported():
        return "peak RSS of a worker process"
    return "not measured"


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
    device = args.device
    if device == "auto":
        try:
            device = get_device()
        except (ValueError, RuntimeError) as error:  # a wrong MHA_DEVICE: one line, in get_device()'s words
            print(f"{parser.prog}: error: --device auto: {error}", file=sys.stderr)
            return 2

    print(f"torch {torch.__version__} on {device.type}"
          f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, "
          f"{torch.get_num_threads()} CPU threads, {args.dtype}")
    print(f"B={args.batch}, d_model={args.d_model}, H={args.heads}, mask {args.mask}, dropout {args.dropout}; "
          f"{args.stat} of {repeats} round-robin repetitions after {args.warmup} warm-up; "
          f"peak memory: {'not measured' if args.no_memory else _memory_method(device)}")
    results = run_benchmark(
        lengths, args.batch, args.d_model, args.heads, device, DTYPES[args.dtype], repeats=repeats,
        warmup=args.warmup, min_time=min_time, modes=args.modes, variants=args.variants,
        memory=not args.no_memory, log=lambda line: print(line, file=sys.stderr, flush=True),
        mask=args.mask, dropout=args.dropout,
    )
    print(format_table(results, stat=args.stat))
    if args.plot:
        plot_results(results, args.plot, stat=args.stat,
                     title=f"{device.type}, {args.dtype}, B={args.batch}, d_model={args.d_model}, H={args.heads}")
        print(f"plot saved to {args.plot}")
    return 0
