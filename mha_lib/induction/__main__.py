"""``python -m mha_lib.induction study``: train chapter 08's one- and two-layer models from many
independent seeds and write what the chapter measures to a JSON file.

    python -m mha_lib.induction study                       # 24 seeds x 1 and 2 layers, 10 rotary
    python -m mha_lib.induction study --seeds 100-104 --configs learned --output my_study.json

Each run has its own initialisation and its own data (see ``mha_lib/induction/run.py``).
The runs train in two processes side by side (``--workers``), one CPU thread each.
``make study`` rewrites the committed file, ``mha_lib/induction/study.json``, and
``python -m mha_lib.induction model`` the trained model of seed 0 that exercise 8.3 takes apart.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from ..studies import add_study_arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mha_lib.induction",
                                     description="The seed study behind chapter 08.")
    commands = parser.add_subparsers(dest="command", required=True)
    study = commands.add_parser("study", help="train and measure many independent seeds",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_arguments(study, output="induction_study.json")
    study.add_argument("--configs", default="learned,rotary",
                       help="comma-separated: learned (one and two layers), rotary (two layers); default: both")
    model = commands.add_parser("model", help="train and save the trained model exercise 8.3 takes apart")
    model.add_argument("--output", type=Path, default=Path("model_seed0.pt"),
                       help="where to write it (default: model_seed0.pt here)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "model":
        from .study import save_trained

        print(f"wrote {save_trained(args.output)}")
        return 0
    from .run import CONFIGS
    from .study import run_study, save_study, study_jobs

    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    if not names or any(name not in CONFIGS for name in names):
        parser.error(f"--configs: choose among {', '.join(CONFIGS)}, got {args.configs!r}")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    started = time.perf_counter()
    runs = run_study(study_jobs(args.seeds, names), device=args.device, workers=args.workers)
    seconds = time.perf_counter() - started
    path = save_study(runs, args.output, command="python -m mha_lib.induction " + shlex.join(argv), seconds=seconds)
    print(f"wrote {len(runs)} runs to {path} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
