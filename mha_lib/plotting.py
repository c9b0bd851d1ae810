"""Attention maps: queries down the side, keys along the top."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .validation import check_flag

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_attention"]


def _to_numpy(weights: Any) -> np.ndarray:
    """The weights as a float array; a TypeError for what holds no numbers to draw."""
    if hasattr(weights, "detach"):  # a torch tensor, on any device
        if weights.is_complex():
            raise TypeError(f"weights must be real, got a {weights.dtype} tensor")
        weights = weights.detach().float().cpu().numpy()
    if weights is None or isinstance(weights, str) or np.iscomplexobj(weights):
        raise TypeError(f"weights must be a tensor or array of attention weights, got {type(weights).__name__}")
    try:
        return np.asarray(weights, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(f"weights must be a tensor or array of attention weights (numbers), "
                        f"got {type(weights).__name__}") from None


def _labels(labels: Any, name: str, n: int, what: str) -> Sequence[Any] | None:
    """``labels`` as a sequence of ``n`` entries, one per ``what``, or None; else a clear error."""
    if labels is None:
        return None
    if not hasattr(labels, "__len__"):
        try:
            labels = list(labels)  # an iterator or a generator of labels
        except TypeError:
            raise TypeError(f"{name} must be a list of {n} labels for the {what}, "
                            f"got {labels!r} (a {type(labels).__name__})") from None
    if len(labels) != n:
        hint = "; a string counts its characters, for words pass text.split()" if isinstance(labels, str) else ""
        raise ValueError(f"{name} has {len(labels)} labels but the weights have {n} {what}{hint}")
    return labels


def _positive(value: Any, name: str) -> float:
    """A finite number > 0, for sizes and scales."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive, finite number, got {value!r}")
    return float(value)


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
    ncols: int | None = None,
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
        ncols: panels per row; default: all in one row. With several rows, the keys are
            labelled under the bottom row only and the queries left of the first column.

    Returns:
        The matplotlib figure. Jupyter shows it at the end of the cell; follow
        the call with ``plt.show()`` (or assign the result) so that the
        returned figure isn't displayed a second time.
    """
    import matplotlib.pyplot as plt

    w = _to_numpy(weights)
    if w.size == 0:
        raise ValueError(f"weights has no entries to draw, got shape {w.shape}: every size must be at least 1")
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        hint = " pick one sequence of the batch first, e.g. weights[0]" if w.ndim == 4 else ""
        raise ValueError(f"weights must be (Lq, Lk) or (H, Lq, Lk), got shape {w.shape};{hint}")
    H, Lq, Lk = w.shape
    query_labels = _labels(query_labels, "query_labels", Lq, "rows (queries)")
    if key_labels is None and query_labels is not None and Lq == Lk:
        key_labels = query_labels
    key_labels = _labels(key_labels, "key_labels", Lk, "columns (keys)")
    if head_titles is None:
        head_titles = [f"head {h}" for h in range(H)] if H > 1 else [""]
    head_titles = _labels(head_titles, "head_titles", H, "heads")
    annotate = Lq <= 8 and Lk <= 8 if annotate is None else check_flag(annotate, "annotate")
    panel_size = _positive(panel_size, "panel_size")
    top = float(np.nanmax(w)) if vmax is None else _positive(vmax, "vmax")
    top = top if top > 0 else 1.0  # all zeros (or NaN): any scale will do

    if ncols is not None and (isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1):
        raise ValueError(f"ncols must be a whole number of at least 1, got {ncols!r}")
    cols = H if ncols is None else min(ncols, H)
    rows = -(-H // cols)
    height = panel_size * max(Lq / max(Lk, 1), 0.4)
    fig, grid = plt.subplots(rows, cols, figsize=(panel_size * cols + 1.0, (height + 0.8) * rows), squeeze=False,
                             layout="constrained")
    for ax in grid.flat[H:]:
        ax.remove()  # a last row that is not full
    for h, ax in enumerate(grid.flat[:H]):
        image = ax.imshow(w[h], cmap=cmap, vmin=0.0, vmax=top, aspect="auto")
        ax.set_title(head_titles[h])
        if h + cols >= H:  # the bottom panel of its column: label the keys
            ax.set_xticks(range(Lk), key_labels if key_labels is not None else range(Lk), rotation=90)
            ax.set_xlabel("key")
        else:
            ax.set_xticks(range(Lk), [])
        if h % cols == 0:  # the rows are the same queries in every panel: label them once per row
            ax.set_yticks(range(Lq), query_labels if query_labels is not None else range(Lq))
            ax.set_ylabel("query")
        else:
            ax.set_yticks(range(Lq), [])
        if annotate:
            for i in range(Lq):
                for j in range(Lk):
                    colour = "white" if w[h, i, j] > 0.6 * top else "black"
                    ax.text(j, i, f"{w[h, i, j]:.2f}", ha="center", va="center", fontsize=8, color=colour)
    fig.colorbar(image, ax=grid.ravel()[:H].tolist(), shrink=0.8, label="weight")
    if title:
        fig.suptitle(title)
    return fig
