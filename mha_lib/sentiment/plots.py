"""Plots of the seed study: one dot per run, so that a reader sees the spread, not one number."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

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
) -> Axes:
    """A strip plot: one column per measurement, one dot per run of the study, coloured by
    CPU kernel path, and the learner's own model as a black star.

    Args:
        columns: ``{label: fn(run) -> value in [0, 1]}``.
        where: keep only the runs for which it is true (e.g. :func:`~.study.learned`).
        yours: ``{label: value}`` measured on the model trained in the notebook.
        chance: draw a dotted line at 50%.
        legend: put the legend (kernel paths, your model) to the right of the plot.
    """
    runs = [run for run in study.runs if where is None or where(run)]
    rng = np.random.default_rng(0)  # the same jitter every time
    colours = dict(zip(study.paths, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    for x, (label, fn) in enumerate(columns.items()):
        for path, colour in colours.items():
            values = [fn(run) for run in runs if run["path"] == path]
            jitter = rng.uniform(-0.22, 0.22, len(values))
            ax.scatter(x + jitter, values, s=14, alpha=0.6, color=colour, linewidths=0,
                       label=f"{path} ({len(values)} runs)" if x == 0 else None)
        if yours is not None and label in yours:
            ax.scatter([x], [yours[label]], marker="*", s=160, color="black", zorder=3,
                       label="the model you trained" if x == 0 else None)
    if chance:
        ax.axhline(0.5, color="grey", ls=":", lw=1)
    ax.set_xticks(range(len(columns)), list(columns), fontsize=8)
    ax.set_ylim(-0.04, 1.04)
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    return ax
