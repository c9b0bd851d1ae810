"""EncoderLayer against torch.nn.TransformerEncoderLayer (norm_first=True) with the same weights."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import TOLERANCES, load_into_torch_mha
from mha_lib import EncoderLayer, causal_mask, padding_mask


def twin_layers(d_model, num_heads, d_ff, dtype, device):
    """Our layer and PyTorch's pre-norm ReLU layer, holding the same weights (dropout 0)."""
    ours = EncoderLayer(d_model, num_heads, d_ff).to(dtype=torch.float64)
    theirs = nn.TransformerEncoderLayer(
        d_model, num_heads, d_ff, dropout=0.0, activation="relu",
        batch_first=True, norm_first=True, dtype=torch.float64,
    )
    # Random layer-norm parameters, so that a swapped norm1/norm2 would show.
    for norm in (ours.norm1, ours.norm2):
        nn.init.normal_(norm.weight, 1.0, 0.2)
        nn.init.normal_(norm.bias, 0.0, 0.2)
    load_into_torch_mha(ours.self_attn, theirs.self_attn)
    with torch.no_grad():
        theirs.linear1.load_state_dict(ours.feed_forward[0].state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward[3].state_dict())
        theirs.norm1.load_state_dict(ours.norm1.state_dict())
        theirs.norm2.load_state_dict(ours.norm2.state_dict())
    return ours.to(device, dtype).eval(), theirs.to(device, dtype).eval()


CASES = [  # (B, L, d_model, H, d_ff)
    (2, 5, 16, 4, 32),
    (3, 7, 24, 3, 48),
    (1, 1, 8, 2, 8),
    (4, 6, 12, 1, 20),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}_L{}_D{}_H{}_ff{}".format(*c))
def test_matches_nn_transformer_encoder_layer(case, dtype, device):
    B, L, D, H, d_ff = case
    ours, theirs = twin_layers(D, H, d_ff, dtype, device)
    x = torch.randn(B, L, D, dtype=torch.float64).to(device, dtype)
    out, weights = ours(x, return_weights=True)
    assert out.shape == (B, L, D) and weights.shape == (B, H, L, L)
    torch.testing.assert_close(out, theirs(x), **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_masks_match_pytorch_conventions(dtype, device):
    """Ours: True = may attend. PyTorch's src_mask and src_key_padding_mask: True = blocked."""
    B, L, D, H = 3, 6, 16, 4
    ours, theirs = twin_layers(D, H, 32, dtype, device)
    x = torch.randn(B, L, D, dtype=torch.float64).to(device, dtype)

    allowed = causal_mask(L, device=device)
    torch.testing.assert_close(ours(x, mask=allowed), theirs(x, src_mask=~allowed), **TOLERANCES[dtype])

    lengths = torch.tensor([6, 2, 4], device=device)
    keep = padding_mask(lengths, max_len=L)  # (B, 1, 1, L)
    out = ours(x, mask=keep)
    ref = theirs(x, src_key_padding_mask=~keep[:, 0, 0])
    real = keep[:, 0, 0]  # PyTorch's fast path may zero the padded positions: compare the real ones
    torch.testing.assert_close(out[real], ref[real], **TOLERANCES[dtype])


def test_padding_does_not_reach_the_real_tokens(device):
    """Whatever sits in the padded positions, the real tokens' outputs stay the same."""
    B, L, D, H = 2, 7, 16, 2
    layer = EncoderLayer(D, H, 32).to(device, torch.float64).eval()
    x = torch.randn(B, L, D, dtype=torch.float64, device=device)
    lengths = [7, 3]
    keep = padding_mask(lengths).to(device)
    garbage = x.clone()
    garbage[1, 3:] = 100 * torch.randn(L - 3, D, dtype=torch.float64, device=device)

    out, weights = layer(x, mask=keep, return_weights=True)
    out_garbage = layer(garbage, mask=keep)
    torch.testing.assert_close(out_garbage[1, :3], out[1, :3], **TOLERANCES[torch.float64])
    torch.testing.assert_close(out_garbage[0], out[0], atol=0, rtol=0)
    assert (weights[1, :, :, 3:] == 0).all()
    assert not torch.allclose(layer(garbage)[1, :3], out[1, :3])  # without the mask it would


def test_per_head_mask(device):
    """A (H, L, L) mask restricts each head on its own (chapter 12)."""
    B, L, D, H = 2, 6, 8, 2
    layer = EncoderLayer(D, H, 16).to(device)
    x = torch.randn(B, L, D, device=device)
    mask = torch.zeros(H, L, L, dtype=torch.bool, device=device)
    mask[0, :, : L // 2] = True
    mask[1, :, L // 2 :] = True
    _, weights = layer(x, mask=mask, return_weights=True)
    assert (weights[:, 0, :, L // 2 :] == 0).all() and (weights[:, 1, :, : L // 2] == 0).all()


def test_residual_connections_carry_the_input():
    """With both sublayers' last projections zeroed, the layer is the identity."""
    layer = EncoderLayer(8, 2, 16).double()
    with torch.no_grad():
        for linear in (layer.self_attn.W_o, layer.feed_forward[3]):
            linear.weight.zero_()
            linear.bias.zero_()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x), x, atol=0, rtol=0)


def test_dropout_only_in_training(device):
    layer = EncoderLayer(16, 4, 32, dropout=0.3).to(device)
    x = torch.randn(2, 6, 16, device=device)

    layer.train()
    first, second = layer(x), layer(x)
    assert not torch.allclose(first, second), "training mode should drop out at random"

    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), atol=0, rtol=0)
    no_dropout = EncoderLayer(16, 4, 32, dropout=0.0).to(device).eval()
    no_dropout.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x), no_dropout(x), atol=0, rtol=0)


def test_every_parameter_gets_a_gradient(device):
    layer = EncoderLayer(8, 2, 16).to(device)
    x = torch.randn(2, 5, 8, device=device, requires_grad=True)
    layer(x).pow(2).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_gradcheck():
    layer = EncoderLayer(4, 2, 6).double()
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True, True, False])
    assert torch.autograd.gradcheck(lambda a: layer(a, mask), (x,))


def test_errors_name_the_problem():
    layer = EncoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, d_model=8\), got \(2, 5, 6\)"):
        layer(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"x must have shape \(B, L, d_model=8\), got \(5, 8\)"):
        layer(torch.randn(5, 8))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        layer([[0.0] * 8])
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=4"):
        EncoderLayer(10, 4, 16)
    with pytest.raises(ValueError, match="d_ff must be a positive int, got 0"):
        EncoderLayer(8, 2, 0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.5"):
        EncoderLayer(8, 2, 16, dropout=1.5)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5, 5\) does not broadcast"):
        layer(torch.randn(2, 5, 8), mask=torch.ones(3, 5, 5, dtype=torch.bool))
