"""The CI workflows: actionlint passes, and they run what the README says they run.

The checks read what a workflow does: its jobs, their matrix and environment, and the
commands of their shell steps, parsed into argument lists (``commands``), so that rewording a
step or reordering a command's flags does not break them, and a command that stops doing its
job does.

- ``ci.yml``: ``make test`` (via ``.ci/run``) on CPU for Python 3.11 and a newer one, with
  the browser test required and its screenshot uploaded; the library tests and notebooks
  on the oldest PyTorch that ``pyproject.toml`` allows.
- ``gpu.yml``: ``make test-gpu`` with ``MHA_DEVICE=cuda`` on the self-hosted runner
  labelled ``gpu``, never for pull requests.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

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


class Command(NamedTuple):
    argv: list[str]
    stdout: str | None = None  # the file that `> file` sends the output to


_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!"}
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")"}
_REDIRECTS = {">", ">>", "<", ">&", "<&", "&>"}


def commands(script: str) -> list[Command]:
    """The simple commands of a shell script: lines joined at a trailing backslash, split at
    ``;``, ``&&``, ``||`` and ``|``; comments, shell keywords (if, then, fi, ...) and leading
    ``VAR=value`` assignments dropped; ``> file`` kept apart as ``stdout``."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
        lexer.whitespace_split = True
        argv: list[str] = []
        stdout, redirect = None, None
        for token in [*lexer, ";"]:
            if redirect:
                stdout = token if redirect in (">", ">>") else stdout
                redirect = None
            elif token in _REDIRECTS:
                redirect = token
            elif token in _SEPARATORS:
                if argv:
                    found.append(Command(argv, stdout))
                argv, stdout = [], None
            elif argv or not (token in _KEYWORDS or re.match(r"[A-Za-z_]\w*=", token)):
                argv.append(token)
    return found


def job_commands(job: dict) -> list[Command]:
    return [c for step in job["steps"] for c in commands(step.get("run", ""))]


def options(argv: list[str], with_value: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    """A command's options (name -> values; a flag has one empty value) and its positional arguments."""
    found: dict[str, list[str]] = {}
    positional = []
    words = iter(argv)
    for word in words:
        if word in with_value:
            found.setdefault(word, []).append(next(words))
        elif word.startswith("-"):
            found.setdefault(word, []).append("")
        else:
            positional.append(word)
    return found, positional


def pip_installs(job: dict) -> list[tuple[dict[str, list[str]], list[str]]]:
    """Each `pip install` of a job: its options and the requirements it names."""
    installs = []
    for command in job_commands(job):
        if Path(command.argv[0]).name.startswith("pip") and command.argv[1:2] == ["install"]:
            installs.append(options(command.argv[2:], {"-r", "-c", "-e", "--index-url", "--extra-index-url"}))
    return installs


def pytest_runs(job: dict) -> list[tuple[dict[str, list[str]], list[str]]]:
    """Each `python -m pytest` of a job: its options and the paths it tests."""
    return [options(c.argv[3:], {"-n", "--dist", "-m", "-k", "-p"}) for c in job_commands(job)
            if Path(c.argv[0]).name.startswith("python") and c.argv[1:3] == ["-m", "pytest"]]


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
    workflow = load("ci.yml")
    job = workflow["jobs"]["test"]
    assert [".ci/run"] in [c.argv for c in job_commands(job)]
    ci_run = commands((ROOT / ".ci" / "run").read_text())
    assert ["make", "test"] in [c.argv for c in ci_run], ".ci/run must run `make test`"
    apt = [options(c.argv[2:], set()) for c in ci_run if c.argv[:2] == ["apt-get", "install"]]
    assert any("chromium" in packages for _, packages in apt), ".ci/run must install Debian's chromium"
    assert all({"-y", "--yes", "--assume-yes"} & set(flags) for flags, _ in apt), "apt-get must not ask"
    pythons = [str(p) for p in job["strategy"]["matrix"]["python"]]
    assert "3.11" in pythons
    oldest = re.search(r'requires-python = ">=(\d+\.\d+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert oldest in pythons, f"the oldest Python pyproject.toml allows ({oldest}) is not tested: {pythons}"
    assert any(tuple(map(int, p.split("."))) > (3, 11) for p in pythons), f"no Python newer than 3.11: {pythons}"
    assert job["env"]["MHA_REQUIRE_BROWSER"] == "1", "a missing browser must fail CI, not skip"
    torch_installs = [(opts, reqs) for opts, reqs in pip_installs(job) if any(r.startswith("torch==") for r in reqs)]
    assert torch_installs, "the job must install the pinned torch before `make test` does"
    for opts, _ in torch_installs:  # from PyTorch's CPU index, not PyPI's CUDA build
        assert opts["--index-url"] == ["$TORCH_CPU_INDEX"] and "whl/cpu" in workflow["env"]["TORCH_CPU_INDEX"]


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
    workflow = load("ci.yml")
    job = workflow["jobs"]["oldest-torch"]
    (oldest,) = job["strategy"]["matrix"]["torch"]
    assert oldest.startswith(floor + "."), f"the job tests torch {oldest}, pyproject.toml says torch>={floor}"
    installs = pip_installs(job)
    (torch_install,) = [opts for opts, reqs in installs if reqs == ["torch==${TORCH_VERSION}"]]
    assert torch_install["--index-url"] == ["$TORCH_CPU_INDEX"]
    assert any(step.get("env", {}).get("TORCH_VERSION") == "${{ matrix.torch }}" for step in job["steps"])
    # The other requirements install without torch's pin and may not replace this torch.
    made = {c.stdout: c.argv for c in job_commands(job) if c.stdout}
    (rest,) = [opts for opts, _ in installs if "-c" in opts]
    constraint, *_ = rest["-c"]
    assert made[constraint] == ["echo", "torch==${TORCH_VERSION}"]
    without_torch = [r for r in rest["-r"] if r != "requirements-dev.txt"]
    assert [made[r] for r in without_torch] == [["grep", "-v", "^torch==", "requirements.txt"]]
    library, notebooks = pytest_runs(job)
    assert library[0]["-m"] == ["not browser"] and library[1] == ["tests"], "the library tests must run"
    assert "--nbval-lax" in notebooks[0] and set(notebooks[1]) == {"chapters", "exercises", "solutions"}, (
        "and every notebook"
    )
    readme = (ROOT / "README.md").read_text()
    assert f"PyTorch {floor}" in readme, f"the README must state the supported range from PyTorch {floor}"


def test_commands_parses_what_a_shell_runs():
    script = 'set -e\nif [ ! -x x ]; then\n  A=1 sudo apt-get install \\\n    -y chromium >/dev/null\nfi\ngrep -v a b > c && make test  # done'
    assert commands(script) == [
        Command(["set", "-e"]),
        Command(["[", "!", "-x", "x", "]"]),
        Command(["sudo", "apt-get", "install", "-y", "chromium"], "/dev/null"),
        Command(["grep", "-v", "a", "b"], "c"),
        Command(["make", "test"]),
    ]


def test_gpu_job_runs_make_test_gpu_on_the_self_hosted_runner():
    workflow = load("gpu.yml")
    job = workflow["jobs"]["gpu"]
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert job["env"]["MHA_DEVICE"] == "cuda"
    assert any(c.argv[:2] == ["make", "test-gpu"] for c in job_commands(job))
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
    expected = device or "cuda"
    lines = result.stdout.splitlines()
    pytests = [(line, options(c.argv[3:], {"-n", "--dist", "-m", "-k", "-p"}))
               for line in lines if "-m pytest" in line for c in commands(line) if c.argv[1:3] == ["-m", "pytest"]]
    assert len(pytests) == 2, lines
    (library_line, library), (notebooks_line, notebooks) = pytests
    assert all(line.startswith(f"MHA_DEVICE={expected} ") for line in (library_line, notebooks_line)), lines
    assert library[0]["-m"] == ["not browser"] and library[1] == ["tests"]
    assert "--nbval-lax" in notebooks[0] and notebooks[1] == ["chapters", "exercises", "solutions"]
    assert any("get_device()" in line and line.startswith(f"MHA_DEVICE={expected} ") for line in lines), (
        "make test-gpu must first check that the device exists"
    )
