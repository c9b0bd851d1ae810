"""MultiHeadAttention against torch.nn.MultiheadAttention with the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import assert_matches_torch_mha, assert_rejects_bad_inputs, randn, torch_twin
from mha_lib import MultiHeadAttention, causal_mask, padding_mask


def twin_modules(d_model, num_heads, dtype, device, bias=True):
    """Our module and PyTorch's, holding the same weights."""
    return torch_twin(MultiHeadAttention(d_model, num_heads, bias=bias), dtype, device)


CASES = [  # (B, Lq, Lk, d_model, H)
    (2, 5, 5, 16, 4),
    (3, 4, 7, 24, 3),
    (1, 1, 6, 8, 8),
    (4, 6, 6, 12, 1),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_Lq{}_Lk{}_D{}_H{}".format(*c))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_matches_nn_multihead_attention(case, dtype, bias, device):
    B, Lq, Lk, D, H = case
    ours, theirs = twin_modules(D, H, dtype, device, bias)
    query = randn(B, Lq, D, device=device, dtype=dtype)
    key = randn(B, Lk, D, device=device, dtype=dtype)
    value = randn(B, Lk, D, device=device, dtype=dtype)

    weights = assert_matches_torch_mha(ours, theirs, query, key, value)
    assert weights.shape == (B, H, Lq, Lk)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_causal_mask_with_both_conventions(dtype, device):
    """Ours: True = may attend. nn.MultiheadAttention's attn_mask: True = blocked."""
    B, L, D, H = 2, 6, 16, 4
    ours, theirs = twin_modules(D, H, dtype, device)
    x = randn(B, L, D, device=device, dtype=dtype)
    allowed = causal_mask(L, device=device)

    weights = assert_matches_torch_mha(ours, theirs, x, x, x, allowed, attn_mask=~allowed)
    assert (weights[..., ~allowed] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_key_padding_with_both_conventions(dtype, device):
    """Ours: (B, 1, 1, Lk), True = real token. key_padding_mask: (B, Lk), True = padding."""
    B, Lq, Lk, D, H = 3, 4, 6, 16, 2
    ours, theirs = twin_modules(D, H, dtype, device)
    query = randn(B, Lq, D, device=device, dtype=dtype)
    memory = randn(B, Lk, D, device=device, dtype=dtype)
    lengths = torch.tensor([6, 2, 4], device=device)
    keep = padding_mask(lengths, max_len=Lk)  # (B, 1, 1, Lk)

    weights = assert_matches_torch_mha(ours, theirs, query, memory, memory, keep, key_padding_mask=~keep[:, 0, 0])
    assert (weights[1, :, :, 2:] == 0).all()


def test_per_head_mask_broadcasts(device):
    """A (H, Lq, Lk) mask restricts each head separately (chapter 11's exercise)."""
    B, L, D, H = 2, 6, 8, 2
    mha = MultiHeadAttention(D, H).to(device)
    x = torch.randn(B, L, D, device=device)
    mask = torch.zeros(H, L, L, dtype=torch.bool, device=device)
    mask[0, :, : L // 2] = True
    mask[1, :, L // 2 :] = True
    _, weights = mha(x, x, x, mask=mask, return_weights=True)
    assert (weights[:, 0, :, L // 2 :] == 0).all() and (weights[:, 1, :, : L // 2] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, L, device=device))


def test_causality_of_the_module(device):
    """With a causal mask, changing a later token leaves the earlier outputs unchanged."""
    B, L, D, H = 2, 7, 16, 4
    mha = MultiHeadAttention(D, H).to(device, torch.float64).eval()
    x = torch.randn(B, L, D, dtype=torch.float64, device=device)
    mask = causal_mask(L, device=device)
    x2 = x.clone()
    x2[:, 4] += 3.0
    out, out2 = mha(x, x, x, mask), mha(x2, x2, x2, mask)
    torch.testing.assert_close(out2[:, :4], out[:, :4], atol=0, rtol=0)
    assert not torch.allclose(out2[:, 4:], out[:, 4:])


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


def test_dropout_only_in_training():
    mha = MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 10, 16)
    mha.train()
    _, w_train = mha(x, x, x, return_weights=True)
    assert (w_train == 0).any()
    mha.eval()
    _, w_eval = mha(x, x, x, return_weights=True)
    assert not (w_eval == 0).any()
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(2, 4, 10))


def test_gradcheck_module():
    mha = MultiHeadAttention(6, 2).double()
    q = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, True, True, False])
    assert torch.autograd.gradcheck(lambda a, b: mha(a, b, b, mask), (q, kv))


def test_every_parameter_gets_a_gradient():
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 5, 8)
    mha(x, x, x).pow(2).sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_parameter_count_matches_pytorch():
    """4 d² weights + 4 d biases, like nn.MultiheadAttention (and independent of H)."""
    for H in (1, 8):
        ours = sum(p.numel() for p in MultiHeadAttention(512, H).parameters())
        theirs = sum(p.numel() for p in nn.MultiheadAttention(512, H).parameters())
        assert ours == theirs == 4 * 512 * 512 + 4 * 512


def test_book_configuration_shapes():
    """Transformers in Action, section 2.2.3: d_model 512, 8 heads of 64, a batch of 32 x 100."""
    mha = MultiHeadAttention(512, 8)
    assert mha.d_k == 64
    x = torch.randn(32, 100, 512)
    with torch.no_grad():
        out, weights = mha(x, x, x, return_weights=True)
    assert out.shape == (32, 100, 512) and weights.shape == (32, 8, 100, 100)


@pytest.mark.parametrize(("d_model", "heads"), [(10, 4), (512, 3)])
def test_indivisible_d_model_names_both_numbers(d_model, heads):
    with pytest.raises(ValueError, match=rf"d_model={d_model} is not divisible by num_heads={heads}"):
        MultiHeadAttention(d_model, heads)


def test_input_errors():
    mha = MultiHeadAttention(8, 2)
    assert_rejects_bad_inputs(mha)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5, 5\) does not broadcast"):
        mha(x, x, x, mask=torch.ones(3, 5, 5, dtype=torch.bool))
