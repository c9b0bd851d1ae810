"""tools/bench_overhead.py compares like with like: its bare PyTorch versions compute what
EfficientMultiHeadAttention computes (no timing is asserted: on a shared machine the noise is as
large as the overhead measured; the script prints the ratios)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mha_lib import EfficientMultiHeadAttention, KVCache

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import bench_overhead  # noqa: E402


def test_the_bare_versions_compute_what_the_module_computes():
    torch.manual_seed(0)
    mha = EfficientMultiHeadAttention(16, 4).eval()
    x, past = torch.randn(2, 3, 16), torch.randn(2, 2, 4, 5, 4).unbind(0)  # keys, values (B, H, 5, d_k)
    bare = bench_overhead.BareAttention(mha)
    with torch.no_grad():
        expected = mha(x, x, x)
        torch.testing.assert_close(bench_overhead.bare_attention(mha, x[:, :1]), mha(x[:, :1], x[:, :1], x[:, :1]))
        torch.testing.assert_close(bench_overhead.bare_attention(mha, x, one_cut=True), expected)
        torch.testing.assert_close(bare(x[:, :1]), mha(x[:, :1], x[:, :1], x[:, :1]))
        cache = KVCache()
        cache.keys, cache.values = past
        cached = mha(x[:, :1], x[:, :1], x[:, :1], cache=cache)
        torch.testing.assert_close(bench_overhead.bare_attention(mha, x[:, :1], past), cached)
        torch.testing.assert_close(bench_overhead.bare_attention(mha, x[:, :1], past, one_cut=True), cached)
        torch.testing.assert_close(bare(x[:, :1], past), cached)
    assert expected.shape == (2, 3, 16)


def test_each_case_has_the_module_and_the_three_bare_versions():
    cases = bench_overhead.make_cases(d_model=16, heads=4, cached=5, batch=2, length=3)
    assert list(cases) == ["1 token", "1 token + cache", "fwd+bwd"]
    for steps in cases.values():
        assert list(steps) == ["module", "bare", "bare module", "bare, one cut"]
        for step in steps.values():
            step()
