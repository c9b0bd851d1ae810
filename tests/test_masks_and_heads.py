"""causal_mask, padding_mask, split_heads and combine_heads."""

from __future__ import annotations

import pytest
import torch

from mha_lib import causal_mask, combine_heads, padding_mask, split_heads


def test_causal_mask_values(device):
    mask = causal_mask(4, device=device)
    assert mask.dtype == torch.bool and mask.shape == (4, 4) and mask.device.type == device.type
    expected = torch.tensor(
        [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool, device=device
    )
    assert torch.equal(mask, expected)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_causal_mask_rejects_bad_length(bad):
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        causal_mask(bad)


def test_padding_mask_values_and_shape():
    mask = padding_mask([3, 1, 4])
    assert mask.shape == (3, 1, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0, 0].int().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert padding_mask(torch.tensor([2]), max_len=5)[0, 0, 0].int().tolist() == [1, 1, 0, 0, 0]
    assert torch.broadcast_shapes(mask.shape, (3, 8, 7, 4)) == (3, 8, 7, 4)


def test_padding_mask_follows_the_lengths_device(device):
    assert padding_mask(torch.tensor([2, 3], device=device)).device.type == device.type


@pytest.mark.parametrize(
    ("lengths", "max_len", "error", "words"),
    [
        ([3, 5], 4, ValueError, "max_len=4 is shorter than the longest sequence (5)"),
        ([2, -1], None, ValueError, "lengths must be >= 0"),
        ([[2, 3]], None, ValueError, "1-D"),
        ([], None, ValueError, "non-empty"),
        ([2.0, 3.0], None, TypeError, "integers"),
    ],
)
def test_padding_mask_errors(lengths, max_len, error, words):
    with pytest.raises(error) as info:
        padding_mask(lengths, max_len)
    assert words in str(info.value)


def test_split_heads_layout(device):
    """Head h holds features [h*d_k, (h+1)*d_k) of every position."""
    B, L, D, H = 2, 5, 12, 3
    x = torch.arange(B * L * D, dtype=torch.float32, device=device).reshape(B, L, D)
    heads = split_heads(x, H)
    assert heads.shape == (B, H, L, D // H)
    for h in range(H):
        assert torch.equal(heads[:, h], x[:, :, h * 4 : (h + 1) * 4])


def test_split_heads_is_not_a_plain_reshape():
    """The mistake the transpose avoids: reshape(B, H, L, d_k) mixes positions into heads."""
    x = torch.arange(2 * 4 * 6.0).reshape(2, 4, 6)
    assert not torch.equal(split_heads(x, 2), x.reshape(2, 2, 4, 3))


def test_split_heads_accepts_non_contiguous_input():
    x = torch.randn(2, 6, 5).transpose(1, 2)  # (2, 5, 6), not contiguous
    assert torch.equal(split_heads(x, 3), split_heads(x.contiguous(), 3))


def test_combine_inverts_split(device):
    x = torch.randn(3, 7, 16, device=device)
    assert torch.equal(combine_heads(split_heads(x, 4)), x)
    heads = torch.randn(3, 4, 7, 2, device=device)
    assert torch.equal(split_heads(combine_heads(heads), 4), heads)


def test_combine_heads_layout():
    heads = torch.randn(2, 3, 5, 4)
    combined = combine_heads(heads)
    assert combined.shape == (2, 5, 12)
    assert torch.equal(combined[:, :, 4:8], heads[:, 1])


def test_split_and_combine_errors():
    with pytest.raises(ValueError, match=r"D=10 is not divisible by num_heads=4"):
        split_heads(torch.randn(2, 3, 10), 4)
    with pytest.raises(ValueError, match=r"expects \(B, L, D\), got shape \(3, 10\)"):
        split_heads(torch.randn(3, 10), 2)
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        split_heads(torch.randn(2, 3, 10), 0)
    with pytest.raises(ValueError, match=r"expects \(B, H, L, d_k\), got shape \(2, 3, 10\)"):
        combine_heads(torch.randn(2, 3, 10))
