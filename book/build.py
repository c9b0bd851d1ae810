"""Build the course's web book: ``make book`` (or ``python book/build.py``).

    python book/build.py                      # -> build/book/index.html
    python book/build.py --out /tmp/book      # elsewhere (the browser test does this)

The book shows the notebooks **as committed**, with their stored outputs: nothing is
executed, so it takes seconds and needs no GPU, and nothing is downloaded.

The chapters, exercises and solutions are found by globbing ``NN_*.ipynb`` in
``chapters/``, ``exercises/`` and ``solutions/``: a new chapter appears in the book, in its
table and in its navigation without any list to update. This script lays out a source tree
for Sphinx (in ``build/book-src/``): book/'s pages, the references page (from
``book/references.py``), plus a copy of each notebook in which a short box under the title
links the chapter, its exercises and its solutions, and offers to run it in JupyterLab or on
Colab; the tooling's marker lines are gone, every figure has alt text and a caption from its
title and is shipped light (``book/figures.py``), the checks' hints show code as code, and cited titles link to the papers. The committed
notebooks are never modified. ``book/conf.py`` configures Sphinx and resolves the repository
URL (REPOSITORY_URL, MHA_REPOSITORY_URL or GitHub Actions' GITHUB_REPOSITORY); while it is the
placeholder, the build warns (``--require-repository``: refuses) and leaves its links out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from figures import caption_figures, lighter_figures, markdown_text, one_line

BOOK = Path(__file__).resolve().parent
ROOT = BOOK.parent
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
COLAB = "https://colab.research.google.com/github"
TABLE_MARKER = "{{ chapter_table }}"
CLONE_MARKER = "{{ clone_url }}"


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
    """The repository URL and branch, as book/conf.py resolves them ("url" is "" while the
    setting is still the placeholder), and JupyterLab's usual address."""
    try:
        conf = runpy.run_path(str(BOOK / "conf.py"))
    except ImportError as error:  # what the book needs is not installed: say so in one line
        raise SystemExit(f"error: {error}") from error
    return {"url": conf["repository_url"], "branch": conf["repository_branch"],
            "configured": conf["repository_configured"], "source": conf["repository_source"],
            "lab": conf["lab_url"]}


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
    # JupyterLab's address depends on the port and token of the learner's `make lab`: the link is
    # for its usual address, and the text says how to reach the notebook from any other.
    lab = repo.get("lab", "http://127.0.0.1:8888")
    run = (f"- **Run it in JupyterLab**: `make lab` in the course folder, then open `{path}` in its file "
           f"browser, or [open it here]({lab}/lab/tree/{path}) while `make lab` runs (on another port, or "
           f"if JupyterLab asks for a token: in the address `make lab` printed, put `{path}` in place of "
           f"`README.md`)")
    colab = colab_url(repo, path)
    if colab:
        run += (f"; or **[open it in Colab]({colab})** and run "
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
        # "## Exercises" (### after chapter 05's "# Part 2"; chapter 12's is "## Your turn")
        heading = re.search(r"^###? (Exercises|Your turn)[^\n]*\n", text, flags=re.MULTILINE)
        if heading:
            line = f"\nIn this book: {' and '.join(pages)}.\n"
            cell["source"] = text[: heading.end()] + line + text[heading.end():]
            return


# ------------------------------------------------------------------ hints: code as code
# The checks' verdicts (text/html) write code between backticks ("use `torch.softmax`"); the
# book shows it as code. Only the text between tags changes (it is HTML already, escaped
# where it needs to be), never inside <pre>, <code>, <script> or <style>.
_LITERAL_TAGS = ("pre", "code", "script", "style", "textarea")


def html_code_spans(markup: str) -> str:
    parts = re.split(r"(<[^>]*>)", markup)
    depth = 0
    for i, part in enumerate(parts):
        tag = re.match(r"<(/?)([A-Za-z][\w-]*)", part) if part.startswith("<") else None
        if tag:
            if tag.group(2).lower() in _LITERAL_TAGS:
                depth = max(0, depth + (-1 if tag.group(1) else 1))
        elif not part.startswith("<") and depth == 0:
            parts[i] = re.sub(r"`([^`\n<>]+)`", r"<code>\1</code>", part)
    return "".join(parts)


def code_in_hints(cells: list[dict]) -> None:
    for cell in cells:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            data = output.get("data", {})
            if "text/html" in data:
                text = "".join(data["text/html"]) if isinstance(data["text/html"], list) else data["text/html"]
                data["text/html"] = html_code_spans(text)


# ---------------------------------------------------------------------------- references
# book/references.py lists the papers the chapters cite; the build writes the references page
# from it and links each cited title ("Attention Is All You Need" (2017)) to the paper.
CITATION = re.compile(r'"([^"\n]+(?:\n[^"\n]+)?)"(?=\s*\(([^()]*?)\b((?:19|20)\d\d)\b[^()]*\)|,\s*((?:19|20)\d\d)\))')
_SKIP_MARKDOWN = re.compile(r"(```.*?```|~~~.*?~~~|`[^`]*`|\$\$.*?\$\$|\$[^$\n]*\$|\[[^\]]*\]\([^)]*\))", re.S)


def papers() -> list[dict[str, str]]:
    return runpy.run_path(str(BOOK / "references.py"))["PAPERS"]


def cited_paper(title: str, year: str, catalogue: list[dict[str, str]]) -> dict[str, str] | None:
    """The paper a quoted title (or its first words) and year cite, if it is in the list."""
    quoted = one_line(title).lower().rstrip(".")
    for paper in catalogue:
        full = paper["title"].lower()
        if paper["year"] == year and (full == quoted or full.startswith(quoted)):
            return paper
    return None


def citations(text: str) -> list[tuple[str, str]]:
    """Every ``"Title" (..., year)`` or ``"Title", year)`` in a chapter's Markdown: (title, year)."""
    return [(m.group(1), m.group(3) or m.group(4)) for m in CITATION.finditer(text)]


def link_citations(cells: list[dict], catalogue: list[dict[str, str]]) -> None:
    """Each cited title in the Markdown cells becomes a link to the paper (outside code, math
    and existing links; titles the list doesn't know stay as they are)."""
    link = runpy.run_path(str(BOOK / "references.py"))["link"]

    def replace(match: re.Match) -> str:
        paper = cited_paper(match.group(1), match.group(3) or match.group(4), catalogue)
        return f'"[{match.group(1)}]({link(paper)})"' if paper else match.group(0)

    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        pieces = _SKIP_MARKDOWN.split("".join(cell["source"]))
        cell["source"] = "".join(p if i % 2 else CITATION.sub(replace, p) for i, p in enumerate(pieces))


def references_page(chapters: list[Chapter], root: Path) -> str:
    """The references page (MyST): every paper in book/references.py, with its link and the
    chapters that cite it."""
    module = runpy.run_path(str(BOOK / "references.py"))
    catalogue, link = module["PAPERS"], module["link"]
    cited_in: dict[str, list[Chapter]] = {}
    for chapter in chapters:
        cells = json.loads((root / "chapters" / f"{chapter.stem}.ipynb").read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for title, year in citations(text):
            paper = cited_paper(title, year, catalogue)
            if paper and chapter not in cited_in.setdefault(paper["key"], []):
                cited_in[paper["key"]].append(chapter)
    lines = ["# References", "",
             "The papers the chapters cite, in the order the course first cites them, each with a link to",
             "where it can be read (arXiv, the DOI or the publisher's page). In the chapters, a cited title",
             "links here to the paper too.", ""]
    order = {c.stem: i for i, c in enumerate(chapters)}
    first = {p["key"]: min((order[c.stem] for c in cited_in.get(p["key"], [])), default=len(order))
             for p in catalogue}
    for paper in sorted(catalogue, key=lambda p: first[p["key"]]):
        ids = []
        if paper.get("arxiv"):
            ids.append(f"arXiv:[{paper['arxiv']}](https://arxiv.org/abs/{paper['arxiv']})")
        if paper.get("doi"):
            ids.append(f"DOI:[{paper['doi']}](https://doi.org/{paper['doi']})")
        where = ", ".join(f"[{c.number}](chapters/{c.stem}.ipynb)" for c in cited_in.get(paper["key"], []))
        entry = (f"{markdown_text(paper['authors'])} ({paper['year']}). "
                 f"**[{markdown_text(paper['title'])}]({link(paper)})**."
                 + (f" {markdown_text(paper['venue'])}." if paper.get("venue") else "")
                 + (f" {', '.join(ids)}." if ids else "")
                 + (f" Cited in chapter{'s' if ',' in where else ''} {where}." if where else ""))
        lines += [f"({paper['key']})=", entry, ""]
    return "\n".join(lines)


def staged_notebook(source: Path, kind: str, chapter: Chapter, repo: dict,
                    catalogue: list[dict[str, str]] | None = None) -> str:
    """The notebook's JSON with the banner under its title (and, for a chapter, its
    exercises and solutions as sub-pages), its figures captioned, its hints' code as code and
    its cited titles linked; the outputs' content is untouched."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    one_title(nb["cells"])
    strip_tooling(nb["cells"])
    code_in_hints(nb["cells"])
    where = {"chapters": "chapter", "exercises": "exercises", "solutions": "solutions"}[kind]
    nb["cells"] = caption_figures(nb["cells"], f"{where} {chapter.number}")
    lighter_figures(nb["cells"], cache=ROOT / "build" / "book-figures")
    link_citations(nb["cells"], papers() if catalogue is None else catalogue)
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
    toc += ["```", "", "```{toctree}", ":hidden:", ":caption: More", "", "References <references>", "```"]
    return "\n".join(lines + toc + [""])


def write_if_changed(path: Path, text: str) -> None:
    """Unchanged files keep their time stamp, so that Sphinx rebuilds only what changed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def stage(src: Path, root: Path = ROOT, repo: dict | None = None) -> list[Chapter]:
    """Lay out Sphinx's source tree in ``src``; returns the chapters found."""
    repo = settings() if repo is None else repo
    chapters = find_chapters(root)
    catalogue = papers()
    wanted: set[Path] = set()
    target = src / "references.md"
    write_if_changed(target, references_page(chapters, root))
    wanted.add(target)
    for page in BOOK.rglob("*"):
        # book/'s pages, templates and static files, and conf.py (not build.py, references.py)
        if page.is_file() and (page.suffix != ".py" or page.name == "conf.py") and "__pycache__" not in page.parts:
            target = src / page.relative_to(BOOK)
            text = page.read_text(encoding="utf-8")
            if page.name == "index.md":
                text = text.replace(TABLE_MARKER, chapter_table(chapters))
                text = text.replace(CLONE_MARKER, f"{repo['url']}.git" if repo["url"] else "<the-course-repository-url>")
            write_if_changed(target, text)
            wanted.add(target)
    by_stem = {c.stem: c for c in chapters}
    for kind in ("chapters", "exercises", "solutions"):
        for source in sorted((root / kind).glob(NOTEBOOK_GLOB)):
            chapter = by_stem.get(source.stem)
            if chapter is None:
                raise SystemExit(f"error: {kind}/{source.name} has no chapter chapters/{source.name}")
            target = src / kind / source.name
            write_if_changed(target, staged_notebook(source, kind, chapter, repo, catalogue))
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
    prune_images(out)


def prune_images(out: Path) -> list[str]:
    """Delete the images no page shows any more (Sphinx adds a rebuilt page's new figures to
    ``_images/`` and never removes the old ones); returns their names."""
    images = out / "_images"
    if not images.is_dir():
        return []
    shown: set[str] = set()
    for page in out.rglob("*.html"):
        shown.update(re.findall(r"_images/([^\"'?#)\s]+)", page.read_text(encoding="utf-8")))
    stale = sorted(f.name for f in images.iterdir() if f.is_file() and f.name not in shown)
    for name in stale:
        (images / name).unlink()
    return stale


PLACEHOLDER_MESSAGE = """
************************************************************************************************
{verdict}: the course's repository URL is not set.
  book/conf.py's REPOSITORY_URL is still the placeholder https://github.com/OWNER/REPO, and neither
  MHA_REPOSITORY_URL nor GITHUB_REPOSITORY (GitHub Actions) is set. Without it the book has no
  "open in Colab" links, no pip line for Colab, no repository button and no notebook downloads.
  Set REPOSITORY_URL in book/conf.py once, or build with
      MHA_REPOSITORY_URL=https://github.com/<owner>/<repo> make book
************************************************************************************************
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="where the HTML goes")
    parser.add_argument("--src", type=Path, help="where the Sphinx sources are laid out (default: OUT-src)")
    parser.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    parser.add_argument("--require-repository", action="store_true",
                        help="refuse to build while the repository URL is the placeholder "
                             "(also MHA_REQUIRE_REPOSITORY=1; the Pages workflow uses it)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    src = (args.src or out.with_name(out.name + "-src")).resolve()
    start = time.perf_counter()
    repo = settings()
    if not repo["configured"]:
        strict = args.require_repository or os.environ.get("MHA_REQUIRE_REPOSITORY", "") not in ("", "0")
        print(PLACEHOLDER_MESSAGE.format(verdict="error: refusing to build the book" if strict else
                                         "WARNING: building the book without its repository links"),
              file=sys.stderr)
        if strict:
            return 2
    chapters = stage(src, repo=repo)
    build(out, src, quiet=not args.verbose)
    index = out / "index.html"
    print(f"Built the book ({len(chapters)} chapters) in {time.perf_counter() - start:.1f} s: {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
