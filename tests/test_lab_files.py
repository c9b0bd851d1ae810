"""JupyterLab as `make lab` starts it: each notebook listed once, no build output, /lab on the README.

The server runs with every option of the ``jupyter lab`` command that ``make -n lab`` prints
(``--ContentsManager.hide_globs=...``, ``--LabApp.default_url=...``; port, token and root are
the test's own) and the course's seeded layout (``.jupyterlab/default.jupyterlab-workspace``,
which ``make lab`` installs as the default workspace), on a temporary folder shaped like the
course: a chapter and its paired ``.py``, ``build/``, ``mha_lib.egg-info/``, ``__pycache__``
and ``mha_lib``'s own modules, which must stay visible.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from browser_support import start_lab

ROOT = Path(__file__).resolve().parent.parent
WORKSPACE = ROOT / ".jupyterlab" / "default.jupyterlab-workspace"
OWN = ("--ServerApp.root_dir=", "--IdentityProvider.token=", "--ip=", "--port=")


def lab_options() -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "JUPYTER_TOKEN")}
    result = subprocess.run(
        ["make", "-n", "-B", "-o", ".venv/.installed", "-o", ".venv/share/jupyter/lab/settings/overrides.json",
         "-o", ".venv/share/jupyter/lab/workspaces/default-37a8.jupyterlab-workspace", "lab"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    command = next(line for line in result.stdout.replace("\\\n", " ").splitlines() if "jupyter lab" in line)
    assert "JUPYTERLAB_WORKSPACES_DIR=" in command, "make lab should keep the course's layout in .venv"
    words = shlex.split(command[command.index("jupyter lab"):])
    return [w for w in words if re.match(r"--\w+\.\w+=", w) and not w.startswith(OWN)]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("labfiles")
    root = base / "root"
    for name in ("chapters/01_x.ipynb", "chapters/01_x.py", "solutions/01_x.py", "mha_lib/attention.py",
                 "mha_lib/__init__.py", "tools/build_notebooks.py", "build/book/index.html",
                 "mha_lib.egg-info/PKG-INFO", "mha_lib/__pycache__/attention.cpython-311.pyc",
                 "workspace/01_x.ipynb", "workspace/01_x.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
                                 if name.endswith(".ipynb") else "# x\n")
    shutil.copy(ROOT / "README.md", root / "README.md")
    workspaces = base / "workspaces"
    workspaces.mkdir()
    shutil.copy(WORKSPACE, workspaces / "default-37a8.jupyterlab-workspace")
    env = dict(os.environ, JUPYTERLAB_WORKSPACES_DIR=str(workspaces), JUPYTER_RUNTIME_DIR=str(base / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(base / "settings"))
    log = base / "jupyter.log"
    process, url, token = start_lab(root, lab_options(), env, log)

    def get(path: str):
        request = urllib.request.Request(url + path, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"JupyterLab exited:\n{log.read_text(errors='replace')[-3000:]}"
            try:
                get("/api/status")
                break
            except OSError:
                assert time.monotonic() < deadline, f"no answer:\n{log.read_text(errors='replace')[-3000:]}"
                time.sleep(0.25)
        yield {"url": url, "token": token, "get": get}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


def names(lab, path: str) -> set[str]:
    return {entry["name"] for entry in lab["get"](f"/api/contents/{path}?content=1")["content"]}


def test_the_file_browser_lists_each_notebook_once_and_no_build_output(lab):
    assert names(lab, "") >= {"README.md", "chapters", "mha_lib", "tools", "workspace"}
    assert not names(lab, "") & {"build", "mha_lib.egg-info"}, names(lab, "")
    assert names(lab, "chapters") == {"01_x.ipynb"}
    assert names(lab, "solutions") == set()
    assert names(lab, "workspace") == {"01_x.ipynb"}
    assert names(lab, "mha_lib") == {"attention.py", "__init__.py"}, "the library's modules must stay visible"
    assert names(lab, "tools") == {"build_notebooks.py"}
    # Hidden from the listing only: the paired script still opens.
    assert lab["get"]("/api/contents/chapters/01_x.py?content=0")["name"] == "01_x.py"


def test_lab_opens_on_the_readme(lab):
    layout = lab["get"]("/lab/api/workspaces/default")["data"]
    main = layout["layout-restorer:data"]["main"]["dock"]["widgets"]
    assert main == ["markdownviewer-widget:README.md"], main
    assert layout["markdownviewer-widget:README.md"]["data"] == {"path": "README.md", "factory": "Markdown Preview"}


@pytest.mark.browser
def test_lab_shows_the_readme_in_a_browser(lab):
    from browser_support import CHROMIUM, launch, missing

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("Playwright's Python package is not installed")
    if not CHROMIUM.is_file():
        missing(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page()
            page.goto(f"{lab['url']}/lab?token={lab['token']}", timeout=60_000)
            title = page.locator(".jp-MarkdownViewer .jp-RenderedMarkdown h1").first
            title.wait_for(timeout=60_000)
            assert "multi-head attention" in title.inner_text().lower()
            assert page.locator(".jp-Launcher").count() == 0, "/lab opened the Launcher"
            page.locator(".jp-DirListing-content").get_by_text("chapters", exact=True).first.dblclick(timeout=30_000)
            page.locator(".jp-DirListing-item", has_text="01_x.ipynb").first.wait_for(timeout=30_000)
            shown = [t.strip() for t in page.locator(".jp-DirListing-content .jp-DirListing-itemText").all_inner_texts()]
        finally:
            browser.close()
    assert shown == ["01_x.ipynb"], shown
