"""``python -m mha_course``: your own copies of the exercises, and how far you are.

    python -m mha_course start 01     copy exercise 01 to workspace/ (never overwrites)
    python -m mha_course list         list the exercises and the ones you have started
    python -m mha_course progress     run your copies and show which exercises pass
    python -m mha_course update       update the course (git pull), keeping your edits in workspace/

For instructors (INSTRUCTORS.md):

    python -m mha_course grade SUBMISSIONS/        grade a folder of students' workspaces (a CSV)
    python -m mha_course export nbgrader|otter DIR  the exercises as nbgrader or Otter assignments

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


def _jobs(text: str) -> int:
    """``--jobs``: a whole number >= 1, else argparse's clear error."""
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1 (how many notebooks run at once)")
    return jobs


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
    progress_cmd.add_argument("--no-fork", action="store_true",
                              help="start every kernel from scratch (slower: each one imports PyTorch again); by "
                                   "default kernels are forked from one process that did, as `grade` does")
    commands.add_parser(
        "update", help="update the course to its newest version (git pull), even after you ran the chapters",
        description="Bring the course up to date: course notebooks changed only by running them are put back, "
                    "your own edits to course files are saved in workspace/saved/<date>/ first, then "
                    "`git pull --ff-only`. Never touches the rest of workspace/, except to rename your copy of "
                    "an exercise the course renamed.")
    grade_cmd = commands.add_parser(
        "grade", help="(instructors) grade a folder of students' workspaces: a CSV and a summary",
        description="Run every student's notebooks as `make progress` does (a copy each, in a fresh kernel, "
                    "the same time limit per notebook) and write one CSV row per student and exercise. "
                    "SUBMISSIONS holds one folder per student (its name is the student's), each a copy of "
                    "the student's workspace/. Nothing in SUBMISSIONS is written. See INSTRUCTORS.md.")
    grade_cmd.add_argument("submissions", metavar="SUBMISSIONS", help="the folder of student folders")
    grade_cmd.add_argument("chapters", nargs="*", metavar="NN", help="only these chapters (default: all)")
    grade_cmd.add_argument("--output", "-o", default="grades.csv", metavar="CSV",
                           help="where to write the grades (default: grades.csv; an existing file is kept)")
    grade_cmd.add_argument("--force", action="store_true", help="replace the --output file if it exists")
    grade_cmd.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                           help="how long one notebook's cells may run in all (default: 120)")
    grade_cmd.add_argument("--seed", type=int, default=None, metavar="N",
                           help="run the checks on hidden inputs drawn with this seed (default: the students' own)")
    grade_cmd.add_argument("--points", action="append", default=[], metavar="N.M=P",
                           help="what exercise N.M is worth (default: as stated in solutions/, else 1); "
                                "repeat or separate with commas: --points 1.4=2,2.1=3")
    grade_cmd.add_argument("--jobs", "-j", type=_jobs, default=None, metavar="N",
                           help="how many notebooks to run at once, each in its own kernel (default: the "
                                "number of cores; 1 runs them one after another)")
    grade_cmd.add_argument("--all-cells", action="store_true",
                           help="also run the cells below each notebook's last check (their errors get a row of "
                                "0 points); by default grading stops there, where no verdict can change")
    grade_cmd.add_argument("--no-fork", action="store_true",
                           help="start every kernel from scratch (slower: each one imports PyTorch again); by "
                                "default kernels are forked from one that did, as `make progress` does")
    export_cmd = commands.add_parser(
        "export", help="(instructors) write the exercises as nbgrader or Otter Assign assignments",
        description="Write one assignment per chapter from solutions/ (the exercises' single source): "
                    "solutions marked for the tool, the learner's checks as visible tests, hidden tests "
                    "on inputs the students never see, and the points. See INSTRUCTORS.md.")
    export_cmd.add_argument("tool", choices=["nbgrader", "otter"], help="which grader to write for")
    export_cmd.add_argument("directory", metavar="DIR", help="where to write (a new or empty folder)")
    export_cmd.add_argument("chapters", nargs="*", metavar="NN", help="only these chapters (default: all)")
    export_cmd.add_argument("--seed", type=int, default=None, metavar="N",
                            help="the hidden tests' seed (default: a new random one, printed)")
    export_cmd.add_argument("--points", action="append", default=[], metavar="N.M=P",
                            help="what exercise N.M is worth (default: as stated in solutions/, else 1)")
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
        elif args.command == "grade":
            from . import grade

            timeout = grade.DEFAULT_TIMEOUT if args.timeout is None else args.timeout
            return grade.main(args.submissions, args.chapters, output=args.output, timeout=timeout, seed=args.seed,
                              points=args.points, force=args.force, jobs=args.jobs, all_cells=args.all_cells,
                              fork=not args.no_fork)
        elif args.command == "export":
            from . import export

            return export.main(args.tool, args.directory, args.chapters, seed=args.seed, points=args.points)
        elif args.command == "list":
            for name, started in list_exercises():
                print(f"{'started' if started else '       '}  {name}")
        else:
            from . import progress  # nbclient and its kernel only now

            timeout = progress.DEFAULT_TIMEOUT if args.timeout is None else args.timeout
            return progress.main(args.chapters, timeout=timeout, fork=not args.no_fork)
    except AlreadyStarted as kept:
        print(kept)
        return EXIT_ALREADY_STARTED
    except WorkspaceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
