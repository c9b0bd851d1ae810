"""What only the teaching MultiHeadAttention (chapter 03) promises: each head is its own slice of
W_q, W_k, W_v.

What it promises together with EfficientMultiHeadAttention (nn.MultiheadAttention's output and
weights, masks, causality, dropout, gradients, errors) is tested on both modules in
test_attention_modules.py.
"""

from __future__ import annotations

import torch

from mha_lib import MultiHeadAttention


def test_each_head_sees_its_own_slice():
    """Zeroing W_q's rows of head 1 makes head 1 attend uniformly, leaving head 0 alone."""
    D, H, L = 8, 2, 5
    mha = MultiHeadAttention(D, H).double()
    x = torch.randn(1, L, D, dtype=torch.float64)
    _, before = mha(x, x, x, return_weights=True)
    with torch.no_grad():
        mha.W_q.weight[4:] = 0
        mha.W_q.bias[4:] = 0
    _, after = mha(x, x, x, return_weights=True)
    torch.testing.assert_close(after[:, 0], before[:, 0])
    torch.testing.assert_close(after[:, 1], torch.full((1, L, L), 1 / L, dtype=torch.float64))
    assert not torch.allclose(before[:, 1], after[:, 1])
