"""JupyterLab in a real browser, started as `make lab` starts it, in headless Chromium.

nbval proves that the notebook's code runs; these tests prove what a learner sees:

- ``make lab`` opens on the course's landing page (README.md, rendered, with the chapter
  table, whose links open the chapters), and JupyterLab's "Would you like to get notified
  about official Jupyter news?" question does not pop up (the settings in
  ``.jupyterlab/overrides.json``, which ``make lab`` installs into .venv);
- chapter 01 opens, every cell runs from Run → Run All Cells, no cell shows an error or a
  warning, and the attention maps are drawn.

The server runs with the same options as ``make lab`` (read from ``make -n lab``) in a
temporary folder that holds a copy of README.md and of chapter 01 (the committed files are
never touched), and screenshots go to ``artifacts/browser/``. Chromium and Playwright: see
tests/browser_support.py (skips without them, fails instead when ``MHA_REQUIRE_BROWSER=1``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from browser_support import VIEWPORT, launch, missing, start_lab, sync_playwright  # noqa: F401 - a fixture

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "chapters" / "01_dot_product_attention.ipynb"
LANDING = ROOT / "README.md"
OVERRIDES = ROOT / ".jupyterlab" / "overrides.json"
ARTIFACTS = ROOT / "artifacts" / "browser"
SERVER_START_TIMEOUT = 60  # s, until the server answers
RUN_ALL_TIMEOUT = 120  # s, from Run All Cells until the kernel is idle with every cell run
# The test's own user settings (JupyterLab's settings folder, not yours): render every cell
# (no windowing, so the DOM holds the whole notebook). Nothing else: the news question must
# be kept away by the course's own overrides, as for a learner.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
# Options the test sets itself, whatever `make lab` says.
OWN_OPTIONS = ("--ServerApp.root_dir=", "--IdentityProvider.token=", "--ip=", "--port=")


def make_lab_options() -> list[str]:
    """The options `make lab` gives `jupyter lab` (--LabApp.default_url=..., ...), from `make -n lab`."""
    if shutil.which("make") is None:
        missing("make is not installed; the test starts JupyterLab as `make lab` does")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "JUPYTER_TOKEN")}
    # -o: never rebuild .venv here, whatever its stamps say; only print the command.
    result = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "-o", ".venv/share/jupyter/lab/settings/overrides.json",
         "lab", "JUPYTER_TOKEN=unused"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, f"make -n lab failed:\n{result.stdout}{result.stderr}"
    command = next((line for line in result.stdout.replace("\\\n", " ").splitlines() if " lab " in line), "")
    assert "jupyter lab" in command, f"make -n lab printed no `jupyter lab` command:\n{result.stdout}"
    options = re.findall(r"--(?:ServerApp|LabApp|IdentityProvider)\.[\w.]+=[^\s'\"]+", command)
    return [o for o in options if not o.startswith(OWN_OPTIONS)]


@dataclass
class Lab:
    url: str  # http://127.0.0.1:PORT
    token: str
    root: Path  # the server's root_dir (a temporary folder)
    log: Path
    process: subprocess.Popen

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def api(self, path: str, method: str = "GET", timeout: float = 5) -> int:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status

    def get_json(self, path: str, timeout: float = 10):
        request = urllib.request.Request(f"{self.url}{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())


def _stop(lab: Lab) -> None:
    """Shut the server (and its kernels) down; always leaves no process behind."""
    if lab.process.poll() is None:
        try:
            lab.api("/api/shutdown", method="POST")
        except (OSError, urllib.error.URLError):
            lab.process.terminate()
        try:
            lab.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            lab.process.terminate()
            try:
                lab.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    # The server ran in a session of its own: whatever it started (kernels) goes with it.
    try:
        os.killpg(lab.process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if lab.process.poll() is None:
        lab.process.wait(timeout=5)


def _copy_without_outputs(source: Path, target: Path) -> None:
    """Copy a notebook with its outputs and execution counts cleared, so that everything
    the browser shows afterwards comes from the run under test, not from the file."""
    notebook = json.loads(source.read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    target.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab on loopback, serving a temporary folder that holds a copy of chapter 01."""
    if not NOTEBOOK.is_file():
        pytest.fail(f"the notebook under test is missing: {NOTEBOOK}", pytrace=False)
    installed = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    if not installed.is_file() or installed.read_bytes() != OVERRIDES.read_bytes():
        pytest.fail(f"{installed} is missing or differs from {OVERRIDES.relative_to(ROOT)}: `make lab` "
                    "(and `make test`) install it; run `make setup`", pytrace=False)
    options = make_lab_options()
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    (root / "chapters").mkdir(parents=True)
    _copy_without_outputs(NOTEBOOK, root / NOTEBOOK.relative_to(ROOT))
    shutil.copy(LANDING, root / LANDING.name)
    settings = base / "settings"
    for name, values in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(values))
    env = dict(
        os.environ,
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        IPYTHONDIR=str(base / "ipython"),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        PYTHONUNBUFFERED="1",
    )
    log = base / "jupyter.log"
    process, url, token = start_lab(root, options, env, log)
    server = Lab(url=url, token=token, root=root, log=log, process=process)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(f"JupyterLab exited with code {process.returncode} before answering.\n"
                            f"$ {' '.join(process.args)}\n--- server log ---\n{server.log_tail()}", pytrace=False)
            try:
                if server.api("/api/status", timeout=2) == 200:
                    break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer on {server.url} within {SERVER_START_TIMEOUT} s.\n"
                            f"--- server log ---\n{server.log_tail()}", pytrace=False)
            time.sleep(0.25)
        yield server
    finally:
        _stop(server)


def _code_cells(notebook: Path) -> list[dict]:
    return [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]


def _stored_images(cells: list[dict]) -> int:
    return sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))


# Runs in the page: the state of every code cell, in order, with the images it shows.
CELL_STATE_JS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell')).map(cell => ({
    prompt: (cell.querySelector('.jp-InputArea-prompt') || {}).textContent || '',
    empty: (cell.querySelector('.jp-InputArea-editor .cm-content') || {}).textContent === '',
    images: Array.from(cell.querySelectorAll('.jp-OutputArea-output img')).map(
        img => ({complete: img.complete, width: img.naturalWidth, height: img.naturalHeight})),
}))"""
# The status bar's kernel item reads "Python 3 (ipykernel) | Idle" once the kernel is up
# (the toolbar's indicator already says idle while there is "No Kernel").
KERNEL_IDLE_JS = """() => Array.from(document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem'))
    .some(e => /^(?!No Kernel).+ \\| Idle$/.test(e.textContent.trim()))"""
DIALOG_JS = """() => Array.from(document.querySelectorAll('.jp-Dialog')).map(d => d.innerText)"""
# Errors (tracebacks) and warnings: JupyterLab renders both with this MIME type.
STDERR_SELECTOR = '.jp-Notebook .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
STDERR_JS = f"""() => Array.from(document.querySelectorAll('{STDERR_SELECTOR}')).map(o => o.innerText)"""


def run_in_lab(lab: Lab, sync_playwright, name: str, screenshot: Path) -> dict:
    """Open ``name`` (in ``lab.root``) in Chromium, run every cell from the Run menu and
    report what the page shows. Saves ``screenshot``, also when something fails."""
    code = _code_cells(lab.root / name)
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport=VIEWPORT)
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        step = "opening the notebook"
        try:
            page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}", timeout=60_000)
            page.locator(".jp-Notebook .jp-CodeCell").first.wait_for(timeout=60_000)
            step = "waiting for the kernel to start"
            page.wait_for_function(KERNEL_IDLE_JS, timeout=60_000, polling=250)

            step = "Run → Run All Cells"
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.locator("#jp-mainmenu-run .lm-Menu-item",
                         has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$"))).click()

            step = "waiting for every cell to run"
            # Done when the kernel is idle, no cell is queued or running ("[*]:"), and every
            # cell has its number, or an error stopped the run (the assertions tell which).
            page.wait_for_function(
                f"""() => {{
                    const cells = ({CELL_STATE_JS})();
                    const ran = cells.length === {len(code)}
                        && cells.every(c => c.empty || /^\\[\\d+\\]:$/.test(c.prompt.trim()));
                    const stopped = ({STDERR_JS})().length > 0
                        && !cells.some(c => c.prompt.includes('*'));
                    return (ran || stopped) && ({KERNEL_IDLE_JS})();
                }}""",
                timeout=RUN_ALL_TIMEOUT * 1000, polling=250,
            )
            step = "waiting for the images to load"
            page.wait_for_function(f"() => ({CELL_STATE_JS})().every(c => c.images.every(i => i.complete))",
                                   timeout=10_000)
            cells = page.evaluate(CELL_STATE_JS)
            step = "taking the screenshot"
            # The screenshot shows the first error if there is one, else the first attention
            # map (a cell that calls plot_attention), else the first figure.
            errors = page.locator(STDERR_SELECTOR)
            maps = [i for i, c in enumerate(code) if "plot_attention(" in "".join(c["source"])]
            drawn = [i for i in maps + list(range(len(cells))) if i < len(cells) and cells[i]["images"]]
            if errors.count():
                errors.first.scroll_into_view_if_needed(timeout=5_000)
            elif drawn:
                cell = page.locator(".jp-Notebook .jp-CodeCell").nth(drawn[0])
                cell.locator(".jp-OutputArea-output img").last.scroll_into_view_if_needed(timeout=5_000)
            page.wait_for_timeout(300)
            page.screenshot(path=str(screenshot))
            return {"cells": cells, "stderr": page.evaluate(STDERR_JS), "console": console}
        except Exception as error:  # say where it stopped, with what the server and the page said
            failed = screenshot.with_name(screenshot.stem + "_failed.png")
            try:
                page.screenshot(path=str(failed))
            except Exception:  # noqa: BLE001 - the page may be gone
                failed = None
            state = ""
            try:
                state = (f"cell prompts: {[c['prompt'] for c in page.evaluate(CELL_STATE_JS)]}\n"
                         f"stderr outputs: {page.evaluate(STDERR_JS)}\n"
                         f"open dialogs: {page.evaluate(DIALOG_JS)}\n")
            except Exception:  # noqa: BLE001
                pass
            pytest.fail(
                f"the browser test failed while {step}: {type(error).__name__}: {error}\n{state}"
                f"screenshot: {failed}\nbrowser console errors: {console[-10:]}\n"
                f"--- JupyterLab server log (last lines) ---\n{lab.log_tail()}",
                pytrace=False,
            )
        finally:
            browser.close()


NEWS_QUESTION = "official Jupyter news"


def test_make_lab_opens_on_the_landing_page_without_the_news_question(sync_playwright, lab: Lab) -> None:
    """What a learner sees first: the README, rendered, with the chapter table; no news pop-up."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "landing.png"
    screenshot.unlink(missing_ok=True)
    # The course's settings: the overrides replace the defaults of JupyterLab's own schemas.
    notification = lab.get_json("/lab/api/settings/@jupyterlab/apputils-extension:notification")
    fetch_news = notification["schema"]["properties"]["fetchNews"]["default"]
    assert fetch_news == "false", (f"JupyterLab would ask about news (fetchNews defaults to {fetch_news!r}): "
                                   f"the overrides in {OVERRIDES.relative_to(ROOT)} did not apply")
    chapters = [f"chapters/{p.name}" for p in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))]
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport=VIEWPORT)
        console: list[str] = []
        page.on("pageerror", lambda e: console.append(f"page error: {e}"))
        try:
            # The address `make lab` prints is the server's root plus its default_url; the
            # root redirects there, so this is what a learner's first click opens.
            page.goto(f"{lab.url}/?token={lab.token}", timeout=60_000)
            viewer = page.locator(".jp-MarkdownViewer .jp-RenderedMarkdown")
            viewer.first.wait_for(timeout=60_000)
            assert "/lab/tree/README.md" in page.url, f"JupyterLab opened {page.url}, not the README"
            title = viewer.first.locator("h1").first.inner_text()
            assert "multi-head attention" in title.lower(), f"the landing page's title is {title!r}"
            # JupyterLab rewrites a relative link to its /files/ address and opens it itself.
            hrefs = viewer.first.locator("a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
            links = {m.group(0) for h in hrefs if (m := re.search(r"chapters/\d\d_\w+\.ipynb", h or ""))}
            missing_links = [c for c in chapters if c not in links]
            assert not missing_links, f"the landing page's chapter table has no link to {missing_links}"
            assert page.locator(".jp-FileEditor").count() == 0, "README.md opened in the text editor, not rendered"
            page.wait_for_timeout(500)
            page.screenshot(path=str(screenshot))
            # The question pops up once the app is restored and the settings are loaded; the
            # notebook opened below proves that has happened.
            viewer.first.locator("a[href*='chapters/01_dot_product_attention.ipynb']").first.click()
            page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current").first.inner_text()
            assert "01_dot_product_attention.ipynb" in tab, f"the chapter table's link opened {tab!r}"
            page.wait_for_timeout(1_000)
            toasts = page.locator(".Toastify__toast").all_inner_texts()
        finally:
            browser.close()
            for session in lab.get_json("/api/sessions"):  # the next test starts from a fresh kernel
                lab.api(f"/api/sessions/{session['id']}", method="DELETE")
    assert not [t for t in toasts if NEWS_QUESTION in t], f"JupyterLab asked about news: {toasts}"
    assert not console, f"errors in the page: {console}"
    assert screenshot.stat().st_size > 10_000, f"the screenshot {screenshot} looks empty"


def test_chapter_01_runs_in_jupyterlab(sync_playwright, lab: Lab) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / f"{NOTEBOOK.stem}.png"
    for old in (screenshot, screenshot.with_name(screenshot.stem + "_failed.png")):
        old.unlink(missing_ok=True)
    before = NOTEBOOK.read_bytes()

    seen = run_in_lab(lab, sync_playwright, NOTEBOOK.relative_to(ROOT).as_posix(), screenshot)

    assert not seen["stderr"], (
        "cells showed errors or warnings (stderr) in JupyterLab:\n" + "\n---\n".join(seen["stderr"])
    )
    prompts = [c["prompt"].strip() for c in seen["cells"] if not c["empty"]]
    expected = [f"[{i}]:" for i in range(1, len(prompts) + 1)]
    assert prompts == expected, f"cells did not run once each, top to bottom: {prompts}"
    code = _code_cells(NOTEBOOK)
    drawn = [[i for i in c["images"] if i["width"] > 0 and i["height"] > 0] for c in seen["cells"]]
    maps = [n for n, c in enumerate(code) if "plot_attention(" in "".join(c["source"])]
    assert maps, f"{NOTEBOOK.name} has no cell that calls plot_attention; the test expects attention maps"
    missing = [n + 1 for n in maps if not drawn[n]]
    assert not missing, f"code cells {missing} call plot_attention, but show no image with a size in JupyterLab"
    images = [i for c in seen["cells"] for i in c["images"]]
    assert sum(map(len, drawn)) == _stored_images(code), (
        f"expected the {_stored_images(code)} figures that {NOTEBOOK.name} stores to be drawn; "
        f"JupyterLab shows {len(images)} images: {images}"
    )
    assert screenshot.stat().st_size > 10_000, f"the screenshot {screenshot} looks empty"
    assert NOTEBOOK.read_bytes() == before, f"{NOTEBOOK} was modified; the test must work on a copy"

