"""Your own copies of the exercises, which ``git pull`` never touches.

    python -m mha_course start 01     # copy exercises/01_*.ipynb to workspace/, once
    python -m mha_course list         # the exercises, and which ones you have started
    python -m mha_course progress     # which of them pass (mha_course.progress)

``workspace/`` is ignored by git: updates to the course change ``exercises/`` and
``solutions/``, never your copies. A copy that exists is never overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["AlreadyStarted", "WorkspaceError", "course_root", "find_exercise", "start", "list_exercises"]

WORKSPACE_README = """# Your workspace

Your own copies of the exercises live here. Git ignores this folder, so `git pull` never
changes it: update the course freely. Start an exercise with `python -m mha_course start NN`
(or `make exercise N=NN`); it refuses to overwrite a copy you already have.
`make progress` (or `python -m mha_course progress`) runs a copy of each of your notebooks and
shows which exercises pass; it never modifies them.
"""
# Keep the copies as plain notebooks: no paired .py files in the workspace.
WORKSPACE_JUPYTEXT = 'formats = "ipynb"\n'


class WorkspaceError(Exception):
    """Something the learner can fix; the message says how."""


class AlreadyStarted(WorkspaceError):
    """The learner already has a copy of this exercise: it is kept, nothing is copied."""


def course_root() -> Path:
    """The course repository: ``MHA_COURSE_ROOT``, else the checkout mha_course lives in, else the cwd."""
    candidates = [os.environ.get("MHA_COURSE_ROOT"), Path(__file__).resolve().parent.parent, Path.cwd()]
    for candidate in candidates:
        if candidate and (Path(candidate) / "exercises").is_dir():
            return Path(candidate).resolve()
    raise WorkspaceError("can't find the course's exercises/ folder; run this from the course repository "
                         "or set MHA_COURSE_ROOT to it")


def _exercises(root: Path) -> list[Path]:
    return sorted((root / "exercises").glob("[0-9][0-9]_*.ipynb"))


def find_exercise(which: str, root: Path | None = None) -> Path:
    """The exercise notebook for ``which``: ``1``, ``01``, ``ch01`` or its name."""
    root = root or course_root()
    key = which.strip().removeprefix("ch").removesuffix(".ipynb")
    exercises = _exercises(root)
    matches = [p for p in exercises if p.stem == key or (key.isdigit() and p.stem[:2] == f"{int(key):02d}")]
    if len(matches) != 1:
        available = ", ".join(p.stem for p in exercises) or "none"
        raise WorkspaceError(f"no exercise {which!r}; available: {available}")
    return matches[0]


def start(which: str, root: Path | None = None) -> Path:
    """Copy an exercise notebook into ``workspace/`` (outputs cleared); never overwrite."""
    root = root or course_root()
    source = find_exercise(which, root)
    workspace = root / "workspace"
    target = workspace / source.name
    if target.exists():
        raise AlreadyStarted(
            f"You already have {target.relative_to(root)}: your work is kept and nothing was copied.\n"
            f"To start over with a fresh copy, rename yours first, e.g.\n"
            f"    mv {target.relative_to(root)} {target.with_stem(target.stem + '_old').relative_to(root)}\n"
            f"then run this command again."
        )
    workspace.mkdir(exist_ok=True)
    for name, text in (("README.md", WORKSPACE_README), ("jupytext.toml", WORKSPACE_JUPYTEXT)):
        if not (workspace / name).exists():
            (workspace / name).write_text(text)
    # Plain JSON, as nbformat writes it: importing nbformat would take most of a second.
    nb = json.loads(source.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb["metadata"].pop("jupytext", None)
    target.write_text(json.dumps(nb, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return target


def list_exercises(root: Path | None = None) -> list[tuple[str, bool]]:
    """``(name, started)`` for every exercise notebook."""
    root = root or course_root()
    return [(p.stem, (root / "workspace" / p.name).exists()) for p in _exercises(root)]
