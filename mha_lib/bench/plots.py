"""Time and peak memory against sequence length, on log-log axes."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .run import Result
from .steps import MODES, VARIANTS

__all__ = ["STYLES", "plot_results"]

STYLES = {"teaching": "o-", "efficient": "s-", "nn.MHA(weights)": "^--", "nn.MHA": "v--"}  # some lines overlap


def plot_results(results: Sequence[Result], path: str | os.PathLike | None = None, title: str | None = None,
                 stat: str = "median"):
    """Time (top row) and peak memory (bottom row, where measured) against length, one column per
    mode and one line per variant, on log-log axes. Saves to ``path`` if given; returns the figure."""
    import matplotlib.pyplot as plt

    time_field = "seconds" if stat == "median" else "fastest"
    modes = [m for m in MODES if any(r.mode == m for r in results)]
    rows = [(time_field, f"{stat} time per step (ms)", 1e3)]
    if any(r.peak_bytes for r in results):
        rows.append(("peak_bytes", "peak memory rise (MiB)", 2.0**-20))
    lengths = sorted({r.length for r in results})
    fig, axes = plt.subplots(len(rows), len(modes), figsize=(5.2 * len(modes), 3.6 * len(rows)), squeeze=False)
    for i, (field, ylabel, scale) in enumerate(rows):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for v in VARIANTS:
                points = sorted((r.length, getattr(r, field)) for r in results
                                if r.variant == v and r.mode == mode and getattr(r, field))
                if points:
                    xs, ys = zip(*points)
                    ax.plot(xs, [y * scale for y in ys], STYLES[v], label=v, alpha=0.85)
            ax.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel=ylabel,
                   title=f"{mode}: {'memory' if field == 'peak_bytes' else 'time'}")
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
