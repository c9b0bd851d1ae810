"""Re-execute the course's notebooks and keep each paired with its py:percent file.

    python tools/build_notebooks.py                   # every notebook
    python tools/build_notebooks.py chapters/01_*     # some of them (.py or .ipynb)
    python tools/build_notebooks.py --changed         # only those whose two files disagree
    python tools/build_notebooks.py --from ipynb chapters/03_*   # the inputs are the .ipynb's

For each notebook:
1. pair: the two files agree when the ``.py`` is exactly what jupytext writes from the
   ``.ipynb``. When they disagree, the file that holds the edits gives the inputs. That is
   decided by content, never by file times (a git checkout resets them): the file that differs
   from what this tool last wrote (recorded in ``build/notebook_pairs.json``), else from git's
   HEAD. When both hold edits, or neither can be told, it stops and asks for ``--from``;
   a new notebook (no record, not in git) takes its ``.py``;
2. execute it top to bottom in a fresh kernel, in its own folder, on the CPU
   (``MHA_DEVICE=cpu``), so the committed outputs are the ones CI compares;
3. write the ``.ipynb`` with its outputs, and the ``.py`` from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from jupytext.config import load_jupytext_config
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("chapters", "solutions", "exercises")
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
RECORD = ROOT / "build" / "notebook_pairs.json"  # notebook -> sha256 of the .py this tool last wrote


class PairError(Exception):
    """The two files of a pair disagree, and which one holds the edits cannot be told."""


def find_notebooks(args: list[str]) -> list[Path]:
    if not args:
        paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("[0-9][0-9]_*.py"))]
        paths += [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb"))]
    else:
        paths = [Path(a).resolve() for a in args]
    stems = dict.fromkeys(p.with_suffix("") for p in paths if p.suffix in (".py", ".ipynb"))
    return [s.with_suffix(".ipynb") for s in stems]


def as_py(ipynb: Path) -> str:
    """The py:percent text jupytext writes from ``ipynb`` (with the repository's jupytext.toml)."""
    return jupytext.writes(jupytext.read(ipynb), fmt="py:percent", config=load_jupytext_config(str(ipynb)))


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def load_record() -> dict[str, str]:
    try:
        return json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}


def differs_from_head(path: Path) -> bool | None:
    """Whether ``path`` differs from git's HEAD (True for a file git does not track); None without git."""
    rel = str(path.relative_to(ROOT))
    try:
        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", rel], cwd=ROOT, capture_output=True)
        if tracked.returncode != 0:
            inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=ROOT, capture_output=True)
            return True if inside.returncode == 0 else None
        return subprocess.run(["git", "diff", "--quiet", "HEAD", "--", rel], cwd=ROOT).returncode != 0
    except OSError:  # no git on this machine
        return None


def source_of(ipynb: Path, record: dict[str, str], choice: str | None) -> str | None:
    """Which file gives the inputs, "py" or "ipynb"; None when the two agree."""
    py = ipynb.with_suffix(".py")
    if not ipynb.exists() or not py.exists():
        return "py" if py.exists() else "ipynb"
    py_text, nb_text = py.read_text(), as_py(ipynb)
    if py_text == nb_text:
        return None
    if choice:
        return choice
    key = str(ipynb.relative_to(ROOT))
    if key in record:  # what changed since this tool wrote the pair
        edited = {"py": sha(py_text) != record[key], "ipynb": sha(nb_text) != record[key]}
    else:
        edited = {"py": differs_from_head(py), "ipynb": differs_from_head(ipynb)}
        if edited["py"] is None:  # no git: the .py is where the course is edited
            return "py"
        if not any(edited.values()):  # committed as they are: the .py is the reviewed source
            return "py"
    if edited["py"] and edited["ipynb"]:
        raise PairError(f"{py.relative_to(ROOT)} and {ipynb.name} were both edited and disagree; "
                        "rerun with --from py or --from ipynb to say which holds the inputs")
    return "py" if edited["py"] else "ipynb"


def jupytext_cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "jupytext", "--quiet", *args], check=True, cwd=ROOT)


def build(ipynb: Path, source: str | None, timeout: int) -> float:
    py = ipynb.with_suffix(".py")
    if source == "py":  # the .py's inputs into the .ipynb (a new one when there is none)
        jupytext_cli(*(["--update"] if ipynb.exists() else []), "--to", "ipynb", str(py))
    elif source == "ipynb":
        jupytext_cli("--to", "py:percent", str(ipynb))
    nb = nbformat.read(ipynb, as_version=4)
    nb.metadata["kernelspec"] = KERNEL
    start = time.perf_counter()
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(ipynb.parent)}},
    ).execute()
    seconds = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, ipynb)
    jupytext_cli("--to", "py:percent", str(ipynb))
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="notebooks (.ipynb or .py); default: all")
    parser.add_argument("--changed", action="store_true",
                        help="build only the notebooks whose .py and .ipynb disagree")
    parser.add_argument("--from", dest="source", choices=("py", "ipynb"),
                        help="take the inputs from this file of each pair that disagrees")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args(argv)
    os.environ["MHA_DEVICE"] = "cpu"  # committed outputs come from the CPU, as in CI
    record = load_record()
    try:
        plan = [(ipynb, source_of(ipynb, record, args.source)) for ipynb in find_notebooks(args.paths)]
    except PairError as error:
        print(f"build_notebooks: {error}", file=sys.stderr)
        return 1
    if args.changed:
        plan = [(ipynb, source) for ipynb, source in plan if source is not None]
        if not plan:
            print("every pair agrees: nothing to build")
    for ipynb, source in plan:
        came_from = f" (inputs from the .{source})" if source else ""
        print(f"{ipynb.relative_to(ROOT)}{came_from} ...", end=" ", flush=True)
        seconds = build(ipynb, source, args.timeout)
        record[str(ipynb.relative_to(ROOT))] = sha(ipynb.with_suffix(".py").read_text())
        RECORD.parent.mkdir(exist_ok=True)
        RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        print(f"{seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
