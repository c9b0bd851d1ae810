"""Attention maps: queries down the side, keys along the top."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_attention"]


def _to_numpy(weights: Any) -> np.ndarray:
    if hasattr(weights, "detach"):  # a torch tensor, on any device
        weights = weights.detach().float().cpu().numpy()
    return np.asarray(weights, dtype=float)


def plot_attention(
    weights: Any,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    head_titles: Sequence[str] | None = None,
    annotate: bool | None = None,
    cmap: str = "Blues",
    vmax: float | None = None,
    panel_size: float = 3.2,
) -> "Figure":
    """Draw attention weights as heatmaps, one panel per head.

    Args:
        weights: ``(Lq, Lk)`` for one map, or ``(H, Lq, Lk)`` for one panel per
            head (a tensor on any device, or an array). For a batch
            ``(B, H, Lq, Lk)`` pick one sequence first, e.g. ``weights[0]``.
        query_labels: ``Lq`` labels for the rows (the tokens doing the looking).
        key_labels: ``Lk`` labels for the columns (the tokens looked at);
            default: ``query_labels`` when ``Lq == Lk``.
        title: title of the whole figure.
        head_titles: one title per panel; default "head 0", "head 1", ...
        annotate: write each weight in its cell; default: when both lengths <= 8.
        cmap: matplotlib colour map.
        vmax: top of the colour scale; default: the largest weight shown. All
            panels share one scale, so that heads can be compared.
        panel_size: width and height of one panel in inches.

    Returns:
        The matplotlib figure. Jupyter shows it at the end of the cell; follow
        the call with ``plt.show()`` (or assign the result) so that the
        returned figure isn't displayed a second time.
    """
    import matplotlib.pyplot as plt

    w = _to_numpy(weights)
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        hint = " pick one sequence of the batch first, e.g. weights[0]" if w.ndim == 4 else ""
        raise ValueError(f"weights must be (Lq, Lk) or (H, Lq, Lk), got shape {w.shape};{hint}")
    H, Lq, Lk = w.shape
    if key_labels is None and query_labels is not None and Lq == Lk:
        key_labels = query_labels
    for name, labels, n, axis in (("query_labels", query_labels, Lq, "rows (queries)"),
                                  ("key_labels", key_labels, Lk, "columns (keys)")):
        if labels is not None and len(labels) != n:
            raise ValueError(f"{name} has {len(labels)} labels but the weights have {n} {axis}")
    if head_titles is None:
        head_titles = [f"head {h}" for h in range(H)] if H > 1 else [""]
    elif len(head_titles) != H:
        raise ValueError(f"head_titles has {len(head_titles)} titles for {H} heads")
    if annotate is None:
        annotate = Lq <= 8 and Lk <= 8
    top = float(np.nanmax(w)) if vmax is None else vmax
    top = top if top > 0 else 1.0

    height = panel_size * max(Lq / max(Lk, 1), 0.4)
    fig, axes = plt.subplots(1, H, figsize=(panel_size * H + 1.0, height + 0.8), squeeze=False,
                             layout="constrained")
    for h, ax in enumerate(axes[0]):
        image = ax.imshow(w[h], cmap=cmap, vmin=0.0, vmax=top, aspect="auto")
        ax.set_title(head_titles[h])
        ax.set_xticks(range(Lk), key_labels if key_labels is not None else range(Lk), rotation=90)
        ax.set_xlabel("key")
        if h == 0:  # the rows are the same queries in every panel: label them once
            ax.set_yticks(range(Lq), query_labels if query_labels is not None else range(Lq))
            ax.set_ylabel("query")
        else:
            ax.set_yticks(range(Lq), [])
        if annotate:
            for i in range(Lq):
                for j in range(Lk):
                    colour = "white" if w[h, i, j] > 0.6 * top else "black"
                    ax.text(j, i, f"{w[h, i, j]:.2f}", ha="center", va="center", fontsize=8, color=colour)
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="weight")
    if title:
        fig.suptitle(title)
    return fig
