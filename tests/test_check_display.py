"""How a check's verdict shows in a real kernel, and how a failed check fails CI.

In Jupyter every check call displays its verdict wherever it stands in the cell, exactly
once; ``assert check_x(f)`` carries the verdict; ``if check_x(f):`` still works. Under
nbval (the repository's conftest.py sets MHA_CHECK_RAISE for its kernels) a failed check
raises, so that even ``--nbval-lax`` fails on it, while a stub (⏳) never does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from mha_lib.checks import CHECK_RAISE

ROOT = Path(__file__).resolve().parent.parent

SETUP = """\
import torch
from mha_lib.checks import check_causal_mask

def right(L):
    return torch.ones(L, L, dtype=torch.bool).tril()

def wrong(L):
    return torch.ones(L, L, dtype=torch.bool)

def stub(L):
    raise NotImplementedError

def broken(L):
    return 1 / 0
"""


def notebook(*cells: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def kernel_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (CHECK_RAISE, "MHA_CHECK_LOG")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def verdicts(cell: nbformat.NotebookNode) -> list[str]:
    """The verdicts a cell showed, in order: every display_data and execute_result."""
    shown = [o for o in cell.outputs if o.output_type in ("display_data", "execute_result")]
    assert all("text/html" in o.data for o in shown), cell.outputs
    return [o.data["text/plain"] for o in shown]


def errors(cell: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(o.ename, o.evalue) for o in cell.outputs if o.output_type == "error"]


def streams(cell: nbformat.NotebookNode) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream")


@pytest.fixture(scope="module")
def ran() -> list[nbformat.NotebookNode]:
    nb = notebook(
        SETUP,
        "r = check_causal_mask(wrong)",                                   # 1: assigned
        "check_causal_mask(right)\nx = 1",                                # 2: a line after it
        "check_causal_mask(right)\ncheck_causal_mask(wrong)",             # 3: two checks
        "check_causal_mask(right)",                                       # 4: the cell's value
        "r",                                                              # 5: shown again later
        "assert check_causal_mask(wrong)",                                # 6: assert carries the verdict
        "if check_causal_mask(wrong):\n    print('yes')\nelse:\n    print('no')",  # 7: if still works
        "assert check_causal_mask(right)\nassert not check_causal_mask(wrong)",    # 8: asserts that hold
        "import os\nos.environ['MHA_CHECK_RAISE'] = '1'\ncheck_causal_mask(stub)",  # 9: a stub never raises
        "check_causal_mask(wrong)",                                       # 10: raises under MHA_CHECK_RAISE
        "check_causal_mask(broken)",                                      # 11: so does an error in the code
        "check_causal_mask(right)",                                       # 12: a pass doesn't
    )
    client = NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True, record_timing=False)
    with client.setup_kernel(env=kernel_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    return nb.cells


def test_setup_ran(ran):
    assert not errors(ran[0]) and not ran[0].outputs


@pytest.mark.parametrize(("index", "icons"), [
    (1, ["❌"]), (2, ["✅"]), (3, ["✅", "❌"]), (4, ["✅"]), (5, ["❌"]), (6, ["❌"]), (7, ["❌"]),
    (8, ["✅", "❌"]), (9, ["⏳"]), (10, ["❌"]), (11, ["💥"]), (12, ["✅"]),
])
def test_each_call_shows_its_verdict_once_wherever_it_stands(ran, index, icons):
    shown = verdicts(ran[index])
    assert [v[0] for v in shown] == icons, ran[index].outputs
    assert all(v.startswith(f"{icon} causal mask: ") for v, icon in zip(shown, icons))


def test_assert_carries_the_verdict(ran):
    ((name, value),) = errors(ran[6])
    assert name == "CheckFailed"  # an AssertionError
    assert value.startswith("❌ causal mask: wrong mask for seq_len=4") and "Hint:" in value


def test_if_and_asserts_that_hold_work_as_usual(ran):
    assert not errors(ran[7]) and streams(ran[7]) == "no\n"
    assert not errors(ran[8])


def test_under_mha_check_raise_failures_raise_and_stubs_do_not(ran):
    assert not errors(ran[9]) and not errors(ran[12])
    ((name, value),) = errors(ran[10])
    assert name == "CheckFailed" and "nothing is blocked" in value
    ((name, value),) = errors(ran[11])
    assert name == "CheckFailed" and value.startswith("💥 causal mask:") and "ZeroDivisionError" in value


def test_outside_ipython_nothing_is_printed(capsys):
    from mha_lib.checks import check_causal_mask

    result = check_causal_mask(lambda L: None)
    assert capsys.readouterr().out == "" and result.status == "not implemented"


def write(folder: Path, name: str, *cells: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    nbformat.write(notebook(*cells), path)
    return path


def run_nbval(folder: Path, *names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-q", *names],
        cwd=folder, env=kernel_env(), capture_output=True, text=True, timeout=300,
    )


def test_a_failing_check_fails_nbval_lax_and_a_stub_does_not(tmp_path):
    # course/ has the repository's conftest.py; bare/ doesn't (a conftest applies to its folder).
    write(tmp_path / "course", "fails.ipynb", SETUP, "check_causal_mask(wrong)")
    write(tmp_path / "course", "stub.ipynb", SETUP, "check_causal_mask(stub)", "check_causal_mask(right)")
    write(tmp_path / "bare", "fails.ipynb", SETUP, "check_causal_mask(wrong)")
    shutil.copy(ROOT / "conftest.py", tmp_path / "course" / "conftest.py")
    run = run_nbval(tmp_path, "course/fails.ipynb", "course/stub.ipynb", "bare/fails.ipynb")
    out = run.stdout + run.stderr
    summary = out.split("short test summary")[-1]
    assert run.returncode == 1, out
    assert "FAILED course/fails.ipynb::Cell 1" in summary, out
    assert "CheckFailed" in out and "nothing is blocked" in out
    assert "stub.ipynb" not in summary, out  # ⏳ never raises
    assert "bare/fails.ipynb" not in summary, out  # without the conftest, lax nbval lets the ❌ pass
    assert "1 failed, 6 passed" in out, out
