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
    apt = [options(c.argv[i + 2:], set()) for c in ci_run for i in range(len(c.argv) - 1)
           if c.argv[i:i + 2] == ["apt-get", "install"]]
    assert any("chromium" in packages for _, packages in apt), ".ci/run must install Debian's chromium"
    assert all({"-y", "--yes", "--assume-yes"} & set(flags) for flags, _ in apt), "apt-get must not ask"
    assert all(c.argv[0] == "as_root" for c in ci_run if {"update", "install"} & set(c.argv) and "apt-get" in c.argv), (
        "apt-get runs through as_root: directly as root, with sudo otherwise"
    )
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


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_lists_every_target():
    makefile = (ROOT / "Makefile").read_text()
    (phony,) = re.findall(r"^\.PHONY:(.*)$", makefile, flags=re.MULTILINE)
    rules = set(re.findall(r"^([a-z][\w-]*):(?!=)", makefile, flags=re.MULTILINE))
    assert set(phony.split()) == rules, "every rule is .PHONY and every .PHONY name a rule"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    shown = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, env=env, capture_output=True,
                           text=True, check=True).stdout
    listed = {line.split()[1] for line in shown.splitlines() if line.startswith("make ")}
    assert listed == rules, f"make help misses {sorted(rules - listed)}, or lists what isn't a target {sorted(listed - rules)}"


FAKES = {  # stand-ins that .ci/run finds on PATH; each writes what it was asked to do to $LOG
    "make": 'echo "make $* MHA_CHROMIUM=$MHA_CHROMIUM MHA_REQUIRE_BROWSER=$MHA_REQUIRE_BROWSER" >> "$LOG"',
    "sudo": 'echo "sudo $*" >> "$LOG"; exec "$@"',
    "apt-get": 'echo "apt-get $*" >> "$LOG"\n'
               'if [ "$1" = install ]; then printf "#!/bin/sh\\n" > "$BIN/chromium"; chmod +x "$BIN/chromium"; fi',
}


def run_ci(tmp_path: Path, uid: int, have: set[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """.ci/run with a PATH of its own: the real bash, env, dirname and chmod, `id -u` saying ``uid``, and
    the fakes in ``have`` (``chromium`` too, an empty script): nothing is installed, no test runs."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    for tool in ("bash", "env", "dirname", "chmod"):
        (bin_ / tool).symlink_to(shutil.which(tool))
    scripts = {**FAKES, "id": f"echo {uid}", "chromium": ""}
    for name in have | {"make", "id"}:
        (bin_ / name).write_text(f"#!/bin/sh\n{scripts[name]}\n")
        (bin_ / name).chmod(0o755)
    log = tmp_path / "log"
    log.touch()
    base = {"PATH": str(bin_), "LOG": str(log), "BIN": str(bin_), "HOME": str(tmp_path)}
    result = subprocess.run([str(bin_ / "bash"), str(ROOT / ".ci" / "run")], env={**base, **(env or {})},
                            capture_output=True, text=True, timeout=60)
    return result, log.read_text().splitlines()


@pytest.mark.skipif(not all(map(shutil.which, ("bash", "env", "dirname", "chmod"))), reason="needs bash and coreutils")
def test_ci_run_finds_chromium_and_installs_it_only_when_missing(tmp_path):
    def make_test(case: str) -> str:  # what the fake make logs: the tests run with this case's chromium
        return f"make test MHA_CHROMIUM={tmp_path / case / 'bin' / 'chromium'} MHA_REQUIRE_BROWSER=1"

    # A maintainer who is not root, with Chromium on PATH: nothing to install, no sudo.
    result, log = run_ci(tmp_path / "on-path", 1000, {"chromium", "sudo", "apt-get"})
    assert result.returncode == 0 and log == [make_test("on-path")], result.stderr
    # Not root and no Chromium: installed through sudo, then the tests use it.
    result, log = run_ci(tmp_path / "sudo", 1000, {"sudo", "apt-get"})
    assert result.returncode == 0, result.stderr
    assert log == ["sudo apt-get update -qq", "apt-get update -qq",
                   "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium",
                   "apt-get install -y -qq chromium", make_test("sudo")]
    # Root (CI's containers): apt-get directly.
    result, log = run_ci(tmp_path / "root", 0, {"apt-get"})
    assert result.returncode == 0, result.stderr
    assert log == ["apt-get update -qq", "apt-get install -y -qq chromium", make_test("root")]
    # Not root, no sudo: a message that says what to do, and no test run.
    result, log = run_ci(tmp_path / "no-sudo", 1000, {"apt-get"})
    assert result.returncode == 1 and log == [], result.stderr
    assert ".ci/run: no Chromium on PATH; not root and no sudo: install it" in result.stderr
    assert "set MHA_CHROMIUM to a Chromium binary" in result.stderr
    # MHA_CHROMIUM names the browser, and must be one.
    result, log = run_ci(tmp_path / "named", 1000, set(), env={"MHA_CHROMIUM": "/no/such/chromium"})
    assert result.returncode == 1 and log == [], result.stderr
    assert ".ci/run: MHA_CHROMIUM=/no/such/chromium is not an executable file" in result.stderr
