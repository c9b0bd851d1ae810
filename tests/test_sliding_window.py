"""sliding_window_mask: causal local attention."""

from __future__ import annotations

import pytest
import torch

from mha_lib import MultiHeadAttention, causal_mask, sliding_window_mask


def test_small_cases_exactly():
    assert sliding_window_mask(4, 2).int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 0, 1, 1],
    ]
    assert sliding_window_mask(5, 3).int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert torch.equal(sliding_window_mask(6, 1), torch.eye(6, dtype=torch.bool))
    assert sliding_window_mask(1, 1).tolist() == [[True]]


@pytest.mark.parametrize("seq_len", [1, 2, 7, 16])
@pytest.mark.parametrize("window", [1, 2, 3, 8, 20])
def test_true_exactly_where_the_offset_is_in_the_window(seq_len, window):
    mask = sliding_window_mask(seq_len, window)
    assert mask.shape == (seq_len, seq_len) and mask.dtype == torch.bool
    for i in range(seq_len):
        for j in range(seq_len):
            assert bool(mask[i, j]) == (0 <= i - j < window), (i, j)
    assert (mask.sum(-1) == torch.arange(seq_len).clamp(max=window - 1) + 1).all()  # min(i + 1, window) keys


@pytest.mark.parametrize("seq_len", [1, 5, 9])
def test_a_window_as_long_as_the_sequence_is_the_causal_mask(seq_len):
    for window in (seq_len, seq_len + 1, 100):
        assert torch.equal(sliding_window_mask(seq_len, window), causal_mask(seq_len))
    if seq_len > 1:
        assert not torch.equal(sliding_window_mask(seq_len, seq_len - 1), causal_mask(seq_len))


def test_on_a_device(device):
    assert sliding_window_mask(3, 2, device=device).device.type == device.type


def test_an_output_depends_only_on_the_last_window_tokens():
    """Through attention: changing token 0 changes the outputs of queries 0 … window-1 only."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).double().eval()
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    y = x.clone()
    y[0, 0] += 1.0
    mask = sliding_window_mask(8, 3)
    changed = (mha(x, x, x, mask) - mha(y, y, y, mask)).abs().amax(-1)[0] > 1e-12  # (L,)
    assert changed.tolist() == [True, True, True, False, False, False, False, False]


@pytest.mark.parametrize("args", [(4, 0), (4, -1), (4, 2.0), (4, True), (0, 2), (3.0, 2)])
def test_bad_sizes_are_refused(args):
    with pytest.raises(ValueError, match="must be a positive int"):
        sliding_window_mask(*args)


def test_sinks_stay_visible_outside_the_window():
    mask = sliding_window_mask(7, 3, sinks=2)
    expected = [[1 if j <= i and (i - j < 3 or j < 2) else 0 for j in range(7)] for i in range(7)]
    assert mask.int().tolist() == expected
    assert torch.equal(sliding_window_mask(7, 3, sinks=0), sliding_window_mask(7, 3))
    assert torch.equal(sliding_window_mask(7, 3, sinks=7), causal_mask(7))  # every key is a sink
    assert not mask[1, 2]  # a sink is still causal: no query sees a later position
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="sinks"):
            sliding_window_mask(7, 3, sinks=bad)
