"""``python -m mha_lib.sentiment study``: train chapter 07's and chapter 11's models from many
seeds, on several CPU kernel paths, and write what the chapters measure to a JSON file.

    python -m mha_lib.sentiment study                          # seeds 0-29, every kernel path
    python -m mha_lib.sentiment study --seeds 0-4 --kernels native --output my_study.json
    python -m mha_lib.sentiment study --parts heads            # chapter 07's measurements only

PyTorch picks its CPU kernels (AVX-512, AVX2, plain C++ "default") once, when it is
imported, from the environment variable ``ATEN_CPU_CAPABILITY``; so each kernel path runs
in its own Python process. Each process trains on one CPU thread, the set-up of the
chapters. ``make study`` rewrites the committed file, ``mha_lib/sentiment/study.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNELS = ("native", "avx512", "avx2", "default")


def parse_seeds(text: str) -> list[int]:
    """``"0-19"`` or ``"0,3,5-7"`` -> a list of seeds."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            seeds += range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must look like 0-19 or 0,3,5-7, got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"seeds must be non-negative and at least one, got {text!r}")
    return list(dict.fromkeys(seeds))


def parse_list(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        items = [item.strip().lower() for item in text.split(",") if item.strip()]
        if not items or any(item not in choices for item in items):
            raise argparse.ArgumentTypeError(f"choose among {', '.join(choices)} (comma-separated), got {text!r}")
        return items
    return parse


def build_parser() -> argparse.ArgumentParser:
    from .study import PARTS

    parser = argparse.ArgumentParser(prog="python -m mha_lib.sentiment",
                                     description="The seed study behind chapters 07 and 11.")
    commands = parser.add_subparsers(dest="command", required=True)
    study = commands.add_parser("study", help="train and measure many seeds on several kernel paths",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    study.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-29"), help="e.g. 0-29 (default) or 0,3,5-7")
    study.add_argument("--kernels", type=parse_list(KERNELS), default=list(KERNELS),
                       help="CPU kernel paths, comma-separated: native (what PyTorch picks), avx512, avx2, default "
                            "(plain C++); paths this CPU lacks or that repeat another are skipped (default: all)")
    study.add_argument("--parts", type=parse_list(PARTS), default=list(PARTS),
                       help="heads (chapter 07), halves (chapter 11); default: both")
    study.add_argument("--output", type=Path, default=Path("sentiment_study.json"),
                       help="the JSON file to write (default: sentiment_study.json here)")
    study.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the models train")
    worker = commands.add_parser("worker", help=argparse.SUPPRESS)  # one kernel path, in its own process
    worker.add_argument("--seeds", type=parse_seeds, required=True)
    worker.add_argument("--parts", type=parse_list(PARTS), required=True)
    worker.add_argument("--device", default="cpu")
    worker.add_argument("--output", type=Path, required=True)
    return parser


def run_worker(args: argparse.Namespace) -> int:
    import torch

    from .study import run_study

    torch.set_num_threads(1)  # this process is ours: one thread, as in the chapters
    runs = run_study(args.seeds, args.parts, args.device)
    args.output.write_text(json.dumps(runs))
    return 0


def kernel_env(kernel: str) -> dict[str, str]:
    """The environment of a process that takes that kernel path."""
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernel != "native":
        env["ATEN_CPU_CAPABILITY"] = kernel
    return env


def distinct_paths(kernels: list[str]) -> dict[str, str]:
    """``{kernel: path PyTorch takes}``, keeping the first kernel of each path: on a CPU
    without AVX-512, ``avx512`` falls back to what ``native`` already runs."""
    found: dict[str, str] = {}
    for kernel in kernels:
        probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                               env=kernel_env(kernel), capture_output=True, text=True)
        path = probe.stdout.strip() if probe.returncode == 0 else ""
        if not path:
            print(f"kernel path {kernel}: PyTorch does not start with it here; skipped", file=sys.stderr)
        elif path in found.values():
            print(f"kernel path {kernel}: runs {path}, as another one does; skipped", file=sys.stderr)
        else:
            found[kernel] = path
    return found


def run_kernels(args: argparse.Namespace, argv: list[str]) -> int:
    from .study import save_study

    runs, started = [], time.perf_counter()
    if args.device != "cpu":
        kernels = {"native": args.device}
    elif len(args.kernels) == 1:  # nothing to compare: the worker records the path it ran
        kernels = {args.kernels[0]: args.kernels[0]}
    else:
        kernels = distinct_paths(args.kernels)
    with tempfile.TemporaryDirectory() as tmp:
        for kernel, path in kernels.items():
            env = kernel_env(kernel)
            out = Path(tmp) / f"{kernel}.json"
            command = [sys.executable, "-m", "mha_lib.sentiment", "worker", "--seeds",
                       ",".join(map(str, args.seeds)), "--parts", ",".join(args.parts),
                       "--device", args.device, "--output", str(out)]
            print(f"kernel path {kernel} ({path}): {len(args.seeds)} seeds", file=sys.stderr, flush=True)
            if subprocess.run(command, env=env).returncode != 0:
                print(f"error: the run on kernel path {kernel!r} failed", file=sys.stderr)
                return 1
            runs += json.loads(out.read_text())
    command = "python -m mha_lib.sentiment " + shlex.join(argv)
    path = save_study(runs, args.output, command=command)
    print(f"wrote {len(runs)} runs to {path} in {time.perf_counter() - started:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.command == "worker":
        return run_worker(args)
    return run_kernels(args, argv)


if __name__ == "__main__":
    sys.exit(main())
