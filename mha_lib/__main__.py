"""``python -m mha_lib``: start exercises in your own workspace.

    python -m mha_lib start 01     copy exercise 01 to workspace/ (never overwrites)
    python -m mha_lib list         list the exercises and the ones you have started
"""

from __future__ import annotations

import argparse
import sys

from .workspace import WorkspaceError, course_root, list_exercises, start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mha_lib", description="The course's exercises, in your own workspace.")
    commands = parser.add_subparsers(dest="command", required=True)
    start_cmd = commands.add_parser("start", help="copy an exercise notebook into workspace/ (never overwrites)")
    start_cmd.add_argument("exercise", help="its number (01) or name (01_dot_product_attention)")
    commands.add_parser("list", help="list the exercises and which ones you have started")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            target = start(args.exercise)
            root = course_root()
            print(f"Created {target.relative_to(root)}. Open it in JupyterLab and work there;")
            print("`git pull` never changes workspace/, and the solutions are in solutions/.")
        else:
            for name, started in list_exercises():
                print(f"{'started' if started else '       '}  {name}")
    except WorkspaceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
