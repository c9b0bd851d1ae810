"""``python -m mha_course update`` (``make update``): bring the course up to date, whatever you ran.

JupyterLab saves a notebook after you run it (execution counts, outputs), and with jupytext
its paired ``.py`` too, so a plain ``git pull`` stops: "your local changes would be
overwritten". This command first puts the course's own files back as committed, then
fast-forwards to the course's newest version (``git pull --ff-only``), never losing work:

- a course notebook changed **only by running** (the same cells and cell sources as
  committed; only outputs, execution counts or metadata differ) is put back and then
  replaced by the new version;
- **your own edits** to a course file (a notebook whose cells differ, any other changed file,
  something you staged) are copied to ``workspace/saved/<date>/<its path>`` first;
- an untracked file where the new version brings a file of the same name is moved there too
  (other untracked files stay where they are);
- ``workspace/`` itself is never touched (git ignores it; the saved copies are only added),
  with one exception: when the new version renames an exercise notebook (git sees
  ``exercises/09_x.ipynb`` become ``exercises/10_x.ipynb``), your copy ``workspace/09_x.ipynb``
  is renamed with it, its content unchanged, unless ``workspace/10_x.ipynb`` exists too: then
  nothing is renamed and it says what to do.

It stops, with what to do and having changed nothing, when this is not a git clone, when the
branch follows no upstream, when a merge or rebase is under way, when the fetch fails, and when
your branch has commits of its own and the course moved on too (diverged history). Your
own commits are kept: with nothing new upstream, nothing is pulled.

Only git and the standard library: no PyTorch, no nbformat (a notebook is JSON).
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SAVED = Path("workspace") / "saved"


class UpdateError(Exception):
    """The update cannot go on; the message says why and what to do. Nothing was changed."""


def git(*args: str, cwd: Path, check: bool = True, text: bool = True) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=text)
    except FileNotFoundError:
        raise UpdateError("git is not installed; `make update` needs it (and so does `git pull`).") from None
    if check and result.returncode != 0:
        err = result.stderr if text else result.stderr.decode(errors="replace")
        raise UpdateError(f"`git {' '.join(args)}` failed:\n{err.strip()}")
    return result


def repository_root(cwd: Path) -> Path:
    result = git("rev-parse", "--show-toplevel", cwd=cwd, check=False)
    if result.returncode != 0:
        raise UpdateError(f"{cwd} is not in a git clone of the course, so there is nothing to update from.\n"
                          "Get the course with `git clone <the course's repository>` to be able to update it.")
    return Path(result.stdout.strip())


def cell_sources(data: bytes) -> list[tuple[str, str]] | None:
    """The cells of a notebook as (type, source), or None when it is not a notebook's JSON."""
    try:
        cells = json.loads(data.decode("utf-8"))["cells"]
        return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
                for c in cells]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def only_run(committed: bytes, current: bytes) -> bool:
    """True when ``current`` is the committed notebook, run: the same cells with the same sources."""
    before = cell_sources(committed)
    return before is not None and before == cell_sources(current)


@dataclass
class Plan:
    restore: list[str] = field(default_factory=list)  # tracked paths to put back as in HEAD
    run_only: list[str] = field(default_factory=list)  # notebooks changed only by running
    save: list[str] = field(default_factory=list)  # tracked paths whose working copy holds edits
    save_staged: list[str] = field(default_factory=list)  # paths whose staged version holds edits
    move: list[str] = field(default_factory=list)  # untracked paths the new version brings


def status_entries(root: Path) -> list[tuple[str, str]]:
    """``git status`` as (XY, path) pairs (renames: the new path, and the old one as deleted)."""
    out = git("status", "--porcelain=v1", "-z", "--untracked-files=all", cwd=root).stdout
    fields = out.split("\0")
    entries, i = [], 0
    while i < len(fields) and fields[i]:
        code, path = fields[i][:2], fields[i][3:]
        entries.append((code, path))
        if "R" in code or "C" in code:  # the source path follows
            i += 1
            if "R" in code:
                entries.append((" D", fields[i]))
        i += 1
    return entries


def blob(root: Path, spec: str) -> bytes | None:
    result = git("cat-file", "blob", spec, cwd=root, check=False, text=False)
    return result.stdout if result.returncode == 0 else None


def make_plan(root: Path, upstream: str) -> Plan:
    plan = Plan()
    for code, path in status_entries(root):
        if code == "??":
            if path.startswith("workspace/"):
                continue
            if blob(root, f"{upstream}:{path}") is not None:
                plan.move.append(path)
            continue
        if "U" in code or code in ("AA", "DD"):
            raise UpdateError(f"{path} has an unresolved merge conflict. Resolve it (or run `git merge --abort`), "
                              "then run `make update` again. Nothing was changed.")
        committed = blob(root, f"HEAD:{path}")
        file = root / path
        current = file.read_bytes() if file.is_file() else None
        staged = blob(root, f":{path}")
        plan.restore.append(path)
        if staged is not None and staged not in (committed, current):
            plan.save_staged.append(path)
        if current is None or current == committed:
            continue  # deleted, or only its staged state differs: putting it back loses nothing
        if committed is not None and path.endswith(".ipynb") and only_run(committed, current):
            plan.run_only.append(path)
        else:
            plan.save.append(path)
    return plan


def _free_name(target: Path) -> Path:
    n = 2
    candidate = target
    while candidate.exists():
        candidate = target.with_name(f"{target.stem} ({n}){target.suffix}")
        n += 1
    return candidate


def _save(root: Path, folder: Path, path: str, data: bytes) -> Path:
    target = root / folder / path
    if target.is_file() and target.read_bytes() == data:
        return target
    target = _free_name(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def exercise_renames(root: Path, old: str, new: str) -> list[tuple[str, str]]:
    """The exercise notebooks (``exercises/*.ipynb``) that git sees renamed from ``old`` to ``new``,
    as (old name, new name) pairs: what ``git diff --name-status -M`` reports as R entries."""
    diff = git("diff", "--no-color", "--name-status", "-z", "-M", old, new, "--", "exercises/", cwd=root, check=False)
    fields = diff.stdout.split("\0") if diff.returncode == 0 else []  # the update is done: renaming is a bonus
    renames, i = [], 0
    while i < len(fields) and fields[i]:
        code = fields[i]
        if code[:1] in ("R", "C"):  # two paths follow
            a, b = Path(fields[i + 1]), Path(fields[i + 2])
            if code[0] == "R" and a.parent == b.parent == Path("exercises") and a.suffix == b.suffix == ".ipynb":
                renames.append((a.name, b.name))
            i += 3
        else:
            i += 2
    return renames


def follow_renames(root: Path, renames: list[tuple[str, str]], say=print) -> None:
    """Rename ``workspace/<old>`` to ``workspace/<new>`` for each renamed exercise, never overwriting:
    when both exist, nothing is renamed and ``say`` tells what to do. (In one diff a new name is
    never also an old one, so the order does not matter.)"""
    workspace = root / "workspace"
    for a, b in renames:
        source, target = workspace / a, workspace / b
        if not source.is_file() or (root / "exercises" / a).exists():  # no copy, or still an exercise's name
            continue
        if target.exists() or target.is_symlink():
            say(f"  workspace/{a} was NOT renamed: the course renamed exercises/{a} to exercises/{b}, and you "
                f"already have workspace/{b}, which is the copy `make progress` checks now. Copy what you want "
                f"to keep from workspace/{a} into workspace/{b}, then move workspace/{a} out of workspace/ "
                f"(e.g. into workspace/saved/).")
            continue
        source.rename(target)
        say(f"  renamed workspace/{a} -> workspace/{b}: the course renamed exercises/{a} to exercises/{b} "
            "(your work in it is unchanged; `make progress` finds it under its new name)")


def in_progress(root: Path) -> str | None:
    git_dir = Path(git("rev-parse", "--absolute-git-dir", cwd=root).stdout.strip())
    for name, what in (("MERGE_HEAD", "a merge"), ("rebase-merge", "a rebase"), ("rebase-apply", "a rebase"),
                       ("CHERRY_PICK_HEAD", "a cherry-pick"), ("REVERT_HEAD", "a revert")):
        if (git_dir / name).exists():
            return what
    return None


def update(cwd: Path | None = None, today: str | None = None, say=print) -> int:
    """Update the clone that holds ``cwd``; returns the exit status (0 up to date, 1 stopped)."""
    root = repository_root(Path.cwd() if cwd is None else cwd)
    branch = git("symbolic-ref", "--quiet", "--short", "HEAD", cwd=root, check=False)
    if branch.returncode != 0:
        raise UpdateError("HEAD is detached (not on a branch), so there is no branch to update. "
                          "Go back to the course's branch, e.g. `git switch main`, then run `make update`.")
    branch = branch.stdout.strip()
    upstream = git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}", cwd=root, check=False)
    if upstream.returncode != 0:
        raise UpdateError(f"your branch {branch!r} follows no upstream branch, so there is nothing to pull from. "
                          f"Set it once with `git branch --set-upstream-to=origin/{branch}`, then run `make update`.")
    upstream = upstream.stdout.strip()
    if (what := in_progress(root)) is not None:
        raise UpdateError(f"{what} is under way in {root}. Finish or abort it first, then run `make update`. "
                          "Nothing was changed.")
    remote = git("config", f"branch.{branch}.remote", cwd=root, check=False).stdout.strip() or "origin"
    say(f"Fetching the course's newest version ({upstream}) ...")
    fetched = git("fetch", "--quiet", remote, cwd=root, check=False)
    if fetched.returncode != 0:
        raise UpdateError(f"`git fetch {remote}` failed (no network?), nothing was changed:\n{fetched.stderr.strip()}")
    ahead, behind = (int(n) for n in git("rev-list", "--left-right", "--count", f"HEAD...{upstream}",
                                           cwd=root).stdout.split())
    if ahead and behind:
        raise UpdateError(
            f"your branch {branch!r} has {ahead} commit(s) of your own, and the course has {behind} new one(s): "
            "the histories have diverged, so the course cannot simply move forward. Nothing was changed.\n"
            f"To replay your commits on the new version: `git pull --rebase` (or `git rebase {upstream}`); "
            f"to keep them on a branch of their own: `git branch my-work`, then `git reset --keep {upstream}`.")

    plan = make_plan(root, upstream)
    folder = SAVED / (today or _dt.date.today().isoformat())
    for path in plan.save:
        target = _save(root, folder, path, (root / path).read_bytes())
        say(f"  your edits to {path} are saved in {target.relative_to(root)}")
    for path in plan.save_staged:
        target = _save(root, folder / "staged", path, blob(root, f":{path}"))
        say(f"  what you staged of {path} is saved in {target.relative_to(root)}")
    for path in plan.move:
        target = _free_name(root / folder / path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(root / path, target)
        say(f"  {path} (not part of your clone, but the new version brings one) is moved to "
            f"{target.relative_to(root)}")
    if plan.restore:
        in_head = [p for p in plan.restore if blob(root, f"HEAD:{p}") is not None]
        added = [p for p in plan.restore if p not in in_head]
        if in_head:
            git("checkout", "HEAD", "--", *in_head, cwd=root)
        if added:  # staged new files: unstage them (their content stays where it is)
            git("rm", "--cached", "--quiet", "--", *added, cwd=root)
        for path in plan.run_only:
            say(f"  {path}: changed only by running it; its outputs are replaced by the new version")

    if not behind:
        note = f" (and your {ahead} commit(s) are kept)" if ahead else ""
        say(f"The course is up to date{note}.")
        return 0
    before = git("rev-parse", "HEAD", cwd=root).stdout.strip()
    result = git("merge", "--ff-only", "--quiet", upstream, cwd=root, check=False)
    if result.returncode != 0:
        saved = f" Your edits are saved in {folder}/." if plan.save or plan.move else ""
        raise UpdateError(f"`git pull --ff-only` failed:\n{result.stderr.strip()}\n{saved}")
    head = git("rev-parse", "--short", "HEAD", cwd=root).stdout.strip()
    say(f"Updated the course to {head} ({behind} new commit(s)).")
    follow_renames(root, exercise_renames(root, before, "HEAD"), say)
    if plan.save or plan.save_staged or plan.move:
        say(f"Your own versions are in {folder.as_posix()}/ (git never changes workspace/).")
    return 0
