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
- ``workspace/`` itself is never touched (git ignores it; the saved copies are only added).

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
    result = git("merge", "--ff-only", "--quiet", upstream, cwd=root, check=False)
    if result.returncode != 0:
        saved = f" Your edits are saved in {folder}/." if plan.save or plan.move else ""
        raise UpdateError(f"`git pull --ff-only` failed:\n{result.stderr.strip()}\n{saved}")
    head = git("rev-parse", "--short", "HEAD", cwd=root).stdout.strip()
    say(f"Updated the course to {head} ({behind} new commit(s)).")
    if plan.save or plan.save_staged or plan.move:
        say(f"Your own versions are in {folder.as_posix()}/ (git never changes workspace/).")
    return 0
