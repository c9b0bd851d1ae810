"""``python -m mha_course``: your own copies of the exercises, and how far you are.

    python -m mha_course start 01     copy exercise 01 to workspace/ (never overwrites)
    python -m mha_course list         list the exercises and the ones you have started
    python -m mha_course progress     run your copies and show which exercises pass
    python -m mha_course update       update the course (git pull), keeping your edits in workspace/

None of these imports PyTorch in this process, so ``start`` and ``list`` answer at once.
"""

from __future__ import annotations

import argparse
import sys

from .workspace import AlreadyStarted, WorkspaceError, course_root, list_exercises, start

# `start`'s exit status when you already have a copy: nothing was copied, nothing is wrong.
# `make exercise` treats it as success; a script can tell it from 0 (copied) and 1 (error).
EXIT_ALREADY_STARTED = 3

EPILOG = f"""exit status of `start`: 0 copied; {EXIT_ALREADY_STARTED} you already have a copy (kept, nothing
copied); 1 an error (no such exercise, no course folder). `progress` exits 0 whatever your results."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha_course", epilog=EPILOG,
                                     description="The course's exercises, in your own workspace.")
    commands = parser.add_subparsers(dest="command", required=True)
    start_cmd = commands.add_parser("start", help="copy an exercise notebook into workspace/ (never overwrites)",
                                    epilog=EPILOG)
    start_cmd.add_argument("exercise", help="its number (01) or name (01_dot_product_attention)")
    commands.add_parser("list", help="list the exercises and which ones you have started")
    progress_cmd = commands.add_parser(
        "progress", help="run your notebooks in workspace/ (copies, in fresh kernels) and show which exercises pass",
        description="Run a copy of each exercise notebook you have in workspace/ in a fresh kernel (your files "
                    "are never modified) and print, for every exercise of the course, what its check says.")
    progress_cmd.add_argument("chapters", nargs="*", metavar="NN", help="only these chapters (default: all)")
    progress_cmd.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                              help="how long one notebook's cells may run in all (default: 120)")
    commands.add_parser(
        "update", help="update the course to its newest version (git pull), even after you ran the chapters",
        description="Bring the course up to date: course notebooks changed only by running them are put back, "
                    "your own edits to course files are saved in workspace/saved/<date>/ first, then "
                    "`git pull --ff-only`. Never touches the rest of workspace/, except to rename your copy of "
                    "an exercise the course renamed.")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            target = start(args.exercise)
            root = course_root()
            print(f"Created {target.relative_to(root)}. Open it in JupyterLab and work there;")
            print("`make update` never changes workspace/, and the solutions are in solutions/.")
            print("`make progress` shows which exercises you have done.")
        elif args.command == "update":
            from .update import UpdateError, update

            try:
                return update()
            except UpdateError as error:
                print(f"make update: {error}", file=sys.stderr)
                return 1
        elif args.command == "list":
            for name, started in list_exercises():
                print(f"{'started' if started else '       '}  {name}")
        else:
            from . import progress  # nbclient and its kernel only now

            timeout = progress.DEFAULT_TIMEOUT if args.timeout is None else args.timeout
            return progress.main(args.chapters, timeout=timeout)
    except AlreadyStarted as kept:
        print(kept)
        return EXIT_ALREADY_STARTED
    except WorkspaceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
