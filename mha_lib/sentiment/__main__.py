"""``python -m mha_lib.sentiment study``: train chapter 07's and chapter 12's models from many
independent seeds and write what the chapters measure to a JSON file.

    python -m mha_lib.sentiment study                          # every configuration and replica
    python -m mha_lib.sentiment study --seeds 100-104 --heads 2 --no-replicas --output my_study.json
    python -m mha_lib.sentiment study --parts heads            # chapter 07's measurements only

Each run draws its own data and its own initialisation (see ``mha_lib/sentiment/run.py``);
the configurations differ in the number of heads. The runs train in two processes side by
side (``--workers``), one CPU thread each. The two-head runs are then repeated as *replicas*
on PyTorch's plain C++ CPU kernels (``ATEN_CPU_CAPABILITY=default``, which a process reads
when it imports PyTorch): the same seeds with other rounding, reported apart, never counted
as samples. ``make study`` rewrites the committed file, ``mha_lib/sentiment/study.json``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from ..studies import add_study_arguments
from ..studies import parse_seeds  # noqa: F401 - its home before mha_lib.studies; tests import it here


def parse_list(choices: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        items = [item.strip().lower() for item in text.split(",") if item.strip()]
        if not items or any(item not in choices for item in items):
            raise argparse.ArgumentTypeError(f"choose among {', '.join(choices)} (comma-separated), got {text!r}")
        return items
    return parse


def parse_heads(text: str) -> list[int]:
    from .study import HEADS

    try:
        heads = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        heads = []
    if not heads or any(h not in HEADS for h in heads):
        raise argparse.ArgumentTypeError(f"heads: choose among {', '.join(map(str, HEADS))} (comma-separated), "
                                         f"got {text!r}")
    return list(dict.fromkeys(heads))


def build_parser() -> argparse.ArgumentParser:
    from .run import PARTS
    from .study import HEADS

    parser = argparse.ArgumentParser(prog="python -m mha_lib.sentiment",
                                     description="The seed study behind chapters 07 and 12.")
    commands = parser.add_subparsers(dest="command", required=True)
    study = commands.add_parser("study", help="train and measure many independent runs",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_study_arguments(study, output="sentiment_study.json")
    study.add_argument("--heads", type=parse_heads, default=list(HEADS),
                       help=f"numbers of heads, comma-separated (default: {','.join(map(str, HEADS))})")
    study.add_argument("--no-replicas", action="store_true",
                       help="skip the two-head replicas on the plain C++ kernel path")
    study.add_argument("--parts", type=parse_list(PARTS), default=list(PARTS),
                       help="heads (chapter 07), halves (chapter 12, two heads only); default: both")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    from .study import run_study, save_study, study_jobs

    started = time.perf_counter()
    jobs = study_jobs(args.seeds, args.heads, replicas=not args.no_replicas and args.device == "cpu")
    runs = run_study(jobs, args.parts, device=args.device, workers=args.workers)
    seconds = time.perf_counter() - started
    path = save_study(runs, args.output, command="python -m mha_lib.sentiment " + shlex.join(argv), seconds=seconds)
    print(f"wrote {len(runs)} runs to {path} in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
