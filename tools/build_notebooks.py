"""Re-execute the course's notebooks and keep each paired with its py:percent file.

    python tools/build_notebooks.py                 # every notebook
    python tools/build_notebooks.py chapters/01_*   # some of them (.py or .ipynb)

For each notebook:
1. sync the pair: the newer of ``NN_name.py`` and ``NN_name.ipynb`` gives the
   inputs (jupytext --sync), so you may edit either one;
2. execute it top to bottom in a fresh kernel, in its own folder, on the CPU
   (``MHA_DEVICE=cpu``), so the committed outputs are the ones CI compares;
3. write the ``.ipynb`` with its outputs, and the ``.py`` from it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("chapters", "solutions", "exercises")
KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def find_notebooks(args: list[str]) -> list[Path]:
    if not args:
        paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("[0-9][0-9]_*.py"))]
        paths += [p for folder in FOLDERS for p in sorted((ROOT / folder).glob("[0-9][0-9]_*.ipynb"))]
    else:
        paths = [Path(a).resolve() for a in args]
    stems = dict.fromkeys(p.with_suffix("") for p in paths if p.suffix in (".py", ".ipynb"))
    return [s.with_suffix(".ipynb") for s in stems]


def jupytext(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "jupytext", "--quiet", *args], check=True, cwd=ROOT)


def build(ipynb: Path, timeout: int) -> float:
    py = ipynb.with_suffix(".py")
    jupytext("--sync", str(py if py.exists() else ipynb))
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
    jupytext("--to", "py:percent", str(ipynb))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="notebooks (.ipynb or .py); default: all")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = parser.parse_args()
    os.environ["MHA_DEVICE"] = "cpu"  # committed outputs come from the CPU, as in CI
    for ipynb in find_notebooks(args.paths):
        print(f"{ipynb.relative_to(ROOT)} ...", end=" ", flush=True)
        print(f"{build(ipynb, args.timeout):.1f} s")


if __name__ == "__main__":
    main()
