"""Build the course's web book: ``make book`` (or ``python book/build.py``).

    python book/build.py                      # -> build/book/index.html
    python book/build.py --out /tmp/book      # elsewhere (the browser test does this)

The book shows the notebooks **as committed**, with their stored outputs: nothing is
executed, so it takes seconds and needs no GPU, and nothing is downloaded.

The chapters, exercises and solutions are found by globbing ``NN_*.ipynb`` in
``chapters/``, ``exercises/`` and ``solutions/``: a new chapter appears in the book, in its
table and in its navigation without any list to update. This script lays out a source tree
for Sphinx (in ``build/book-src/``): book/'s pages, plus a copy of each notebook in which
a short box under the title links the chapter, its exercises and its solutions, and offers
to run it in JupyterLab or on Colab. The committed notebooks are never modified.
``book/conf.py`` configures Sphinx and holds the repository URL the Colab links use.
"""

from __future__ import annotations

import argparse
import json
import re
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
COLAB = "https://colab.research.google.com/github"
LAB_URL = "http://127.0.0.1:8888/lab/tree"  # `make lab`'s address (HOST and PORT defaults)
TABLE_MARKER = "{{ chapter_table }}"


@dataclass(frozen=True)
class Chapter:
    number: str  # "01"
    stem: str  # "01_dot_product_attention"
    title: str  # "Attention from one dot product"
    summary: str  # the README's "you learn to", or ""
    has_exercises: bool
    has_solutions: bool


def notebook_title(path: Path) -> str:
    """The text of the notebook's first ``# `` heading, without "Chapter NN · "."""
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return re.sub(r"^(Chapter|Exercises|Solutions)\b.*?·\s*(Chapter \d+\s*·\s*)?", "",
                                  line[2:].strip()).strip()
    return path.stem[3:].replace("_", " ").capitalize()


def readme_summaries(root: Path) -> dict[str, str]:
    """``{stem: "you learn to ..."}`` from the README's chapter table, where it has a row."""
    readme = root / "README.md"
    rows = {}
    if readme.exists():
        for match in re.finditer(r"^\|\s*\d+\s*\|\s*\[`chapters/([^`]+)`\]\([^)]*\)\s*\|\s*(.+?)\s*\|\s*$",
                                 readme.read_text(encoding="utf-8"), re.M):
            rows[match.group(1).removesuffix(".ipynb")] = match.group(2)
    return rows


def find_chapters(root: Path = ROOT) -> list[Chapter]:
    summaries = readme_summaries(root)
    return [
        Chapter(
            number=path.name[:2], stem=path.stem, title=notebook_title(path),
            summary=summaries.get(path.stem, ""),
            has_exercises=(root / "exercises" / path.name).exists(),
            has_solutions=(root / "solutions" / path.name).exists(),
        )
        for path in sorted((root / "chapters").glob(NOTEBOOK_GLOB))
    ]


def settings() -> dict:
    """The repository URL and branch, as book/conf.py resolves them."""
    conf = runpy.run_path(str(BOOK / "conf.py"))
    return {"url": conf["repository_url"], "branch": conf["repository_branch"]}


def colab_url(repo: dict, path: str) -> str | None:
    """Colab opens notebooks straight from GitHub: https://colab.research.google.com/github/OWNER/REPO/blob/BRANCH/PATH."""
    match = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(\.git)?", repo["url"])
    return f"{COLAB}/{match.group(1)}/blob/{repo['branch']}/{path}" if match else None


def banner(kind: str, chapter: Chapter, repo: dict) -> str:
    """The box under a page's title: where its companions are and how to run it."""
    path = f"{kind}/{chapter.stem}.ipynb"
    links = []
    if kind != "chapters":
        links.append(f"[Chapter {chapter.number}](../chapters/{chapter.stem}.ipynb)")
    if kind != "exercises" and chapter.has_exercises:
        links.append(f"[Exercises {chapter.number}](../exercises/{chapter.stem}.ipynb)")
    if kind != "solutions" and chapter.has_solutions:
        links.append(f"[Solutions {chapter.number}](../solutions/{chapter.stem}.ipynb)")
    lines = [":::{container} mha-launch", ""]
    if links:
        lines.append(f"- **{'This chapter' if kind == 'chapters' else 'See also'}**: " + " · ".join(links))
    if kind == "exercises":
        lines.append(f"- **Do them in your own copy**: `make exercise N={chapter.number}` copies this notebook to "
                     f"`workspace/`, which `git pull` never touches; `make progress` shows how far you are.")
    run = (f"- **Run it in JupyterLab**: `make lab` in the course folder, then open `{path}` "
           f"([open it]({LAB_URL}/{path}) while `make lab` runs)")
    colab = colab_url(repo, path)
    if colab:
        run += (f", or **[open it in Colab]({colab})** and run "
                f"`!pip install -q --no-deps \"git+{repo['url']}\"` in a first cell")
    lines += [run + ".", "", ":::", ""]
    return "\n".join(lines)


def one_title(cells: list[dict]) -> None:
    """A page has one title: from a second ``# `` heading on (chapter 05's "# Part 2"),
    every heading moves one level down, so that Part 2 becomes a section of the chapter
    instead of a second page title (which would break its entry in the navigation)."""
    titles, fence = 0, False
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        lines = "".join(cell["source"]).split("\n")
        for i, line in enumerate(lines):
            if line.lstrip().startswith(("```", "~~~")):
                fence = not fence
            elif not fence and re.match(r"#{1,5} ", line):
                titles += line.startswith("# ")
                if titles > 1:
                    lines[i] = "#" + line
        cell["source"] = "\n".join(lines)


# Lines the course's tooling reads and a reader of the book doesn't need: nbval's markers, and
# the solution markers that tools/make_exercises.py cuts the exercises along.
TOOLING = re.compile(r"^\s*# (NBVAL_IGNORE_OUTPUT|NBVAL_SKIP|NBVAL_CHECK_OUTPUT|BEGIN SOLUTION|END SOLUTION)\s*$")


def strip_tooling(cells: list[dict]) -> None:
    """Remove the tooling marker lines from the code cells (the committed notebooks keep them)."""
    for cell in cells:
        if cell["cell_type"] == "code":
            lines = "".join(cell["source"]).split("\n")
            cell["source"] = "\n".join(line for line in lines if not TOOLING.match(line))


def link_exercises(cells: list[dict], chapter: Chapter) -> None:
    """Under a chapter's exercises heading, a line that links its exercise and solution pages."""
    pages = [f"[{name}](../{folder}/{chapter.stem}.ipynb)" for folder, name, present in (
        ("exercises", "the exercises", chapter.has_exercises), ("solutions", "their worked solutions",
                                                                  chapter.has_solutions)) if present]
    if not pages:
        return
    for cell in cells:
        text = "".join(cell["source"]) if cell["cell_type"] == "markdown" else ""
        # "## Exercises" (### after chapter 05's "# Part 2"; chapter 11's is "## Your turn")
        heading = re.search(r"^###? (Exercises|Your turn)[^\n]*\n", text, flags=re.MULTILINE)
        if heading:
            line = f"\nIn this book: {' and '.join(pages)}.\n"
            cell["source"] = text[: heading.end()] + line + text[heading.end():]
            return


def staged_notebook(source: Path, kind: str, chapter: Chapter, repo: dict) -> str:
    """The notebook's JSON with the banner under its title (and, for a chapter, its
    exercises and solutions as sub-pages); outputs and everything else untouched."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    one_title(nb["cells"])
    strip_tooling(nb["cells"])
    if kind == "chapters":
        link_exercises(nb["cells"], chapter)
    box = banner(kind, chapter, repo)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            title, sep, rest = text.partition("\n")
            text = f"{title}\n\n{box}\n{rest.lstrip(chr(10))}" if title.startswith("# ") else f"{box}\n{text}"
            cell["source"] = text
            break
    if kind == "chapters":
        entries = [f"{name} <../{folder}/{chapter.stem}>" for folder, name, present in (
            ("exercises", "Exercises", chapter.has_exercises), ("solutions", "Solutions", chapter.has_solutions))
            if present]
        if entries:
            nb["cells"].append({"cell_type": "markdown", "id": "book-toctree", "metadata": {}, "source":
                                "```{toctree}\n:hidden:\n\n" + "\n".join(entries) + "\n```\n"})
    return json.dumps(nb, ensure_ascii=False, indent=1)


def chapter_table(chapters: list[Chapter]) -> str:
    lines = [":::{table}", ":class: mha-chapters", ":widths: auto", "",
             "| # | chapter | you learn to | exercises | solutions |", "|---|---|---|---|---|"]
    for c in chapters:
        ex = f"[{c.number}](exercises/{c.stem}.ipynb)" if c.has_exercises else ""
        so = f"[{c.number}](solutions/{c.stem}.ipynb)" if c.has_solutions else ""
        lines.append(f"| {c.number} | [{c.title}](chapters/{c.stem}.ipynb) | {c.summary} | {ex} | {so} |")
    toc = [":::", "", "```{toctree}", ":hidden:", ":caption: Chapters", ""]
    toc += [f"{c.number} · {c.title} <chapters/{c.stem}>" for c in chapters]
    return "\n".join(lines + toc + ["```", ""])


def write_if_changed(path: Path, text: str) -> None:
    """Unchanged files keep their time stamp, so that Sphinx rebuilds only what changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def stage(src: Path, root: Path = ROOT) -> list[Chapter]:
    """Lay out Sphinx's source tree in ``src``; returns the chapters found."""
    repo = settings()
    chapters = find_chapters(root)
    wanted: set[Path] = set()
    for page in BOOK.rglob("*"):
        if page.is_file() and page.name != "build.py" and "__pycache__" not in page.parts:
            target = src / page.relative_to(BOOK)
            text = page.read_text(encoding="utf-8")
            if page.name == "index.md":
                text = text.replace(TABLE_MARKER, chapter_table(chapters))
            write_if_changed(target, text)
            wanted.add(target)
    by_stem = {c.stem: c for c in chapters}
    for kind in ("chapters", "exercises", "solutions"):
        for source in sorted((root / kind).glob(NOTEBOOK_GLOB)):
            chapter = by_stem.get(source.stem)
            if chapter is None:
                raise SystemExit(f"error: {kind}/{source.name} has no chapter chapters/{source.name}")
            target = src / kind / source.name
            write_if_changed(target, staged_notebook(source, kind, chapter, repo))
            wanted.add(target)
    for old in [p for p in src.rglob("*") if p.is_file() and p not in wanted]:
        old.unlink()  # a notebook that was renamed or removed leaves no page behind
    return chapters


def build(out: Path, src: Path, quiet: bool = True) -> None:
    from sphinx.cmd.build import build_main

    args = ["-b", "html", "-W", "--keep-going", "-d", str(out.with_name(out.name + "-doctrees")), str(src), str(out)]
    code = build_main((["-q"] if quiet else []) + args)
    if code:
        raise SystemExit(f"error: Sphinx failed (exit code {code}); its messages are above")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="where the HTML goes")
    parser.add_argument("--src", type=Path, help="where the Sphinx sources are laid out (default: OUT-src)")
    parser.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    src = (args.src or out.with_name(out.name + "-src")).resolve()
    start = time.perf_counter()
    chapters = stage(src)
    build(out, src, quiet=not args.verbose)
    index = out / "index.html"
    print(f"Built the book ({len(chapters)} chapters) in {time.perf_counter() - start:.1f} s: {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
