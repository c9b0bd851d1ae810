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
  ``$...$`` or ``\\(`` left in the text), each code cell has its copy button, search finds
  the chapters; screenshots of the landing page and of chapter 01 go to ``artifacts/book/``.
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
        i => ({src: i.getAttribute('src'), complete: i.complete, width: i.naturalWidth, alt: i.getAttribute('alt'),
               output: !!i.closest('.cell_output'), shown: i.getBoundingClientRect().width,
               column: article.getBoundingClientRect().width,
               caption: ((i.closest('figure') || {querySelector: () => null}).querySelector('figcaption') || {}).textContent || ''}));
    const hints = Array.from(article.querySelectorAll('.cell_output .output.text_html')).map(h => ({
        text: h.textContent, code: h.querySelectorAll('code').length}));
    const math = Array.from(article.querySelectorAll('.math'));
    const untypeset = math.filter(m => !m.querySelector('mjx-container')).map(m => m.textContent.slice(0, 80));
    // Copy buttons (sphinx-copybutton): one after each code cell's code, none on an output.
    const code = Array.from(article.querySelectorAll('div.cell_input pre, div.highlight-bash pre'));
    const copy = {code: code.length,
                  buttons: code.filter(c => (c.nextElementSibling || c).matches('button.copybtn')).length,
                  onOutputs: article.querySelectorAll('.cell_output .copybtn').length};
    const clone = article.cloneNode(true);
    clone.querySelectorAll('pre, code, script, style, mjx-container, .highlight').forEach(e => e.remove());
    return {images, hints, math: math.length, typeset: article.querySelectorAll('mjx-container').length,
            untypeset, text: clone.textContent, copy};
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
        requested: set[str] = set()
        page.on("request", lambda r: requested.add(urllib.parse.urlsplit(r.url).path.lstrip("/"))
                if r.url.startswith(site) else None)
        figures_seen = captioned = 0
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
                # Figures: alt text (never the image's file name), a caption from the title, the column's width at most.
                for image in (i for i in state["images"] if i["output"]):
                    figures_seen += 1
                    captioned += bool(image["caption"].strip())
                    if not image["alt"] or re.search(r"\.(png|jpe?g|gif|svg)$", image["alt"]):
                        problems.append(f"{path}: figure {image['src']} has the alt text {image['alt']!r}")
                    if image["shown"] > image["column"] + 1:
                        problems.append(f"{path}: figure {image['src']} is {image['shown']} px wide in a "
                                        f"{image['column']} px column")
                # Hints: code between backticks shows as code.
                problems += [f"{path}: a hint shows backticks: {h['text'][:100]!r}" for h in state["hints"]
                             if "`" in h["text"]]
                copy = state["copy"]
                if copy["buttons"] < copy["code"] or (path != "index.html" and not copy["code"]):
                    problems.append(f"{path}: {copy['buttons']} copy buttons for {copy['code']} code cells")
                if copy["onOutputs"]:
                    problems.append(f"{path}: {copy['onOutputs']} copy buttons on outputs")
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
            # Excerpts: the page's text around the word, never the theme's buttons or contents list.
            page.wait_for_function("document.querySelectorAll('#search-results ul.search li p.context').length >= 3",
                                   timeout=30_000)
            excerpts = page.locator("#search-results ul.search li p.context").all_inner_texts()
            for excerpt in excerpts:
                if "softmax" not in excerpt.lower() or re.search(r"System Settings|Light\s+Dark|Run it in JupyterLab",
                                                                 excerpt):
                    problems.append(f"search.html: a poor excerpt: {excerpt[:160]!r}")
            problems += [f"search.html: {e}" for e in events]
        finally:
            browser.close()
    # Only what the pages load is shipped: every script and stylesheet is requested by some page.
    shipped = {p.relative_to(book).as_posix() for p in (book / "_static").rglob("*")
               if p.suffix in (".js", ".css") and p.is_file()}
    unused = sorted(shipped - requested)
    assert not unused, f"scripts and stylesheets that no page loads: {unused}"
    mathjax = sorted(r for r in requested if "/mathjax/" in r)
    assert all(r.endswith("tex-chtml.js") or "/output/chtml/fonts/woff-v2/" in r for r in mathjax), mathjax
    assert figures_seen >= 40 and captioned >= 0.9 * figures_seen, (
        f"{captioned} of {figures_seen} figures have a caption")
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
        start = max(source.find('id="exercises"'), source.find('id="your-turn"'))  # chapter 12: "Your turn"
        section = source[start:source.find("</section>", start)]  # the Exercises section only
        assert f'href="../exercises/{page.stem}.html"' in section, page.name
        assert f'href="../solutions/{page.stem}.html"' in section, page.name


# ------------------------------------------------------- figures, hints, references, setting

def _png(width: int, height: int) -> str:
    """A plain PNG of that many pixels, base64 (as a notebook stores it)."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + bytes([30, 120, 200]) * width for _ in range(height))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


def _figure(width: int = 64, height: int = 32, metadata: dict | None = None) -> dict:
    return {"output_type": "display_data", "metadata": metadata or {},
            "data": {"image/png": _png(width, height), "text/plain": "<Figure>"}}


def _code(source: str, *outputs: dict, cell_id: str = "c") -> dict:
    return {"cell_type": "code", "id": cell_id, "metadata": {}, "execution_count": 1, "source": source,
            "outputs": list(outputs)}


def test_every_figure_gets_alt_text_and_a_caption_from_its_title() -> None:
    """Titles as the cells set them: suptitle, title=, set_title, f-strings over constants and
    loops; a cell with two figures is split so that each has its own; no title: axis labels,
    else a plain description. Captions are Markdown that shows the title literally."""
    cells = [
        _code("L = 16\nlabels = ['a']"),
        _code('fig.suptitle(f"Where each query may look (L = {L}; <pad> is *masked*)")\nplt.show()',
              _figure(), cell_id="one"),
        _code('for layer in range(2):\n    plot_attention(w, labels, title=f"layer {layer + 1}")\n    plt.show()\n'
              'print("done")', _figure(), _figure(), {"output_type": "stream", "name": "stdout", "text": "done\n"},
              cell_id="two"),
        _code('ax.set_xlabel("training step")\nax.set_ylabel("loss")', _figure(), cell_id="labels"),
        _code("draw(ax)", _figure(), cell_id="none"),
        _code('ax.set_title(f"on {device.type}")', _figure(), cell_id="unknown"),
    ]
    out = book_build.caption_figures(json.loads(json.dumps(cells)), "chapter 42")
    options = {c["id"]: c["metadata"].get("mystnb") for c in out if c["cell_type"] == "code"}
    one = options["one"]
    assert one["image"]["alt"] == "Where each query may look (L = 16; <pad> is *masked*)"
    caption = one["figure"]["caption"]
    assert "\\<pad\\>" in caption and "\\*masked\\*" in caption, f"the caption is not escaped Markdown: {caption}"
    # two figures, one caption each, in cells of their own (outputs only); the print stays uncaptioned
    split = [c for c in out if c["id"].startswith("two")]
    assert [c["metadata"].get("mystnb", {}).get("image", {}).get("alt") for c in split] == [None, "layer 1", "layer 2",
                                                                                              None]
    assert split[0]["source"].startswith("for layer") and not split[0]["outputs"]
    assert all("remove-input" in c["metadata"]["tags"] for c in split[1:])
    assert split[-1]["outputs"][0]["output_type"] == "stream" and "mystnb" not in split[-1]["metadata"]
    assert sum(len(c["outputs"]) for c in split) == 3, "an output was lost or duplicated"
    assert options["labels"]["image"]["alt"] == "Loss against training step"
    assert options["none"]["image"]["alt"] == "Figure 5 of chapter 42, drawn by the code above"
    assert "figure" not in options["none"], "no title, no caption"
    assert options["unknown"]["image"]["alt"] == "on …"


def test_hints_show_code_as_code() -> None:
    """Backticks in an HTML output become <code>, in the text only: never inside a tag or a
    <pre>, and the text stays escaped (nothing new is injected)."""
    verdict = ('<div style="a`b`"><b>⏳ x</b>: it raises <br><b>Hint:</b> Replace the `raise NotImplementedError`'
               ' with `a &lt; b`.</div><pre>keep `this`</pre>')
    shown = book_build.html_code_spans(verdict)
    assert shown == ('<div style="a`b`"><b>⏳ x</b>: it raises <br><b>Hint:</b> Replace the '
                     '<code>raise NotImplementedError</code> with <code>a &lt; b</code>.</div><pre>keep `this`</pre>')
    staged = json.loads(book_build.staged_notebook(ROOT / "exercises" / "01_dot_product_attention.ipynb", "exercises",
                                                   book_build.find_chapters()[0], {"url": "", "branch": "main"}))
    html_outputs = ["".join(o["data"]["text/html"]) for c in staged["cells"] for o in c.get("outputs", [])
                    if "text/html" in o.get("data", {})]
    assert html_outputs and all("`" not in h for h in html_outputs if "Hint" in h)
    assert any("<code>raise NotImplementedError</code>" in h for h in html_outputs)


def test_figures_are_drawn_at_twice_their_pixels_and_shipped_light(tmp_path: Path) -> None:
    """Every notebook figure is a retina PNG (twice the pixels of its displayed width); the book
    ships it as a 256-colour palette when that looks the same, and keeps an image that a palette
    would change (here: noise with many colours)."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    import figures

    for notebook in sorted(ROOT.glob(f"*/{NOTEBOOK_GLOB}")):
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    raw = base64.b64decode("".join(output["data"]["image/png"]))
                    width = Image.open(io.BytesIO(raw)).width
                    shown = output.get("metadata", {}).get("image/png", {}).get("width")
                    assert shown == width // 2, f"{notebook.name}: a figure without retina pixels ({width} px, {shown})"

    def png(image: Image.Image) -> str:
        out = io.BytesIO()
        image.save(out, format="png")
        return base64.b64encode(out.getvalue()).decode()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(6, 2.5), dpi=200)  # a figure as the chapters draw them
    axes[0].imshow(np.random.default_rng(0).random((8, 8)), cmap="Blues")
    axes[1].plot(np.sin(np.linspace(0, 6, 100)), label="sine")
    axes[1].legend()
    fig.suptitle("A figure")
    canvas = io.BytesIO()
    fig.savefig(canvas, format="png")
    plt.close(fig)
    drawn = Image.open(canvas).convert("RGB")
    light = figures.lighter_png(png(drawn))
    kept = Image.open(io.BytesIO(base64.b64decode(light)))
    assert kept.mode == "P" and len(light) < len(png(drawn))
    error = np.abs(np.asarray(kept.convert("RGB"), dtype=int) - np.asarray(drawn, dtype=int)).mean()
    assert error < figures.PALETTE_MEAN_ERROR
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 200, 3), dtype=np.uint8))
    assert figures.lighter_png(png(noise)) == png(noise), "a palette would change this image: kept as is"
    cells = [{"cell_type": "code", "outputs": [{"output_type": "display_data", "data": {"image/png": png(drawn)}}]}]
    figures.lighter_figures(cells, cache=tmp_path)
    assert cells[0]["outputs"][0]["data"]["image/png"] == light and len(list(tmp_path.iterdir())) == 1


def test_a_rebuild_ships_no_image_that_no_page_shows(tmp_path: Path) -> None:
    """Sphinx keeps a re-executed figure's old file in _images/; the build removes it, and only it."""
    (tmp_path / "_images").mkdir()
    (tmp_path / "chapters").mkdir()
    for name in ("old.png", "kept.png", "logo.svg"):
        (tmp_path / "_images" / name).write_bytes(b"x")
    (tmp_path / "chapters" / "01.html").write_text('<img src="../_images/kept.png" alt="a">', encoding="utf-8")
    (tmp_path / "index.html").write_text("<img src='_images/logo.svg'>", encoding="utf-8")
    assert book_build.prune_images(tmp_path) == ["old.png"]
    assert sorted(p.name for p in (tmp_path / "_images").iterdir()) == ["kept.png", "logo.svg"]


def test_every_cited_paper_is_in_the_references_with_a_link() -> None:
    """Every ``"Title" (year)`` a chapter cites, and every arXiv id or DOI it mentions, is in
    book/references.py, which gives each paper a link (arXiv, DOI or URL)."""
    catalogue = book_build.papers()
    ids = {p.get("arxiv") for p in catalogue} | {p.get("doi") for p in catalogue}
    cited, unknown, stray = set(), [], []
    for notebook in notebooks("chapters"):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for title, year in book_build.citations(text):
            paper = book_build.cited_paper(title, year, catalogue)
            if paper is None:
                unknown.append(f"{notebook.name}: {' '.join(title.split())!r} ({year})")
            else:
                cited.add(paper["key"])
        stray += [f"{notebook.name}: arXiv {m}" for m in re.findall(r"(?i)arxiv[:\s./abs]*(\d{4}\.\d{4,5})", text)
                  if m not in ids]
        stray += [f"{notebook.name}: DOI {m}" for m in re.findall(r"\b(10\.\d{4,9}/[^\s\)\]>\"]+)", text)
                  if m.rstrip(".,;") not in ids]
    assert not unknown, "cited but not in book/references.py:\n" + "\n".join(unknown)
    assert not stray, "arXiv ids or DOIs the references don't list:\n" + "\n".join(stray)
    assert len(cited) >= 25, f"only {len(cited)} papers recognised in the chapters"
    for paper in catalogue:
        assert paper["key"] in cited, f"{paper['key']} is listed but no chapter cites it"
        assert re.match(r"https://(arxiv\.org/abs/\d{4}\.\d{4,5}$|doi\.org/10\.|transformer-circuits\.pub/|www\.evanmiller\.org/)",
                        book_build.runpy.run_path(str(ROOT / "book" / "references.py"))["link"](paper)), paper


def test_the_references_page_and_the_chapters_link_the_papers(book: Path) -> None:
    references = (book / "references.html").read_text(encoding="utf-8")
    hrefs = {url for tag, _, url, _ in parse(book / "references.html").urls if tag == "a"}
    for paper in book_build.papers():
        if paper.get("arxiv"):
            assert f"https://arxiv.org/abs/{paper['arxiv']}" in hrefs, f"references.html lacks {paper['arxiv']}"
        assert f'id="{paper["key"]}"' in references, f"no anchor for {paper['key']}"
    assert "chapters/06_positions_inside_attention.html" in hrefs, "no 'cited in' links back to the chapters"
    chapter = [url for tag, _, url, _ in parse(book / "chapters" / "01_dot_product_attention.html").urls if tag == "a"]
    assert "https://arxiv.org/abs/1706.03762" in chapter, "chapter 01's citation of Vaswani et al. is not linked"
    assert "references.html" in {u for t, _, u, _ in parse(book / "index.html").urls if t == "a"}


def _conf(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict:
    for name in ("MHA_REPOSITORY_URL", "MHA_REPOSITORY_BRANCH", "GITHUB_REPOSITORY", "GITHUB_SERVER_URL",
                 "MHA_LAB_URL", "MHA_REQUIRE_REPOSITORY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return book_build.runpy.run_path(str(ROOT / "book" / "conf.py"))


def test_the_repository_comes_from_one_setting_or_from_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """GitHub Actions' GITHUB_REPOSITORY fills it in CI; MHA_REPOSITORY_URL wins over it; the
    placeholder counts as unset (no links are built from it)."""
    conf = _conf(monkeypatch, GITHUB_REPOSITORY="someone/their-course", GITHUB_SERVER_URL="https://github.com")
    assert conf["repository_url"] == "https://github.com/someone/their-course" and conf["repository_configured"]
    assert conf["html_theme_options"]["use_repository_button"] is True
    assert "colab_url" in conf["html_theme_options"]["launch_buttons"]
    assert "https://github.com/someone/their-course" in conf["html_theme_options"]["extra_footer"]
    conf = _conf(monkeypatch, GITHUB_REPOSITORY="someone/their-course", MHA_REPOSITORY_URL="https://github.com/a/b/")
    assert conf["repository_url"] == "https://github.com/a/b"
    conf = _conf(monkeypatch)
    if conf["REPOSITORY_URL"] == conf["PLACEHOLDER_URL"]:
        assert not conf["repository_configured"] and conf["repository_url"] == ""
        assert conf["html_theme_options"]["use_repository_button"] is False
        assert "launch_buttons" not in conf["html_theme_options"]
    conf = _conf(monkeypatch, MHA_REPOSITORY_URL="https://github.com/OWNER/REPO")
    assert not conf["repository_configured"], "the placeholder must never count as the repository"


def test_a_local_build_with_the_placeholder_warns_or_is_refused(monkeypatch: pytest.MonkeyPatch, capsys,
                                                                tmp_path: Path) -> None:
    """No repository: the build says so loudly and builds without the links (no OWNER/REPO in
    any page); with --require-repository (or MHA_REQUIRE_REPOSITORY=1) it refuses."""
    _conf(monkeypatch)
    monkeypatch.setattr(book_build.runpy, "run_path", _with_placeholder(book_build.runpy.run_path))
    monkeypatch.setattr(book_build, "build", lambda *args, **kwargs: None)  # no Sphinx: the check comes first
    assert book_build.main(["--out", str(tmp_path / "book")]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "repository URL is not set" in err and "MHA_REPOSITORY_URL=" in err
    staged = "\n".join(p.read_text(encoding="utf-8") for p in (tmp_path / "book-src").rglob("*")
                       if p.suffix in (".ipynb", ".md"))
    assert "OWNER" not in staged and "colab.research.google.com" not in staged and "git+" not in staged
    assert "<this repository>" not in staged
    assert book_build.main(["--out", str(tmp_path / "book2"), "--require-repository"]) == 2
    assert "error: refusing to build" in capsys.readouterr().err
    monkeypatch.setenv("MHA_REQUIRE_REPOSITORY", "1")
    assert book_build.main(["--out", str(tmp_path / "book3")]) == 2
    assert not (tmp_path / "book3-src").exists(), "a refused build must not start"


def _with_placeholder(run_path):
    """runpy.run_path, but book/conf.py runs with REPOSITORY_URL as the placeholder (whatever it is set to)."""
    def run(path: str, *args, **kwargs):
        if Path(path).name != "conf.py":
            return run_path(path, *args, **kwargs)
        source = Path(path).read_text(encoding="utf-8")
        source = re.sub(r"^REPOSITORY_URL = .*$", "REPOSITORY_URL = PLACEHOLDER_URL", source, flags=re.M)
        namespace: dict = {"__file__": path, "__name__": "<conf>"}
        exec(compile(source, path, "exec"), namespace)  # noqa: S102 - the course's own conf.py
        return namespace
    return run


def test_the_jupyterlab_link_says_how_to_reach_any_port_and_token(monkeypatch: pytest.MonkeyPatch) -> None:
    chapter = book_build.find_chapters()[0]
    repo = {"url": "", "branch": "main", "lab": _conf(monkeypatch, MHA_LAB_URL="http://localhost:9999/")["lab_url"]}
    box = book_build.banner("chapters", chapter, repo)
    path = f"chapters/{chapter.stem}.ipynb"
    assert f"](http://localhost:9999/lab/tree/{path})" in box, "the link is not built from the setting"
    assert "the address `make lab` printed" in box and f"put `{path}` in place of `README.md`" in box, box
    assert "Colab" not in box, "no Colab link without a repository"


def test_sphinx_copybutton_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    """Copy buttons are always on: without sphinx-copybutton, book/conf.py (and `make book`)
    stop with an error that says how to install it; requirements-dev.txt pins it."""
    conf = _conf(monkeypatch)
    assert "sphinx_copybutton" in conf["extensions"]
    selector = {s.strip() for s in conf["copybutton_selector"].split(",")}
    assert selector == {"div.cell_input pre", "div.highlight-bash pre", "div.highlight-python pre"}, selector
    assert {".gp", ".go"} <= {s.strip() for s in conf["copybutton_exclude"].split(",")}, "prompts and output are copied"
    monkeypatch.setitem(sys.modules, "sphinx_copybutton", None)  # import fails
    with pytest.raises(ImportError, match=r"sphinx-copybutton.*make setup.*requirements-dev\.txt"):
        _conf(monkeypatch)
    with pytest.raises(SystemExit, match=r"^error: .*sphinx-copybutton.*make setup"):
        book_build.settings()
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert re.search(r"^sphinx-copybutton==[\d.]+$", dev, re.M), "requirements-dev.txt must pin sphinx-copybutton"


def test_copy_buttons_come_from_the_book_itself(book: Path) -> None:
    """Every notebook page, and the landing page (its shell commands), loads sphinx-copybutton's
    script and stylesheet from the book's own _static/ (never a CDN), set up for the code cells;
    test_every_page_in_a_browser checks that each code cell gets its button."""
    static = book / "_static"
    wanted = {"_static/copybutton.js", "_static/copybutton.css", "_static/clipboard.min.js"}
    for name in wanted:
        assert (book / name).is_file() and (book / name).stat().st_size > 500, f"{name} is not shipped"
    conf = book_build.runpy.run_path(str(ROOT / "book" / "conf.py"))
    script = (static / "copybutton.js").read_text(encoding="utf-8")
    assert f"'{conf['copybutton_selector']}'" in script and f"'{conf['copybutton_exclude']}'" in script
    paths = ["index.html"] + [f"{kind}/{n.stem}.html" for kind in KINDS for n in notebooks(kind)]
    for path in paths:
        page = book / path
        loaded = {urllib.parse.urljoin(path, url).split("?")[0] for tag, attribute, url, _ in parse(page).urls
                  if (tag, attribute) in (("script", "src"), ("link", "href"))}
        assert not wanted - loaded, f"{path} does not load {sorted(wanted - loaded)} from the book"
        if path != "index.html":
            assert 'class="cell_input' in page.read_text(encoding="utf-8"), f"{path} has no code cell"


def test_footer_download_and_no_placeholder_in_the_book(book: Path) -> None:
    """The configured repository is everywhere a placeholder was: the footer, the download
    menu (the committed notebook), the clone line; nothing says OWNER/REPO or "the course's authors"."""
    for page in pages(book):
        text = page.read_text(encoding="utf-8")
        assert "OWNER/REPO" not in text and "By the course" not in text, page.name
    index = text_of(book / "index.html")
    assert f"git clone {REPOSITORY}.git" in index
    footer = re.search(r'<div class="extra_footer">(.*?)</div>', (book / "index.html").read_text(), re.S).group(1)
    assert f'href="{REPOSITORY}"' in footer and "MIT" in footer
    for kind in KINDS:
        for notebook in notebooks(kind):
            links = [url for tag, _, url, attrs in parse(book / kind / f"{notebook.stem}.html").urls
                     if tag == "a" and "btn-download-notebook-button" in attrs.get("class", "")]
            assert links == [f"{REPOSITORY}/raw/main/{kind}/{notebook.name}"], f"{kind}/{notebook.name}: {links}"
    assert not list(book.rglob("_sources")), "the pages' sources are not shipped (the download is the notebook)"


def test_only_what_the_pages_load_is_shipped(book: Path) -> None:
    """≤ 10 MB; MathJax is its one bundle and its fonts; no source maps, translation catalogues
    or fontawesome.js (the theme's stylesheet draws the icons from its web fonts)."""
    size = sum(p.stat().st_size for p in book.rglob("*") if p.is_file())
    assert size <= 10 * 2**20, f"the book is {size / 2**20:.1f} MB"
    static = book / "_static"
    assert not list(static.rglob("*.map")) and not (static / "locales").exists()
    # (the pinned theme for Python 3.10 may still need fontawesome.js: book/conf.py checks)
    no_fontawesome_js = book_build.runpy.run_path(str(ROOT / "book" / "conf.py"))["html_context"]["mha_no_fontawesome_js"]
    assert (static / "scripts" / "fontawesome.js").exists() != no_fontawesome_js
    mathjax = {p.relative_to(static / "mathjax").as_posix() for p in (static / "mathjax").rglob("*") if p.is_file()}
    assert "tex-chtml.js" in mathjax and any(m.startswith("output/chtml/fonts/woff-v2/") for m in mathjax)
    extra = sorted(m for m in mathjax if m != "tex-chtml.js" and not m.startswith("output/chtml/fonts/woff-v2/"))
    assert not extra, f"MathJax files no page loads: {extra[:10]}"
    for page in pages(book):
        assert ("fontawesome.js" in page.read_text(encoding="utf-8")) != no_fontawesome_js, page.name


@pytest.mark.browser
def test_retina_figures_show_at_their_intended_size_with_captions(tmp_path: Path, sync_playwright) -> None:
    """A tiny course built by the same code: a PNG with twice the pixels and the width/height a
    retina figure stores is drawn at that CSS size, sharp; a wide one fits the column with its
    aspect kept; each has the caption and alt text of its title, shown literally; a hint's
    backticks are code."""
    root = tmp_path / "course"
    (root / "chapters").mkdir(parents=True)
    title = 'Scores & <pad>: a *title* with `code` and $x$'
    cells = [
        {"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# Chapter 01 · Tiny\n\nText."},
        _code(f"fig.suptitle({title!r})\nplt.show()",
              _figure(800, 400, {"image/png": {"width": 400, "height": 200}}), cell_id="small"),
        _code('ax.set_title("A wide one")', _figure(2400, 600, {"image/png": {"width": 1200, "height": 300}}),
              cell_id="wide"),
        _code("check(f)", {"output_type": "display_data", "metadata": {}, "data": {
            "text/plain": "hint", "text/html": "<div><b>Hint:</b> use `torch.softmax` here</div>"}}, cell_id="hint"),
    ]
    (root / "chapters" / "01_tiny.ipynb").write_text(json.dumps(
        {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"},
                                      "language_info": {"name": "python"}},
         "nbformat": 4, "nbformat_minor": 5}))
    src, out = tmp_path / "src", tmp_path / "book"
    book_build.stage(src, root=root, repo={"url": "", "branch": "main", "configured": False})
    book_build.build(out, src)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = launch(p)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=2)
                page.goto(f"http://127.0.0.1:{server.server_address[1]}/chapters/01_tiny.html", wait_until="load")
                page.wait_for_function("Array.from(document.querySelectorAll('article img')).every(i => i.complete)")
                images = page.evaluate("""() => Array.from(document.querySelectorAll('article .cell_output img')).map(i => {
                    const r = i.getBoundingClientRect(), f = i.closest('figure');
                    return {alt: i.getAttribute('alt'), natural: i.naturalWidth, width: r.width, height: r.height,
                            column: document.querySelector('article').getBoundingClientRect().width,
                            caption: f ? f.querySelector('figcaption').textContent.replace(/[#¶]\\s*$/, '').trim() : null};
                })""")
                code = page.locator("article .output.text_html code").all_inner_texts()
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    small, wide = images
    assert small["natural"] == 800 and abs(small["width"] - 400) <= 1 and abs(small["height"] - 200) <= 1, small
    assert small["alt"] == title and small["caption"] == title, small
    assert wide["width"] <= wide["column"] + 1 and wide["width"] < 1200, wide
    assert abs(wide["height"] - wide["width"] / 4) <= 2, f"the wide figure lost its aspect: {wide}"
    assert wide["caption"] == "A wide one"
    assert code == ["torch.softmax"]
