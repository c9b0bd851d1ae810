"""The web book (``make book``): built offline, complete, linked, and right in a real browser.

The book is built once for this module, into a temporary folder, by ``book/build.py`` in a
subprocess whose network is blocked (a ``sitecustomize`` makes every internet connection
fail and records it). Then:

- without a browser: every notebook has a page, the landing page lists every chapter,
  each chapter links its exercises and solutions and offers JupyterLab and Colab (built
  from the one configured repository URL), every internal link and anchor resolves, no
  asset comes from the internet, and a new chapter needs no list to be updated;
- in headless Chromium (tests/browser_support.py): every page loads with no console error
  and no failed request, every image is drawn, every formula is typeset by MathJax (no raw
  ``$...$`` or ``\\(`` left in the text), search finds the chapters; screenshots of the
  landing page and of chapter 01 go to ``artifacts/book/``.
"""

from __future__ import annotations

import functools
import html
import html.parser
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import VIEWPORT, launch, sync_playwright  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "book"))
import build as book_build  # noqa: E402 - book/build.py

ARTIFACTS = ROOT / "artifacts" / "book"
REPOSITORY = "https://github.com/example-org/mha-course"  # what the test configures
KINDS = ("chapters", "exercises", "solutions")
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"

# Loaded first by the build's Python: any internet connection is recorded, then refused.
BLOCK_NETWORK = '''
import os, socket
_connect = socket.socket.connect
def _refuse(self, address, *args):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        with open(os.environ["MHA_NETWORK_LOG"], "a") as log:
            log.write(repr(address) + "\\n")
        raise OSError(f"network access during the book build: {address!r}")
    return _connect(self, address, *args)
socket.socket.connect = _refuse
def _no_lookup(host, *args, **kwargs):
    if host not in ("localhost", "127.0.0.1", "::1", None):
        with open(os.environ["MHA_NETWORK_LOG"], "a") as log:
            log.write("lookup " + repr(host) + "\\n")
        raise OSError(f"name lookup during the book build: {host!r}")
    return _getaddrinfo(host, *args, **kwargs)
_getaddrinfo = socket.getaddrinfo
socket.getaddrinfo = _no_lookup
'''


def stored_figures(notebook: Path) -> int:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))


def notebooks(kind: str) -> list[Path]:
    return sorted((ROOT / kind).glob(NOTEBOOK_GLOB))


@pytest.fixture(scope="module")
def book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built book (its folder); the build's output and time are in ``book.log``."""
    base = tmp_path_factory.mktemp("book")
    (base / "offline").mkdir()
    (base / "offline" / "sitecustomize.py").write_text(BLOCK_NETWORK)
    network_log = base / "network.log"
    network_log.touch()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(base / "offline"), os.environ.get("PYTHONPATH", "")]),
               MHA_NETWORK_LOG=str(network_log), MHA_REPOSITORY_URL=REPOSITORY, MHA_REPOSITORY_BRANCH="main")
    out = base / "book"
    start = time.perf_counter()
    result = subprocess.run([sys.executable, str(ROOT / "book" / "build.py"), "--out", str(out)],
                            cwd=base, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, f"the book did not build:\n{result.stdout}\n{result.stderr}"
    (base / "build.log").write_text(f"{seconds:.1f} s\n{result.stdout}\n{result.stderr}")
    return out


class _Links(html.parser.HTMLParser):
    """Every URL a page refers to, with its tag and attribute, and every id it defines."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str, dict]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        for key in ("id", "name"):
            if attributes.get(key):
                self.ids.add(attributes[key])
        for key in ("href", "src"):
            if attributes.get(key) is not None and key in attributes:
                self.urls.append((tag, key, attributes[key], attributes))


@functools.cache
def parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


def text_of(page: Path) -> str:
    """The page's text, tags removed (code is split into one <span> a word)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))).split())


def pages(book: Path) -> list[Path]:
    return sorted(p for p in book.rglob("*.html") if "_static" not in p.parts)


# ------------------------------------------------------------------- without a browser

def test_the_build_is_offline_and_quick(book: Path) -> None:
    log = (book.parent / "network.log").read_text()
    assert not log, f"the book's build tried to reach the network:\n{log}"
    seconds = float((book.parent / "build.log").read_text().split()[0])
    # Seconds, not minutes: nothing is executed. Generous for a loaded 2-core machine.
    assert seconds < 120, f"the book took {seconds:.0f} s to build"


def test_every_notebook_has_a_page_and_the_landing_page_lists_every_chapter(book: Path) -> None:
    for kind in KINDS:
        for notebook in notebooks(kind):
            assert (book / kind / f"{notebook.stem}.html").is_file(), f"no page for {kind}/{notebook.name}"
    index = parse(book / "index.html")
    hrefs = {url for tag, _, url, _ in index.urls if tag == "a"}
    for kind in KINDS:
        for notebook in notebooks(kind):
            assert f"{kind}/{notebook.stem}.html" in hrefs, f"the landing page doesn't link {kind}/{notebook.name}"
    text = text_of(book / "index.html")
    assert "make lab" in text and "make exercise N=01" in text and "make progress" in text, "no 'how to start'"
    rows = re.findall(r'<tr class="row-(?:odd|even)"><td><p>(\d\d)</p></td>', (book / "index.html").read_text())
    assert rows == [p.name[:2] for p in notebooks("chapters")], f"the chapter table's rows: {rows}"


@pytest.mark.parametrize("kind", KINDS)
def test_each_page_links_its_companions_and_where_to_run_it(book: Path, kind: str) -> None:
    for notebook in notebooks(kind):
        page = book / kind / f"{notebook.stem}.html"
        hrefs = [url for tag, _, url, _ in parse(page).urls if tag == "a"]
        path = f"{kind}/{notebook.name}"
        colab = f"https://colab.research.google.com/github/example-org/mha-course/blob/main/{path}"
        lab = f"http://127.0.0.1:8888/lab/tree/{path}"
        assert colab in hrefs, f"{page.name}: no 'open in Colab' link to {colab}"
        assert lab in hrefs, f"{page.name}: no 'open in JupyterLab' link to {lab}"
        text = text_of(page)
        assert f"git+{REPOSITORY}" in text, f"{page.name}: no pip line for Colab built from the repository URL"
        assert f"make lab in the course folder, then open {path}" in text, f"{page.name}: no `make lab` hint"
        for other in KINDS:
            if other != kind and (ROOT / other / notebook.name).exists():
                assert f"../{other}/{notebook.stem}.html" in hrefs, f"{path} doesn't link {other}/{notebook.name}"
        if kind == "exercises":
            assert f"make exercise N={notebook.name[:2]}" in text, f"{path}: no `make exercise` line"


def test_reading_order_and_navigation(book: Path) -> None:
    """index → chapter 01 → its exercises → its solutions → chapter 02 ... (prev/next links)."""
    order = ["index.html"]
    for chapter in notebooks("chapters"):
        order += [f"{kind}/{chapter.stem}.html" for kind in KINDS if (ROOT / kind / chapter.name).exists()]
    for here, following in zip(order, order[1:]):
        page = book / here
        nexts = [url for tag, _, url, attrs in parse(page).urls
                 if tag == "a" and "right-next" in attrs.get("class", "")]
        target = (page.parent / nexts[0]).resolve() if nexts else None
        assert target == (book / following).resolve(), f"{here}: 'next' leads to {nexts}, expected {following}"
    sidebar = [url for tag, _, url, attrs in parse(book / "index.html").urls
               if tag == "a" and "reference internal" in attrs.get("class", "")]
    for chapter in notebooks("chapters"):
        assert f"chapters/{chapter.stem}.html" in sidebar


def test_every_internal_link_and_anchor_resolves(book: Path) -> None:
    broken = []
    for page in pages(book):
        for tag, attribute, url, _ in parse(page).urls:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme or url.startswith("//") or not (parts.path or parts.fragment):
                continue  # external (checked below: never an asset), or "#"
            target = (page.parent / urllib.parse.unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(book)}: <{tag} {attribute}={url!r}>: no such file")
            elif parts.fragment and target.suffix == ".html" and parts.fragment not in parse(target).ids:
                broken.append(f"{page.relative_to(book)}: <{tag} {attribute}={url!r}>: no anchor #{parts.fragment}")
    assert not broken, f"{len(broken)} broken internal links, e.g.:\n" + "\n".join(broken[:20])


def test_no_asset_comes_from_the_internet(book: Path) -> None:
    """Scripts, styles, fonts, images and MathJax are all in the book; only links go out."""
    remote = []
    for page in pages(book):
        for tag, attribute, url, attrs in parse(page).urls:
            is_asset = tag in ("script", "img", "iframe", "source", "video", "audio") or (
                tag == "link" and attrs.get("rel") not in ("canonical",))
            if is_asset and re.match(r"(https?:)?//", url):
                remote.append(f"{page.relative_to(book)}: <{tag} {attribute}={url}>")
    for style in book.rglob("*.css"):
        remote += [f"{style.relative_to(book)}: url({m})" for m in
                   re.findall(r"url\(\s*['\"]?((?:https?:)?//[^)'\"]+)", style.read_text(errors="replace"))]
    assert not remote, "assets loaded from the internet:\n" + "\n".join(remote[:20])
    assert (book / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not bundled"


def test_chapters_are_found_by_globbing_so_a_new_one_needs_no_list(tmp_path: Path) -> None:
    """A course with chapters 01 and 09 (no exercises for 09): both get a page, a table row,
    an entry in the navigation; 09 links no exercises; one title per page."""
    def notebook(title: str, *cells: str) -> str:
        sources = [f"# {title}\n\nSome text with $x^2$ math.", *cells]
        return json.dumps({"cells": [{"cell_type": "markdown", "id": f"c{i}", "metadata": {}, "source": s}
                                     for i, s in enumerate(sources)],
                           "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    root = tmp_path / "course"
    for kind in KINDS:
        (root / kind).mkdir(parents=True)
    (root / "chapters" / "01_first.ipynb").write_text(notebook("Chapter 01 · The first"))
    (root / "chapters" / "09_rotary.ipynb").write_text(notebook("Chapter 09 · Rotary positions", "# Part 2 · More",
                                                                "## A section"))
    (root / "exercises" / "01_first.ipynb").write_text(notebook("Exercises · Chapter 01 · The first"))
    (root / "solutions" / "01_first.ipynb").write_text(notebook("Solutions · Chapter 01 · The first"))
    (root / "README.md").write_text("| 09 | [`chapters/09_rotary`](chapters/09_rotary.ipynb) | spin the keys |\n")
    src = tmp_path / "src"
    chapters = book_build.stage(src, root=root)
    assert [c.stem for c in chapters] == ["01_first", "09_rotary"]
    index = (src / "index.md").read_text()
    assert "[The first](chapters/01_first.ipynb)" in index and "[Rotary positions](chapters/09_rotary.ipynb)" in index
    assert "| spin the keys |" in index, "the summary comes from the README's chapter table"
    assert "09 · Rotary positions <chapters/09_rotary>" in index
    staged = json.loads((src / "chapters" / "09_rotary.ipynb").read_text())
    text = "\n".join(c["source"] for c in staged["cells"])
    assert "exercises/09" not in text and "Exercises <" not in text, "09 has no exercises to link"
    assert len(re.findall(r"^# ", text, re.M)) == 1 and "## Part 2 · More" in text and "### A section" in text
    first = "\n".join(c["source"] for c in json.loads((src / "chapters" / "01_first.ipynb").read_text())["cells"])
    assert "Exercises <../exercises/01_first>" in first and "[Solutions 01](../solutions/01_first.ipynb)" in first


# ---------------------------------------------------------------------- in a browser

@pytest.fixture(scope="module")
def site(book: Path) -> Iterator[str]:
    """The book served over HTTP on loopback, as GitHub Pages serves it."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(book))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# Runs in the page once MathJax is done: what a reader sees.
PAGE_STATE_JS = """async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
    const article = document.querySelector('article') || document.body;
    const images = Array.from(article.querySelectorAll('img')).map(
        i => ({src: i.getAttribute('src'), complete: i.complete, width: i.naturalWidth}));
    const math = Array.from(article.querySelectorAll('.math'));
    const untypeset = math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80));
    const clone = article.cloneNode(true);
    clone.querySelectorAll('pre, code, script, style, mjx-container, .highlight').forEach(e => e.remove());
    return {images, math: math.length, typeset: article.querySelectorAll('mjx-container').length,
            untypeset, text: clone.textContent};
}"""
RAW_MATH = re.compile(r"\\\(|\\\[|\$\$|(?<![\w$])\$[^\s$][^$\n]*?(?<=[^\s$])\$(?![\w$])")


def test_every_page_in_a_browser(book: Path, site: str, sync_playwright) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    paths = ["index.html"] + [f"{kind}/{n.stem}.html" for kind in KINDS for n in notebooks(kind)]
    shots = {"index.html": ARTIFACTS / "landing.png",
             f"chapters/{notebooks('chapters')[0].stem}.html": ARTIFACTS / "chapter_01.png"}
    for shot in shots.values():
        shot.unlink(missing_ok=True)
    problems: list[str] = []
    math_pages = 0
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport=VIEWPORT)
        events: list[str] = []
        page.on("console", lambda m: events.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: events.append(f"page error: {e}"))
        # ERR_ABORTED: a request the next navigation cut short (the favicon); 404s are below.
        page.on("requestfailed", lambda r: events.append(f"request failed: {r.url} ({r.failure})")
                if "ERR_ABORTED" not in (r.failure or "") else None)
        page.on("response", lambda r: events.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
        try:
            for path in paths:
                events.clear()
                page.goto(f"{site}/{path}", wait_until="load", timeout=60_000)
                state = page.evaluate(PAGE_STATE_JS)
                problems += [f"{path}: {e}" for e in events]
                problems += [f"{path}: image {i['src']} not drawn" for i in state["images"]
                             if not (i["complete"] and i["width"] > 0)]
                problems += [f"{path}: formula not typeset: {m!r}" for m in state["untypeset"]]
                raw = RAW_MATH.findall(state["text"])
                problems += [f"{path}: raw TeX in the text: {r!r}" for r in raw[:3]]
                figures = stored_figures(ROOT / path.replace(".html", ".ipynb")) if path != "index.html" else 0
                if len(state["images"]) < figures:
                    problems.append(f"{path}: the notebook stores {figures} figures, the page shows "
                                    f"{len(state['images'])}")
                math_pages += state["math"] > 0
                if state["math"] and not state["typeset"]:
                    problems.append(f"{path}: {state['math']} formulas, none typeset")
                if path in shots:
                    page.screenshot(path=str(shots[path]))
            # Search (Sphinx's own index, in the page): the chapters' words are found.
            events.clear()
            page.goto(f"{site}/search.html?q=softmax", wait_until="load", timeout=60_000)
            results = page.locator("#search-results ul.search li")
            results.first.wait_for(timeout=30_000)
            found = results.evaluate_all("ls => ls.map(l => l.querySelector('a').getAttribute('href'))")
            problems += [f"search.html: {e}" for e in events]
        finally:
            browser.close()
    assert not problems, f"{len(problems)} problems in the browser:\n" + "\n".join(problems[:30])
    assert math_pages >= len(notebooks("chapters")), f"only {math_pages} pages have formulas"
    assert any("chapters/01_" in href for href in found), f"searching 'softmax' finds {found}"
    for shot in shots.values():
        assert shot.stat().st_size > 20_000, f"the screenshot {shot} looks empty"


# Runs in the page: the state of the two sidebars (in place, or moved into their <dialog>).
SIDEBARS_JS = """() => {
    const shown = e => !!e && getComputedStyle(e).visibility === 'visible' && e.getBoundingClientRect().width > 0;
    const primary = document.getElementById('pst-primary-sidebar-modal');
    const secondary = document.getElementById('pst-secondary-sidebar-modal');
    return {
        primaryDrawer: primary.open && shown(primary) && primary.querySelectorAll('nav.bd-docs-nav a').length > 5,
        secondaryDrawer: secondary.open && shown(secondary) && !!secondary.querySelector('nav.page-toc a'),
        primaryColumn: shown(document.getElementById('pst-primary-sidebar')) &&
            !document.getElementById('pst-primary-sidebar').classList.contains('pst-sidebar-hidden'),
    };
}"""


@pytest.mark.browser
@pytest.mark.parametrize("width", [390, 1280])
def test_the_visible_sidebar_buttons_open_the_drawers(book: Path, site: str, sync_playwright, width: int) -> None:
    """The ☰ button opens the chapter list and "Contents" the page's sections, clicked as a
    reader clicks them: the visible buttons (the theme wires hidden copies; book/_static/course.js).
    On a wide screen the chapter list is a column that ☰ hides and brings back."""
    chapter = f"chapters/{notebooks('chapters')[0].stem}.html"
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": width, "height": 800})
            page.goto(f"{site}/{chapter}", wait_until="load", timeout=60_000)
            state = lambda: page.evaluate(SIDEBARS_JS)  # noqa: E731
            primary, contents = page.locator(".primary-toggle:visible"), page.locator(".secondary-toggle:visible")
            assert primary.count() == 1, f"{width} px: {primary.count()} visible ☰ buttons"
            assert contents.count() == 1, f"{width} px: {contents.count()} visible 'Contents' buttons"
            if width < 992:  # a phone: the chapter list is a drawer
                assert not state()["primaryDrawer"]
                primary.click()
                page.wait_for_function("document.getElementById('pst-primary-sidebar-modal').open", timeout=5_000)
                page.wait_for_timeout(400)  # the slide-in
                assert state()["primaryDrawer"], f"{width} px: ☰ doesn't open the chapter list: {state()}"
                page.keyboard.press("Escape")
                page.wait_for_timeout(400)
            else:  # a wide screen: the chapter list is a column, ☰ hides it and brings it back
                assert state()["primaryColumn"], f"{width} px: no chapter list: {state()}"
                primary.click()
                page.wait_for_timeout(400)
                assert not state()["primaryColumn"], f"{width} px: ☰ doesn't hide the chapter list: {state()}"
                primary.click()
                page.wait_for_timeout(400)
                assert state()["primaryColumn"], f"{width} px: ☰ doesn't bring the chapter list back: {state()}"
            assert not state()["secondaryDrawer"]
            contents.click()
            page.wait_for_function("document.getElementById('pst-secondary-sidebar-modal').open", timeout=5_000)
            page.wait_for_timeout(400)
            assert state()["secondaryDrawer"], f"{width} px: 'Contents' doesn't open the page's sections: {state()}"
            page.screenshot(path=str(ARTIFACTS / f"contents_{width}px.png"))
        finally:
            browser.close()


# Runs in the page once MathJax is done: the code and output blocks wider than the column.
OVERFLOW_JS = """async () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
    const article = document.querySelector('article');
    const blocks = Array.from(article.querySelectorAll('pre'));
    const over = blocks.filter(b => b.scrollWidth > b.clientWidth + 1 ||
                                    b.getBoundingClientRect().right > article.getBoundingClientRect().right + 1);
    const equations = Array.from(article.querySelectorAll('mjx-container[display="true"]'));
    const cut = equations.filter(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'auto');
    return {blocks: blocks.length, over: over.map(b => b.textContent.split('\\n')[0].slice(0, 60)),
            cut: cut.length, pageWidth: document.documentElement.scrollWidth, viewport: innerWidth};
}"""


@pytest.mark.browser
def test_code_and_outputs_fit_the_column(book: Path, site: str, sync_playwright) -> None:
    """At 1280 px no more than 5 % of the chapters' code and output blocks are wider than the
    text column (long lines wrap: book/_static/course.css and course.js), no display formula is
    cut off (a wide one scrolls), and no page is wider than the screen, at 1280 px or on a phone."""
    problems, counts = [], {}
    with sync_playwright() as p:
        browser = launch(p)
        try:
            for width in (1280, 390):
                page = browser.new_page(viewport={"width": width, "height": 900})
                total, over = 0, []
                for notebook in notebooks("chapters"):
                    path = f"chapters/{notebook.stem}.html"
                    page.goto(f"{site}/{path}", wait_until="load", timeout=60_000)
                    state = page.evaluate(OVERFLOW_JS)
                    total += state["blocks"]
                    over += [f"{path}: {line!r}" for line in state["over"]]
                    if state["cut"]:
                        problems.append(f"{width} px, {path}: {state['cut']} display formulas cut off")
                    if state["pageWidth"] > state["viewport"]:
                        problems.append(f"{width} px, {path}: the page is {state['pageWidth']} px wide")
                counts[width] = (len(over), total)
                if width == 1280 and len(over) > 0.05 * total:
                    problems.append(f"{len(over)} of {total} code/output blocks overflow at 1280 px, e.g.:\n"
                                    + "\n".join(over[:10]))
                page.close()
        finally:
            browser.close()
    assert counts[1280][1] > 100, f"only {counts[1280][1]} code/output blocks found in the chapters"
    assert not problems, "\n".join(problems)


def test_tooling_markers_are_stripped_and_exercises_linked(book: Path) -> None:
    """The book's pages show no nbval or solution markers (the committed notebooks keep them),
    and each chapter's "Exercises" section links its exercise and solution pages."""
    markers = ("NBVAL_IGNORE_OUTPUT", "NBVAL_SKIP", "BEGIN SOLUTION", "END SOLUTION")
    assert any(m in (ROOT / "chapters" / "07_heads_at_work.ipynb").read_text() for m in markers)  # still there
    for page in sorted(book.glob("*/[0-9][0-9]_*.html")):
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))
        assert not [m for m in markers if m in text], page.name
    for page in sorted(book.glob("chapters/[0-9][0-9]_*.html")):
        source = page.read_text(encoding="utf-8")
        start = max(source.find('id="exercises"'), source.find('id="your-turn"'))  # chapter 11: "Your turn"
        section = source[start:source.find("</section>", start)]  # the Exercises section only
        assert f'href="../exercises/{page.stem}.html"' in section, page.name
        assert f'href="../solutions/{page.stem}.html"' in section, page.name
