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


def test_the_fuzz_covers_the_cache_path_and_tensor_head_indices(outcomes):
    """Issue 34: a 0/1 float mask was refused without a cache but accepted with one, and a 0-d integer
    tensor as a head index (``silence_heads(mha, [w.argmax()])``) was refused where NumPy integers pass."""
    outcome = {case.target: result for case, result, _ in outcomes}
    for name in ("MultiHeadAttention", "EfficientMultiHeadAttention"):
        assert outcome[f"{name}.forward(0/1 float mask with a KVCache)"] == "refused"
        assert outcome[f"{name}.forward(0/-inf float mask with a KVCache)"] == "accepted"
    assert outcome["MultiHeadLatentAttention.forward(0/1 float mask with a LatentCache)"] == "refused"
    assert outcome["MultiHeadLatentAttention.forward(0/-inf float mask with a LatentCache)"] == "accepted"
    assert outcome["sentiment.silence_heads(heads=[tensor(1)])"] == "accepted"
    assert outcome["sentiment.silence_heads(heads=[np.int64(1)])"] == "accepted"
    for bad in ("[tensor(1.)]", "[tensor(True)]", "[tensor([1])]", "[np.True_]"):
        assert outcome[f"sentiment.silence_heads(heads={bad})"] == "refused"
