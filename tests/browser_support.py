"""Headless Chromium for the browser tests (test_browser.py: JupyterLab; test_book.py: the web book).

They use the browser named by ``MHA_CHROMIUM``, else ``chromium`` on PATH (Debian's package,
``apt-get install chromium``, puts it at ``/usr/bin/chromium``), driven by Playwright's Python
package (requirements-dev.txt); Playwright's own browser download is never used. ``.ci/run``
looks for it the same way and installs Debian's package when there is none. Without a
browser the tests skip, saying why, unless ``MHA_REQUIRE_BROWSER=1`` (set by CI), where they fail.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("MHA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium")
# --no-sandbox (added for root): Chromium's sandbox refuses to run as root (and inside most
# containers). --disable-background-networking and the rest: no request leaves the machine
# except the pages under test.
CHROMIUM_ARGS = [
    "--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage",
    "--disable-gpu", "--disable-quic", "--disable-sync", "--no-first-run",
]
VIEWPORT = {"width": 1440, "height": 1000}


def missing(reason: str) -> None:
    """Skip, or fail when CI requires the browser tests to run."""
    if os.environ.get("MHA_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason} (MHA_REQUIRE_BROWSER=1, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def sync_playwright():
    """Playwright's ``sync_playwright``, once the package and Chromium are known to be there."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("Playwright's Python package is not installed (pip install -r requirements-dev.txt)")
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        missing(f"no Chromium at {CHROMIUM} (MHA_CHROMIUM, else chromium on PATH): install Debian's package "
                "(apt-get install chromium) or set MHA_CHROMIUM to a Chromium binary")
    return sync_playwright


def launch(playwright):
    """A headless Chromium (close it when done)."""
    args = CHROMIUM_ARGS + (["--no-sandbox"] if os.geteuid() == 0 else [])
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=args)


def start_lab(root: Path, options: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str, str]:
    """Start ``jupyter lab`` on a free loopback port with ``options`` (those of ``make lab``),
    serving ``root``, its output in ``log``; returns ``(process, url, token)``. The caller waits
    for it to answer and stops it (the process leads its own session: ``os.killpg`` reaches it all)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = os.urandom(16).hex()
    command = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", *options,
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return process, f"http://127.0.0.1:{port}", token
