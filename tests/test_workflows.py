"""The CI workflows: actionlint passes, and they run what the README says they run.

- ``ci.yml``: ``make test`` (via ``.ci/run``) on CPU for Python 3.11 and a newer one, with
  the browser test required and its screenshot uploaded; the library tests and notebooks
  on the oldest PyTorch that ``pyproject.toml`` allows.
- ``gpu.yml``: ``make test-gpu`` with ``MHA_DEVICE=cuda`` on the self-hosted runner
  labelled ``gpu``, never for pull requests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # PyYAML comes with jupyterlab (jupyter-events needs it)

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as the boolean True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def runs(job: dict) -> str:
    """Every shell command of a job, one block after the other."""
    return "\n".join(step.get("run", "") for step in job["steps"])


def uses(job: dict, action: str) -> list[dict]:
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def torch_floor() -> str:
    """The lowest torch that pyproject.toml allows, e.g. "2.5"."""
    match = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject.toml must give torch a lower bound, e.g. torch>=2.5"
    return match.group(1)


def test_actionlint_passes():
    binary = Path(sys.executable).with_name("actionlint")
    command = str(binary) if binary.exists() else shutil.which("actionlint")
    assert command, "actionlint is not installed; `pip install -r requirements.txt` installs it"
    files = sorted(str(p.relative_to(ROOT)) for p in WORKFLOWS.glob("*.y*ml"))
    assert {"ci.yml", "gpu.yml"} <= {Path(f).name for f in files}
    # The config (the self-hosted runner's `gpu` label) is named explicitly: actionlint only
    # finds it by itself inside a git checkout.
    config = ROOT / ".github" / "actionlint.yaml"
    result = subprocess.run([command, "-no-color", "-oneline", "-config-file", str(config), *files],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"actionlint found problems:\n{result.stdout}{result.stderr}"


def test_cpu_job_runs_make_test_on_two_pythons_with_the_browser():
    job = load("ci.yml")["jobs"]["test"]
    assert ".ci/run" in runs(job)
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci_run, re.M), ".ci/run must run `make test`"
    assert "apt-get install -y" in ci_run and "chromium" in ci_run
    pythons = [str(p) for p in job["strategy"]["matrix"]["python"]]
    assert "3.11" in pythons
    oldest = re.search(r'requires-python = ">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert oldest in pythons, f"the oldest Python pyproject.toml allows ({oldest}) is not tested: {pythons}"
    assert any(tuple(map(int, p.split("."))) > (3, 11) for p in pythons), f"no Python newer than 3.11: {pythons}"
    assert job["env"]["MHA_REQUIRE_BROWSER"] == "1", "a missing browser must fail CI, not skip"
    assert "--index-url" in runs(job) and "whl/cpu" in load("ci.yml")["env"]["TORCH_CPU_INDEX"]


def test_cpu_job_caches_pip_and_uploads_the_screenshot():
    job = load("ci.yml")["jobs"]["test"]
    (cache,) = uses(job, "actions/cache")
    assert "hashFiles('requirements.txt')" in cache["with"]["key"]
    (upload,) = uses(job, "actions/upload-artifact")
    assert upload["with"]["path"].startswith("artifacts")
    assert upload.get("if") == "always()", "the screenshot matters most when the test failed"
    assert "artifacts/" in (ROOT / ".gitignore").read_text().split()


def test_oldest_torch_job_matches_pyproject_and_readme():
    floor = torch_floor()
    job = load("ci.yml")["jobs"]["oldest-torch"]
    (oldest,) = job["strategy"]["matrix"]["torch"]
    assert oldest.startswith(floor + "."), f"the job tests torch {oldest}, pyproject.toml says torch>={floor}"
    script = runs(job)
    assert 'pip install "torch==${TORCH_VERSION}"' in script
    assert "requirements-without-torch" in script and "-c /tmp/keep-torch.txt" in script
    assert re.search(r'pytest .*-m "not browser" tests$', script, re.M), "the library tests must run"
    assert re.search(r"pytest .*--nbval-lax chapters exercises solutions$", script, re.M), "and every notebook"
    readme = (ROOT / "README.md").read_text()
    assert f"PyTorch {floor}" in readme, f"the README must state the supported range from PyTorch {floor}"


def test_gpu_job_runs_make_test_gpu_on_the_self_hosted_runner():
    workflow = load("gpu.yml")
    job = workflow["jobs"]["gpu"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert job["env"]["MHA_DEVICE"] == "cuda"
    assert re.search(r"^make test-gpu\b", runs(job), re.M)
    triggers = set(workflow["on"])
    assert not triggers & {"pull_request", "pull_request_target"}, (
        "a self-hosted runner must not run code from pull requests"
    )
    assert "gpu" in yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("device", [None, "cpu"])
def test_make_test_gpu_runs_tests_and_lax_notebooks_on_the_device(device: str | None):
    command = ["make", "-n", "test-gpu"] + ([f"MHA_DEVICE={device}"] if device else [])
    # Not what this run got: MHA_DEVICE from the environment, variables from a calling make.
    env = {k: v for k, v in os.environ.items() if k not in ("MHA_DEVICE", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    expected = device or "cuda"
    pytest_lines = [line for line in lines if "-m pytest" in line]
    assert len(pytest_lines) == 2, lines
    library, notebooks = pytest_lines
    assert all(line.startswith(f"MHA_DEVICE={expected} ") for line in pytest_lines), pytest_lines
    assert '-m "not browser" tests' in library
    assert "--nbval-lax chapters exercises solutions" in notebooks
    assert any("get_device()" in line and line.startswith(f"MHA_DEVICE={expected} ") for line in lines), (
        "make test-gpu must first check that the device exists"
    )
