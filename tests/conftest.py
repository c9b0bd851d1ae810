"""Shared fixtures: every device-parametrized test runs on the CPU, and on CUDA when present."""

from __future__ import annotations

import matplotlib
import pytest
import torch
from torch import nn

matplotlib.use("Agg")  # no windows during tests

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[
        pytest.mark.cuda,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine"),
    ]),
]

# Tolerances: float64 agrees to rounding error; float32 to ~1e-6 relative;
# bfloat16 keeps 8 bits of mantissa, so only ~1e-2.
TOLERANCES = {
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.float32: dict(atol=2e-5, rtol=1e-4),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
}


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def load_into_torch_mha(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
    """Copy a mha_lib.MultiHeadAttention's W_q, W_k, W_v, W_o into an nn.MultiheadAttention.

    PyTorch keeps W_q, W_k, W_v stacked in one (3 * d_model, d_model) in_proj_weight.
    """
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        theirs.out_proj.weight.copy_(ours.W_o.weight)
        if ours.W_q.bias is not None:
            theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
            theirs.out_proj.bias.copy_(ours.W_o.bias)
