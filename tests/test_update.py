"""``make update`` (``python -m mha_course update``): running the chapters never blocks an update.

Two clones of a small fake course, as a learner has them: a bare "origin" and the learner's
clone, in which JupyterLab saved a notebook after running it (new outputs and execution
counts), the learner edited another (a cell's source) and has their own work in workspace/.
The course then moves on (a commit that changes both notebooks, pushed to origin), and the
learner runs ``python -m mha_course update`` in their clone, as ``make update`` does. Also:
what it refuses (not a clone, no upstream, diverged history), each with a message and
nothing changed, and that the learner's own commits and untracked files are kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=GIT_ENV)
    assert result.returncode == 0, f"git {' '.join(args)} failed in {cwd}:\n{result.stderr}"
    return result.stdout.strip()


GIT_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_AUTHOR_NAME": "Course", "GIT_AUTHOR_EMAIL": "course@example.org",
    "GIT_COMMITTER_NAME": "Course", "GIT_COMMITTER_EMAIL": "course@example.org",
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
}


def notebook(*sources: str, outputs: bool = False) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter")]
    for n, source in enumerate(sources, 1):
        cell = nbformat.v4.new_code_cell(source)
        if outputs:
            cell.execution_count = n
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"ran cell {n}\n")]
        nb.cells.append(cell)
    return nbformat.writes(nb)


def update(clone: Path) -> subprocess.CompletedProcess:
    """What `make update` runs, in the learner's clone (mha_course comes from this repository)."""
    env = dict(GIT_ENV, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "mha_course", "update"], cwd=clone, capture_output=True,
                          text=True, env=env, timeout=60)


@pytest.fixture
def course(tmp_path: Path) -> dict[str, Path]:
    """origin (bare), the maintainers' clone and the learner's clone of a two-chapter course."""
    author = tmp_path / "author"
    (author / "chapters").mkdir(parents=True)
    (author / ".gitignore").write_text("workspace/\n")
    (author / "README.md").write_text("# The course\n")
    (author / "chapters" / "01_run.ipynb").write_text(notebook("x = 1", "print(x)"))
    (author / "chapters" / "02_edit.ipynb").write_text(notebook("y = 2", "print(y)"))
    git(tmp_path, "init", "--quiet", "-b", "main", str(author))
    git(author, "add", ".")
    git(author, "commit", "--quiet", "-m", "the course")
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "--quiet", "--bare", str(author), str(origin))
    git(author, "remote", "add", "origin", str(origin))
    git(author, "fetch", "--quiet", "origin")
    git(author, "branch", "--quiet", "--set-upstream-to=origin/main")
    learner = tmp_path / "learner"
    git(tmp_path, "clone", "--quiet", str(origin), str(learner))
    return {"origin": origin, "author": author, "learner": learner}


def publish(author: Path, message: str = "chapters 01 and 02, improved") -> str:
    """A new version of the course: both notebooks change; pushed to origin. Returns its commit."""
    (author / "chapters" / "01_run.ipynb").write_text(notebook("x = 10", "print(x)"))
    (author / "chapters" / "02_edit.ipynb").write_text(notebook("y = 20", "print(y)", "print(y * 2)"))
    git(author, "commit", "--quiet", "-am", message)
    git(author, "push", "--quiet", "origin", "main")
    return git(author, "rev-parse", "HEAD")


def status(clone: Path) -> list[str]:
    return git(clone, "status", "--porcelain", "--untracked-files=all").splitlines()


def test_update_after_running_and_editing_keeps_the_edits_and_reaches_origin(course):
    learner, author = course["learner"], course["author"]
    chapters = learner / "chapters"
    # JupyterLab's autosave after Run All: outputs and execution counts, the same sources.
    (chapters / "01_run.ipynb").write_text(notebook("x = 1", "print(x)", outputs=True))
    # The learner's own edit to a course notebook (and it was run too).
    edited = notebook("y = 2 + 40  # my idea", "print(y)", outputs=True)
    (chapters / "02_edit.ipynb").write_text(edited)
    (learner / "workspace").mkdir()
    mine = learner / "workspace" / "01_my_exercise.ipynb"
    mine.write_text(notebook("my work"))
    mine_before = (mine.read_bytes(), mine.stat().st_mtime_ns)
    new_head = publish(author)
    assert subprocess.run(["git", "pull", "--ff-only"], cwd=learner, capture_output=True,
                          env=GIT_ENV).returncode != 0, "a plain git pull should fail here (that's the point)"

    result = update(learner)

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert git(learner, "rev-parse", "HEAD") == new_head == git(course["origin"], "rev-parse", "main")
    assert [line for line in status(learner) if not line[3:].startswith("workspace/")] == [], status(learner)
    for name in ("01_run.ipynb", "02_edit.ipynb"):
        assert (chapters / name).read_text() == (author / "chapters" / name).read_text(), name
    saved = list((learner / "workspace" / "saved").glob("*/chapters/02_edit.ipynb"))
    assert len(saved) == 1 and saved[0].read_text() == edited, (saved, output)
    assert str(saved[0].relative_to(learner)) in output, f"the output does not say where the edits went:\n{output}"
    assert not list((learner / "workspace" / "saved").glob("*/chapters/01_run.ipynb")), \
        "a notebook changed only by running is not the learner's work; it should not be saved"
    assert (mine.read_bytes(), mine.stat().st_mtime_ns) == mine_before, "workspace/ was touched"

    again = update(learner)  # nothing new: up to date, nothing saved twice
    assert again.returncode == 0 and "up to date" in again.stdout, again.stdout + again.stderr
    assert len(list((learner / "workspace" / "saved").rglob("*.ipynb"))) == 1


def test_untracked_files_and_own_commits_are_kept(course):
    learner, author = course["learner"], course["author"]
    (learner / "notes.md").write_text("my notes\n")  # untracked, nothing upstream by that name
    (learner / "chapters" / "03_new.ipynb").write_text("my own chapter 03\n")  # upstream brings one
    (author / "chapters" / "03_new.ipynb").write_text(notebook("z = 3"))
    git(author, "add", ".")
    git(author, "commit", "--quiet", "-m", "chapter 03")
    new_head = publish(author)

    result = update(learner)

    assert result.returncode == 0, result.stdout + result.stderr
    assert git(learner, "rev-parse", "HEAD") == new_head
    assert (learner / "notes.md").read_text() == "my notes\n"
    (moved,) = (learner / "workspace" / "saved").glob("*/chapters/03_new.ipynb")
    assert moved.read_text() == "my own chapter 03\n"
    # A commit of the learner's own, with nothing new upstream: kept, nothing pulled.
    (learner / "mine.txt").write_text("x\n")
    git(learner, "add", "mine.txt")
    git(learner, "commit", "--quiet", "-m", "mine")
    mine = git(learner, "rev-parse", "HEAD")
    result = update(learner)
    assert result.returncode == 0 and "kept" in result.stdout, result.stdout + result.stderr
    assert git(learner, "rev-parse", "HEAD") == mine


def test_diverged_history_is_refused_and_nothing_changes(course):
    learner, author = course["learner"], course["author"]
    (learner / "README.md").write_text("# my course\n")
    git(learner, "commit", "--quiet", "-am", "mine")
    mine = git(learner, "rev-parse", "HEAD")
    ran = notebook("x = 1", "print(x)", outputs=True)
    (learner / "chapters" / "01_run.ipynb").write_text(ran)
    publish(author)

    result = update(learner)

    assert result.returncode == 1
    assert "diverged" in result.stderr and "git pull --rebase" in result.stderr, result.stderr
    assert git(learner, "rev-parse", "HEAD") == mine
    assert (learner / "chapters" / "01_run.ipynb").read_text() == ran, "a refused update changed a file"
    assert not (learner / "workspace").exists()


def test_not_a_clone_and_no_upstream_are_refused_with_what_to_do(course, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    result = update(plain)
    assert result.returncode == 1 and "not in a git clone" in result.stderr, result.stderr
    learner = course["learner"]
    git(learner, "branch", "--quiet", "--unset-upstream")
    result = update(learner)
    assert result.returncode == 1 and "--set-upstream-to=origin/main" in result.stderr, result.stderr


# ------------------------------------------------ a renamed exercise takes the learner's copy along

def with_exercises(course: dict[str, Path], *names: str) -> None:
    """The course gains exercises/<name> for each name; the learner pulls it (a clean clone: plain git)."""
    author = course["author"]
    (author / "exercises").mkdir(exist_ok=True)
    for name in names:
        (author / "exercises" / name).write_text(notebook(f"# {name}", "raise NotImplementedError"))
    git(author, "add", "exercises")
    git(author, "commit", "--quiet", "-m", "exercises")
    git(author, "push", "--quiet", "origin", "main")
    git(course["learner"], "pull", "--quiet", "--ff-only")


def rename_upstream(author: Path, *moves: tuple[str, str]) -> str:
    """The course renames files (``git mv``), pushed to origin. Returns the new commit."""
    for old, new in moves:
        (author / new).parent.mkdir(parents=True, exist_ok=True)
        git(author, "mv", old, new)
    git(author, "commit", "--quiet", "-m", "renumber")
    git(author, "push", "--quiet", "origin", "main")
    return git(author, "rev-parse", "HEAD")


def test_a_renamed_exercise_renames_the_learners_copy_in_workspace(course):
    learner = course["learner"]
    with_exercises(course, "09_efficient.ipynb", "10_inference.ipynb", "08_kept.ipynb")
    ws = learner / "workspace"
    ws.mkdir()
    work = notebook("### Exercise 9.1 · mine", "def f():\n    return 42  # my answer")
    (ws / "09_efficient.ipynb").write_text(work)
    kept = notebook("my 08")
    (ws / "08_kept.ipynb").write_text(kept)
    new_head = rename_upstream(course["author"], ("exercises/10_inference.ipynb", "exercises/11_inference.ipynb"),
                               ("exercises/09_efficient.ipynb", "exercises/10_efficient.ipynb"))

    result = update(learner)

    output = result.stdout + result.stderr
    assert result.returncode == 0 and git(learner, "rev-parse", "HEAD") == new_head, output
    assert not (ws / "09_efficient.ipynb").exists(), output
    assert (ws / "10_efficient.ipynb").read_text() == work, "the learner's work did not arrive under the new name"
    assert "renamed workspace/09_efficient.ipynb -> workspace/10_efficient.ipynb" in output, output
    assert "11_inference" not in output and not (ws / "11_inference.ipynb").exists(), \
        "the learner had no copy of 10_inference: nothing to rename, nothing to say"
    assert (ws / "08_kept.ipynb").read_text() == kept
    assert sorted(p.name for p in ws.iterdir()) == ["08_kept.ipynb", "10_efficient.ipynb"]


def test_both_names_in_workspace_are_left_alone_with_what_to_do(course):
    learner = course["learner"]
    with_exercises(course, "09_efficient.ipynb")
    ws = learner / "workspace"
    ws.mkdir()
    old, new = notebook("my old work"), notebook("my newer work")
    (ws / "09_efficient.ipynb").write_text(old)
    (ws / "10_efficient.ipynb").write_text(new)  # e.g. `make exercise N=10` after a plain git pull elsewhere
    rename_upstream(course["author"], ("exercises/09_efficient.ipynb", "exercises/10_efficient.ipynb"))

    result = update(learner)

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert (ws / "09_efficient.ipynb").read_text() == old and (ws / "10_efficient.ipynb").read_text() == new
    assert "workspace/09_efficient.ipynb was NOT renamed" in output, output
    assert "Copy what you want to keep from workspace/09_efficient.ipynb into workspace/10_efficient.ipynb" \
        in output, output
    assert sorted(p.name for p in ws.iterdir()) == ["09_efficient.ipynb", "10_efficient.ipynb"]


def test_a_rename_outside_exercises_leaves_workspace_alone(course):
    learner = course["learner"]
    with_exercises(course, "05_other.ipynb")
    ws = learner / "workspace"
    ws.mkdir()
    mine = notebook("my copy of chapter 02")  # named as the chapter, which the course now renames
    (ws / "02_edit.ipynb").write_text(mine)
    new_head = rename_upstream(course["author"], ("chapters/02_edit.ipynb", "chapters/04_edit.ipynb"),
                               ("README.md", "exercises/sub/README.md"))

    result = update(learner)

    output = result.stdout + result.stderr
    assert result.returncode == 0 and git(learner, "rev-parse", "HEAD") == new_head, output
    assert (learner / "chapters" / "04_edit.ipynb").exists(), "the course's own rename was not pulled"
    assert sorted(p.name for p in ws.iterdir()) == ["02_edit.ipynb"], output
    assert (ws / "02_edit.ipynb").read_text() == mine
    assert "renamed workspace/" not in output and "NOT renamed" not in output, output
