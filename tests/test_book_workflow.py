"""What CI does with the web book: ci.yml builds it and uploads it; pages.yml publishes it.

(actionlint runs on every workflow file, pages.yml included, in tests/test_workflows.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml  # PyYAML comes with jupyterlab (jupyter-events needs it)

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads `on` as True
    return workflow


def steps_using(job: dict, action: str) -> list[dict]:
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_ci_builds_the_book_and_uploads_it():
    job = load("ci.yml")["jobs"]["book"]
    (build,) = [s for s in job["steps"] if "book/build.py" in s.get("run", "")]
    assert re.search(r"pip install -r requirements-dev\.txt$", build["run"], re.M)
    out = re.search(r"book/build\.py --out (\S+)", build["run"]).group(1)
    (upload,) = steps_using(job, "actions/upload-artifact")
    assert upload["with"]["path"].rstrip("/") == out, f"the uploaded artifact is not the book ({out})"
    assert upload["with"]["if-no-files-found"] == "error"
    assert job["steps"].index(upload) > job["steps"].index(build)


def test_pages_publishes_the_book_from_main_only():
    workflow = load("pages.yml")
    assert set(workflow["on"]) <= {"push", "workflow_dispatch"}, "Pages deploys from main, never from pull requests"
    assert workflow["on"]["push"]["branches"] == ["main"]
    assert workflow["permissions"] == {"contents": "read"}, "the workflow's default token stays read-only"
    assert workflow["concurrency"]["group"] and workflow["concurrency"]["cancel-in-progress"] is False

    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    assert re.search(r"pip install -r requirements-dev\.txt$", runs(build), re.M)
    (book,) = [s for s in build["steps"] if "book/build.py" in s.get("run", "")]
    out = re.search(r"--out (\S+)", book["run"]).group(1)
    assert book["env"]["MHA_REPOSITORY_URL"] == "${{ github.server_url }}/${{ github.repository }}", (
        "the published book's Colab links must point at the repository it is published from")
    assert "--require-repository" in book["run"], "Pages must refuse to publish a book without its repository"
    # Every package the book needs comes from requirements-dev.txt (sphinx-copybutton included), pinned.
    assert not re.search(r"pip install (?!-r requirements-dev\.txt$)", runs(build), re.M), runs(build)
    (upload,) = steps_using(build, "actions/upload-pages-artifact")
    assert upload["with"]["path"] == out, f"the Pages artifact ({upload['with']['path']}) is not the book ({out})"

    assert deploy["needs"] == "build"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["environment"]["name"] == "github-pages"
    (deployment,) = steps_using(deploy, "actions/deploy-pages")
    assert deploy["environment"]["url"] == f"${{{{ steps.{deployment['id']}.outputs.page_url }}}}"


def test_the_book_needs_no_torch_to_build():
    """pages.yml installs only requirements-dev.txt: book/ must not import mha_lib or torch."""
    for source in (ROOT / "book").glob("*.py"):
        text = source.read_text()
        assert not re.search(r"^\s*(import|from)\s+(torch|mha_lib)\b", text, re.M), f"{source.name} imports it"
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert not re.search(r"^torch\b", dev, re.M) and "-r requirements.txt" not in dev
    for package in ("sphinx", "myst-nb", "sphinx-book-theme", "sphinx-mathjax-offline", "sphinx-copybutton"):
        assert re.search(rf"^{package}==", dev, re.M), f"requirements-dev.txt must pin {package}"
