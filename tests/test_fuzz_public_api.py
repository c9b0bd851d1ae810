"""The fuzz of the public API (tools/fuzz_public_api.py) meets its bars: no silently wrong result,
no valid edge input refused, at most 3 unclear errors; and it calls every name of ``mha_lib.__all__``."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import mha_lib

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import fuzz_public_api as fuzz  # noqa: E402


@pytest.fixture(scope="module")
def outcomes():
    return fuzz.results()


def test_the_fuzz_meets_its_bars(outcomes):
    counts = Counter(outcome for _, outcome, _ in outcomes)
    bad = [f"{outcome}: {case.target}: {what}" for case, outcome, what in outcomes
           if outcome in ("silently wrong", "valid refused")]
    unclear = [f"{case.target}: {what}" for case, outcome, what in outcomes if outcome == "unclear"]
    assert not bad, "\n".join(bad)
    assert len(unclear) <= 3, "\n".join(unclear)
    assert counts["refused"] > 500 and counts["accepted"] > 100, counts  # the fuzz did call things


def test_the_fuzz_calls_every_public_name(outcomes):
    called = {case.target.split("(")[0].split(".")[0] for case, _, _ in outcomes}
    missing = [name for name in mha_lib.__all__ if name not in called]
    assert not missing, f"add cases for {missing} to tools/fuzz_public_api.py"
