"""Chapter 01 in a real browser: JupyterLab, headless Chromium, Run → Run All Cells.

nbval proves that the notebook's code runs; this test proves what a learner sees: the
notebook opens in JupyterLab, every cell runs from the menu, no cell shows an error or a
warning, and the attention maps are drawn. It works on a temporary copy of the chapter
(the committed notebook is never touched) and saves a screenshot under ``artifacts/``.

It needs Playwright's Python package (in requirements.txt) and a Chromium on the machine:
Debian's ``chromium`` package (``apt-get install chromium``) at ``/usr/bin/chromium``, or
the one named by ``MHA_CHROMIUM``. Playwright's own browser download is never used. The
test skips, saying why, when either is missing, unless ``MHA_REQUIRE_BROWSER=1`` (set by
CI), where it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "chapters" / "01_dot_product_attention.ipynb"
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = Path(os.environ.get("MHA_CHROMIUM") or "/usr/bin/chromium")
# --no-sandbox: Chromium's sandbox refuses to run as root (and inside most containers).
CHROMIUM_ARGS = [
    "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage",
    "--disable-gpu", "--disable-quic", "--disable-sync", "--no-first-run",
]
VIEWPORT = {"width": 1440, "height": 1000}
SERVER_START_TIMEOUT = 60  # s, until the server answers
RUN_ALL_TIMEOUT = 120  # s, from Run All Cells until the kernel is idle with every cell run
# JupyterLab settings for the test's own settings folder: render every cell (no windowing,
# so the DOM holds the whole notebook) and keep news and update checks (network) off.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False,
    },
}


def _missing(reason: str) -> None:
    if os.environ.get("MHA_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (MHA_REQUIRE_BROWSER=1, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright's Python package is not installed (pip install -r requirements.txt)")
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        _missing(f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium) "
                 "or set MHA_CHROMIUM to a Chromium binary")
    return sync_playwright


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    root.mkdir()
    _copy_without_outputs(NOTEBOOK, root / NOTEBOOK.name)
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
    port, token = _free_port(), os.urandom(16).hex()
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = base / "jupyter.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    server = Lab(url=f"http://127.0.0.1:{port}", token=token, root=root, log=log, process=process)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(f"JupyterLab exited with code {process.returncode} before answering.\n"
                            f"$ {' '.join(command)}\n--- server log ---\n{server.log_tail()}", pytrace=False)
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
        launch_args = CHROMIUM_ARGS + (["--no-sandbox"] if os.geteuid() == 0 else [])
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=launch_args)
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


def test_chapter_01_runs_in_jupyterlab(sync_playwright, lab: Lab) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / f"{NOTEBOOK.stem}.png"
    for old in (screenshot, screenshot.with_name(screenshot.stem + "_failed.png")):
        old.unlink(missing_ok=True)
    before = NOTEBOOK.read_bytes()

    seen = run_in_lab(lab, sync_playwright, NOTEBOOK.name, screenshot)

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
