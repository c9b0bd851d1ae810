"""Plots of the seed study: one dot per run, so that a reader sees the spread, not one number."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .findings import independent
from .study import Study

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["plot_runs"]

Run = dict[str, Any]


def plot_runs(
    ax: Axes,
    study: Study,
    columns: Mapping[str, Callable[[Run], float]],
    *,
    where: Callable[[Run], bool] | None = None,
    yours: Mapping[str, float] | None = None,
    title: str | None = None,
    ylabel: str = "held-out accuracy",
    chance: bool = True,
    legend: bool = True,
    percent: bool = True,
) -> Axes:
    """A strip plot: one column per measurement, one dot per independent run of the study,
    and the learner's own model as a black star.

    Args:
        columns: ``{label: fn(run) -> value}`` (a share or an accuracy in [0, 1], unless ``percent`` is False).
        where: the runs to draw (default: the independent two-head runs, replicas left out;
            e.g. ``lambda r: independent(r) and learned(r)``).
        yours: ``{label: value}`` measured on the model trained in the notebook.
        chance: draw a dotted line at 50%.
        legend: put the legend (the runs, your model) to the right of the plot.
        percent: values are shares in [0, 1], drawn as percentages on a fixed axis; False
            for other values (e.g. logits), on an axis that fits them.
    """
    runs = [run for run in study.runs if (where or independent)(run)]
    rng = np.random.default_rng(0)  # the same jitter every time
    for x, (label, fn) in enumerate(columns.items()):
        values = [fn(run) for run in runs]
        jitter = rng.uniform(-0.22, 0.22, len(values))
        ax.scatter(x + jitter, values, s=14, alpha=0.6, color="tab:blue", linewidths=0,
                   label=f"one run each ({len(values)} runs)" if x == 0 else None)
        if yours is not None and label in yours:
            ax.scatter([x], [yours[label]], marker="*", s=160, color="black", zorder=3,
                       label="the model you trained" if x == 0 else None)
    if chance:
        ax.axhline(0.5, color="grey", ls=":", lw=1)
    ax.set_xticks(range(len(columns)), list(columns), fontsize=8)
    if percent:
        ax.set_ylim(-0.04, 1.04)
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax
