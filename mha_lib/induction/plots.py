"""Plots of chapter 08: loss curves of every run of the study, and head scores against their baselines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..studies import Study

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["plot_curves", "plot_scores"]


def plot_curves(ax: Axes, study: Study, config: str, num_layers: int, *, colour: str = "tab:blue",
                label: str | None = None) -> int:
    """One thin line per run of the study (configuration ``config``, ``num_layers`` layers): the
    loss on the predictable tokens against the training step. Returns the number of runs drawn."""
    steps = study.about["steps"][config]
    runs = study.values(lambda r: r["history"], where=lambda r: r["config"] == config and r["num_layers"] == num_layers)
    for i, history in enumerate(runs):
        ax.plot(steps, history, color=colour, lw=0.7, alpha=0.45,
                label=(label or f"{num_layers} layer{'s' * (num_layers > 1)}") + f" ({len(runs)} runs)" if i == 0 else None)
    return len(runs)


def plot_scores(ax: Axes, scores: Sequence[Sequence[float]], uniform: float, threshold: float, *,
                title: str, study_scores: Sequence[Sequence[float]] | None = None) -> None:
    """Bars: one score per head and layer (``scores[layer][head]``), with the uniform-attention
    baseline (dotted) and the role threshold (dashed). ``study_scores``: the same score of every
    run of the study, one row per run (``[layer][head]`` flattened to layer-major order), as dots."""
    num_layers, num_heads = len(scores), len(scores[0])
    xs = [layer * (num_heads + 1) + h for layer in range(num_layers) for h in range(num_heads)]
    values = [s for layer in scores for s in layer]
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    ax.bar(xs, values, color=[colours[x // (num_heads + 1) % 4] for x in xs], alpha=0.8)
    if study_scores is not None:
        for run in study_scores:
            ax.scatter(xs, run, s=6, color="black", alpha=0.35, zorder=3, linewidths=0)
    ax.axhline(uniform, color="grey", ls=":", lw=1.2, label=f"uniform attention ({uniform:.2f})")
    ax.axhline(threshold, color="black", ls="--", lw=0.8, label=f"threshold ({threshold:.2f})")
    ax.set_xticks(xs, [f"L{layer + 1}.h{h}" for layer in range(num_layers) for h in range(num_heads)], fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_title(title, fontsize=10)

