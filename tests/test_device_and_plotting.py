"""get_device, seed_everything and plot_attention."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from mha_lib import get_device, plot_attention, seed_everything
from mha_lib import device as device_module


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module, "_mps_available", lambda: False)


def test_default_is_cpu_without_accelerators(monkeypatch, no_gpu):
    monkeypatch.delenv("MHA_DEVICE", raising=False)
    assert get_device() == torch.device("cpu")


def test_default_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.delenv("MHA_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert get_device() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device_module, "_mps_available", lambda: True)
    assert get_device() == torch.device("mps")


@pytest.mark.parametrize("value", ["cpu", " cpu ", ""])
def test_mha_device_cpu_and_empty(monkeypatch, no_gpu, value):
    monkeypatch.setenv("MHA_DEVICE", value)
    assert get_device() == torch.device("cpu")


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "tpu", "CPU0"])
def test_unknown_mha_device_is_named(monkeypatch, value):
    monkeypatch.setenv("MHA_DEVICE", value)
    with pytest.raises(ValueError) as info:
        get_device()
    assert "MHA_DEVICE" in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("cuda:00", r"\(write the index without leading zeros: 'cuda:0'\)"),
        ("cuda:01", r"\(write the index without leading zeros: 'cuda:1'\)"),
        ("CUDA", r"\(write it in lower case: 'cuda'\)"),
        ("Cpu", r"\(write it in lower case: 'cpu'\)"),
        ("cuda:", ""),
        ("cuda:-1", ""),
        ("cuda: 1", ""),
        ("cuda:1.0", ""),
    ],
)
def test_a_device_torch_would_misread_is_named_with_the_fix(monkeypatch, no_gpu, value, hint):
    """cuda:00 matched the pattern once, then failed inside torch.device without naming MHA_DEVICE."""
    monkeypatch.setenv("MHA_DEVICE", value)
    with pytest.raises(ValueError, match=rf"^MHA_DEVICE={value!r} is not a device the course knows ?{hint}; use cpu"):
        get_device()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("cuda:99999999999999999999", r"is not a device PyTorch accepts: Could not parse device index"),
        ("cuda:256", r"has a device index PyTorch can't hold \(it reads it as cuda:0\)"),  # torch wraps it
    ],
)
def test_a_device_index_torch_cannot_hold_is_named(monkeypatch, value, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("MHA_DEVICE", value)
    with pytest.raises(ValueError, match=rf"^MHA_DEVICE={value!r} {message}"):
        get_device()


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "mps"])
def test_unavailable_mha_device_is_named(monkeypatch, no_gpu, value):
    monkeypatch.setenv("MHA_DEVICE", value)
    with pytest.raises(RuntimeError) as info:
        get_device()
    assert "MHA_DEVICE" in str(info.value) and repr(value) in str(info.value)


def test_cuda_index_beyond_the_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("MHA_DEVICE", "cuda:3")
    with pytest.raises(RuntimeError, match=r"MHA_DEVICE='cuda:3', but this machine has only 1 CUDA"):
        get_device()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available on this machine")
def test_real_cuda_device(monkeypatch):
    monkeypatch.setenv("MHA_DEVICE", "cuda:0")
    assert get_device() == torch.device("cuda", 0)


def test_seed_everything_repeats_every_generator():
    def draw():
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    seed_everything(7)
    first = draw()
    seed_everything(7)
    assert draw() == first
    seed_everything(8)
    assert draw() != first


def test_plot_attention_one_panel_per_head():
    weights = torch.softmax(torch.randn(3, 4, 5), dim=-1)
    fig = plot_attention(weights, ["a", "b", "c", "d"], ["v", "w", "x", "y", "z"], title="t")
    assert isinstance(fig, Figure)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 3
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["a", "b", "c", "d"]
    assert [t.get_text() for t in panels[2].get_xticklabels()] == ["v", "w", "x", "y", "z"]
    assert [ax.get_title() for ax in panels] == ["head 0", "head 1", "head 2"]
    assert len(panels[0].texts) == 20  # small maps are annotated with their weights


def test_plot_attention_single_map_defaults_key_labels_to_query_labels():
    fig = plot_attention(torch.eye(3, requires_grad=True) * 1.0, ["x", "y", "z"], annotate=False)
    (panel,) = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [t.get_text() for t in panel.get_xticklabels()] == ["x", "y", "z"]
    assert not panel.texts


def test_plot_attention_in_rows_labels_outer_panels_only():
    weights = torch.softmax(torch.randn(5, 3, 3), dim=-1)
    fig = plot_attention(weights, ["a", "b", "c"], ncols=2, annotate=False)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 5  # 3 rows of 2, the empty sixth panel removed
    assert [round(ax.get_position().x0, 2) for ax in panels[::2]] == [round(panels[0].get_position().x0, 2)] * 3
    ylabelled = [i for i, ax in enumerate(panels) if any(t.get_text() for t in ax.get_yticklabels())]
    xlabelled = [i for i, ax in enumerate(panels) if any(t.get_text() for t in ax.get_xticklabels())]
    assert ylabelled == [0, 2, 4]  # the first column
    assert xlabelled == [3, 4]  # the bottom panel of each column: head 3 has none below it
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="ncols must be a whole number of at least 1"):
            plot_attention(weights, ncols=bad)


def test_plot_attention_errors():
    with pytest.raises(ValueError, match=r"query_labels has 2 labels but the weights have 3 rows \(queries\)"):
        plot_attention(torch.rand(3, 3), ["a", "b"])
    with pytest.raises(ValueError, match=r"pick one sequence of the batch first"):
        plot_attention(torch.rand(2, 2, 3, 3))
