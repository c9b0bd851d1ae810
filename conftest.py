"""For every notebook that nbval runs (`make test`, `make test-gpu`, the oldest-PyTorch job),
a failed check fails the run.

nbval's lax mode (`--nbval-lax`, on the GPU and with the oldest PyTorch) compares no
outputs: only an exception fails a cell, and a check *returns* its verdict. So the kernel
that nbval starts for a notebook gets MHA_CHECK_RAISE=1, with which a check that failed
(❌) or met an error (💥) raises after showing its verdict (mha_lib/checks/_result.py);
"not implemented yet" (⏳, the exercises' stubs) never raises. The variable is set only
while nbval starts its kernel, never for the tests themselves, nor for a learner's
`make progress`. tests/test_check_display.py proves it with a notebook that fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

CHECK_RAISE = "MHA_CHECK_RAISE"  # = mha_lib.checks.CHECK_RAISE (not imported: no torch at collection)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if not type(item).__module__.startswith("nbval"):
        yield
        return
    previous = os.environ.get(CHECK_RAISE)
    os.environ[CHECK_RAISE] = "1"  # the notebook's kernel starts in this setup and inherits it
    try:
        yield
    finally:
        if previous is None:
            del os.environ[CHECK_RAISE]
        else:
            os.environ[CHECK_RAISE] = previous
