"""See every head for yourself: an interactive view of a causal model's attention weights.

    from mha_lib import attention_explorer

    explorer = attention_explorer(tokens, [w1, w2], title="my sentence")  # one (H, L, L) per layer
    explorer           # in Jupyter or the web book: pick a layer and a head, hover or Tab to a token
    explorer.figure()  # the same weights drawn by matplotlib, where no JavaScript runs

The view is one piece of self-contained HTML with a short plain script in it (about 150 lines
of JavaScript, no library): nothing is downloaded, nothing comes from the network, so it works offline in JupyterLab and in
the web book. Hovering over a token, or moving to it with the keyboard (Tab into the text, then
the arrow keys, Home and End), colours every earlier token by the weight it gets from that
token (the query) and lists the largest weights; a grid of small maps shows every layer and
head at once, with the query's row marked. Colours: matplotlib's "Blues" (single-hue, safe for
colour-blind readers) from weight 0 to 1, as in :func:`~mha_lib.plot_attention`.

The page stores the weights rounded to 3 decimals, as integers in thousandths, and only the
causal lower triangle: L (L + 1) / 2 numbers per head, 2 to 3 characters each. With L = 128
tokens, 2 layers of 4 heads, that is 66,048 numbers, 150-190 kB of HTML (the script and its style:
17 kB); the most it takes, 512 tokens, makes 2.2 MB for 2 × 4 heads.

Where JavaScript does not run (a notebook opened untrusted: JupyterLab runs an output's script
only for outputs made in your session or in a trusted notebook), the stored output shows the
tokens and a line saying to run the cell. Jupyter's plain-text view, which nbval compares, is
one short line: ``AttentionExplorer(2 layers × 4 heads, 37 tokens)``.
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["AttentionExplorer", "attention_explorer"]

MAX_TOKENS = 512
SCALE = 1000  # weights are stored as integers in thousandths: 3 decimals
# ColorBrewer's 9-class Blues, the stops of matplotlib's "Blues": weight 0 → 1, linearly between.
BLUES = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b")
WHITE_TEXT_ABOVE = 0.72  # black text below, white above: both keep a contrast of at least 4.5:1
SUM_TOLERANCE = {2: 2e-2, 4: 1e-3, 8: 1e-3}  # by bytes per number: float16/bfloat16, float32, float64
ABOVE_DIAGONAL = 1e-6  # a causal weight on a later token must be 0 (up to exp(-1e9)-style masking)
_shown = itertools.count()  # one id per HTML shown, so that two views in one page never share an id


def colour(weight: float) -> tuple[int, int, int]:
    """The RGB colour of a weight in [0, 1], as the page draws it (linear between the stops of BLUES)."""
    stops = _stops()
    x = min(max(float(weight), 0.0), 1.0) * (len(stops) - 1)
    k = min(int(x), len(stops) - 2)
    t = x - k
    # floor(v + 0.5), as the page's Math.round: the same colours to the last bit
    return tuple(math.floor(a + (b - a) * t + 0.5) for a, b in zip(stops[k], stops[k + 1]))  # type: ignore[return-value]


def _stops() -> list[tuple[int, int, int]]:
    return [(int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)) for c in BLUES]


def visible(token: str) -> str:
    """A token as the page shows it: spaces as '·', newlines as '↵', tabs as '⇥', other control
    characters as escapes, the empty token as '∅'."""
    special = {" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"}
    shown = "".join(special.get(c, c if c.isprintable() else repr(c)[1:-1]) for c in token)
    return shown or "∅"


class AttentionExplorer:
    """Attention weights of one text, every layer and head, shown as an interactive page.

    Build it with :func:`attention_explorer`, which checks the inputs. ``weights`` is
    ``(layers, H, L, L)`` float32, queries down, keys across; ``tokens`` has ``L`` strings.
    """

    def __init__(self, tokens: tuple[str, ...], weights: np.ndarray, title: str | None) -> None:
        self.tokens, self.weights, self.title = tokens, weights, title

    def __repr__(self) -> str:
        layers, heads, length = self.weights.shape[:3]
        return (f"AttentionExplorer({layers} layer{'s' * (layers != 1)} × {heads} head{'s' * (heads != 1)}, "
                f"{length} token{'s' * (length != 1)})")

    def data(self) -> dict[str, Any]:
        """What the page stores: the tokens, and per layer and head the lower triangle, row by row
        (query i's weights on keys 0 … i start at i (i + 1) / 2), in thousandths."""
        rows, cols = np.tril_indices(len(self.tokens))
        triangle = np.rint(self.weights[:, :, rows, cols] * SCALE).astype(int)  # (layers, H, L (L + 1) / 2)
        return {"tokens": list(self.tokens), "layers": self.weights.shape[0], "heads": self.weights.shape[1],
                "scale": SCALE, "w": triangle.tolist()}

    def _repr_html_(self) -> str:
        data = json.dumps(self.data(), ensure_ascii=False, separators=(",", ":"))
        uid = f"mhax-{hashlib.sha1(data.encode()).hexdigest()[:8]}-{next(_shown)}"
        # In a <script> block "</script>" would end it: JSON's own \u escapes keep <, > and & out.
        data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        tokens = "".join(
            f'<span class="mx-tok" data-i="{i}">{html.escape(visible(t)).replace("`", "&#96;")}</span>'
            + ("<br>" if t.endswith("\n") else "")
            for i, t in enumerate(self.tokens))
        title = f'<div class="mx-title">{html.escape(self.title)}</div>' if self.title else ""
        script = (_SCRIPT.replace("__UID__", uid).replace("__STOPS__", json.dumps(_stops(), separators=(",", ":")))
                  .replace("__WHITE__", repr(WHITE_TEXT_ABOVE)))
        # mathjax_ignore / tex2jax_ignore: a '$' in the text is text, in JupyterLab and in the book.
        return (f'<div id="{uid}" class="mha-explorer mathjax_ignore tex2jax_ignore" role="group" '
                f'aria-label="attention explorer{": " + html.escape(self.title) if self.title else ""}">'
                f"<style>{_STYLE.replace('__UID__', uid)}</style>{title}"
                f'<p class="mx-nojs">▶ Run the cell to explore every head: this saved copy shows only the text, '
                f"because its JavaScript did not run (Jupyter runs it for outputs made in your session or in "
                f"a trusted notebook). Without JavaScript, <code>.figure()</code> draws every head.</p>"
                f'<div class="mx-tokens">{tokens}</div>'
                f'<script type="application/json" class="mx-data">{data}</script>'
                f"<script>{script}</script></div>")

    def figure(self) -> "Figure":
        """Every head's weights as a map, layers down, heads across, the tokens on the axes (one in
        every few when there are many); later tokens are grey (masked). For where no JavaScript runs.
        Follow the call with ``plt.show()`` (or assign it), as for :func:`~mha_lib.plot_attention`."""
        import matplotlib.pyplot as plt
        from matplotlib.colors import LinearSegmentedColormap

        layers, heads, length = self.weights.shape[:3]
        cmap = LinearSegmentedColormap.from_list("blues", BLUES).with_extremes(bad="#eeeeee")
        later = np.triu(np.ones((length, length), dtype=bool), k=1)
        step = max(1, math.ceil(length / 32))  # at most 32 labels an axis
        ticks = list(range(0, length, step))
        labels = [visible(self.tokens[i]) for i in ticks]
        panel = min(max(2.4, length * 0.12), 4.5)
        fig, axes = plt.subplots(layers, heads, figsize=(panel * heads + 1.2, panel * layers + 0.6),
                                 squeeze=False, layout="constrained")
        for (layer, head), ax in np.ndenumerate(axes):
            image = ax.imshow(np.ma.masked_array(self.weights[layer, head], later), cmap=cmap, vmin=0, vmax=1)
            ax.set_title(f"layer {layer + 1} · head {head}", fontsize=9)
            ax.set_xticks(ticks, labels if layer == layers - 1 else [], rotation=90, fontsize=7)
            ax.set_yticks(ticks, labels if head == 0 else [], fontsize=7)
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="weight (later tokens: grey)")
        if self.title:
            fig.suptitle(self.title)
        return fig


def _layer(weights: Any, layer: int) -> tuple[np.ndarray, int]:
    """One layer's weights as a float array ``(H, L, L)``, and the bytes per number of its dtype."""
    name = f"weights[{layer}]"
    if hasattr(weights, "detach"):  # a torch tensor, on any device, with or without grad
        if weights.is_complex() or not weights.is_floating_point():
            raise TypeError(f"{name} must hold floating-point attention weights, got a {weights.dtype} tensor")
        size, weights = weights.element_size(), weights.detach().float().cpu().numpy()
    elif isinstance(weights, np.ndarray) and weights.dtype.kind == "f":
        size, weights = weights.itemsize, weights.astype(np.float32)
    else:
        raise TypeError(f"{name} must be a tensor (or NumPy array) of attention weights, (H, L, L), "
                        f"got {type(weights).__name__}")
    if weights.ndim == 4 and weights.shape[0] == 1:
        weights = weights[0]  # a batch of one
    if weights.ndim != 3:
        hint = {2: " one head: pass w[None]", 4: f" a batch of {weights.shape[0]}: pick one sequence, w[0]"}
        raise ValueError(f"{name} must be (H, L, L) or (1, H, L, L), got shape {tuple(weights.shape)};"
                         f"{hint.get(weights.ndim, '')}")
    return weights, size


def _check_rows(w: np.ndarray, layer: int, tokens: tuple[str, ...], tolerance: float) -> None:
    """Each query's row is a causal distribution: finite, ≥ 0, nothing on later tokens, sums to 1."""
    def where(h: int, q: int) -> str:
        return f"weights[{layer}], head {h}, query {q} ({visible(tokens[q])!r})"

    bad = ~np.isfinite(w)
    if bad.any():
        h, q, _ = np.argwhere(bad)[0]
        raise ValueError(f"{where(h, q)} holds {w[h, q][bad[h, q]][0]}: attention weights are finite "
                         f"(a query with every key masked gives NaN in some implementations)")
    if (w < -ABOVE_DIAGONAL).any():
        h, q, k = np.argwhere(w < -ABOVE_DIAGONAL)[0]
        raise ValueError(f"{where(h, q)} gives key {k} the weight {w[h, q, k]:.3g}: weights are >= 0; "
                         f"pass the weights after the softmax, not the scores")
    later = np.triu(np.ones(w.shape[1:], dtype=bool), k=1)
    if (w[:, later] > ABOVE_DIAGONAL).any():
        h, q, k = next((h, q, k) for h, q, k in np.argwhere(w > ABOVE_DIAGONAL) if k > q)
        raise ValueError(f"{where(h, q)} gives the later token {k} ({visible(tokens[k])!r}) the weight "
                         f"{w[h, q, k]:.3g}: the explorer shows causal attention, where a token sees only "
                         f"itself and earlier ones; attend with mask=causal_mask(L)")
    sums = w.sum(axis=-1, dtype=np.float64)
    if (np.abs(sums - 1) > tolerance).any():
        h, q = np.argwhere(np.abs(sums - 1) > tolerance)[0]
        raise ValueError(f"{where(h, q)}: its weights sum to {sums[h, q]:.4g}, not 1: pass the softmax's "
                         f"weights (return_weights=True), one row per query")


def attention_explorer(tokens: Sequence[str], weights: Sequence[Any], *, title: str | None = None
                       ) -> AttentionExplorer:
    """An interactive view of a causal model's attention on one text: every layer and head.

    Args:
        tokens: the ``L`` tokens of the text, as strings (``L`` ≤ 512), e.g. ``[itos[i] for i in ids]``.
        weights: one tensor per layer, ``(H, L, L)`` or ``(1, H, L, L)`` (a batch of one), the
            weights after the softmax with a causal mask: ``MultiHeadAttention(...)(x, x, x,
            mask=causal_mask(L), return_weights=True)[1]``. Each row sums to 1, later keys get 0.
            Every layer has the same number of heads ``H``. Tensors on any device, or NumPy arrays.
        title: shown above the view.

    Returns:
        An :class:`AttentionExplorer`: displayed in Jupyter or the web book it is the interactive
        view; ``.figure()`` draws the same maps with matplotlib.
    """
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        hint = ": for its characters pass list(text), for words text.split()" if isinstance(tokens, str) else ""
        raise TypeError(f"tokens must be a list of strings, one per token, got a {type(tokens).__name__}{hint}")
    for i, token in enumerate(tokens):
        if not isinstance(token, str):
            raise TypeError(f"tokens[{i}] is {token!r} (a {type(token).__name__}); tokens must be strings: "
                            f"turn ids into text first, e.g. [itos[i] for i in ids]")
    tokens = tuple(tokens)
    if not tokens:
        raise ValueError("tokens is empty: the explorer needs at least one token")
    if len(tokens) > MAX_TOKENS:
        raise ValueError(f"tokens has {len(tokens)} tokens, more than the explorer shows ({MAX_TOKENS}); "
                         f"explore a part: tokens[:{MAX_TOKENS}] with w[..., :{MAX_TOKENS}, :{MAX_TOKENS}]")
    if hasattr(weights, "shape") or isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        shape = f" of shape {tuple(weights.shape)}" if hasattr(weights, "shape") else ""
        raise TypeError(f"weights must be a list with one (H, L, L) tensor per layer, got a "
                        f"{type(weights).__name__}{shape}; for one layer pass [weights]")
    if len(weights) == 0:
        raise ValueError("weights is an empty list: pass one (H, L, L) tensor per layer")
    layers = []
    for layer, w in enumerate(weights):
        w, size = _layer(w, layer)
        if w.shape[1:] != (len(tokens), len(tokens)):
            raise ValueError(f"weights[{layer}] has shape {tuple(w.shape)}, but there are {len(tokens)} tokens: "
                             f"each layer must be (H, {len(tokens)}, {len(tokens)})")
        if layers and w.shape[0] != layers[0].shape[0]:
            raise ValueError(f"weights[{layer}] has {w.shape[0]} heads but weights[0] has {layers[0].shape[0]}: "
                             f"every layer must have the same number of heads")
        if w.shape[0] == 0:
            raise ValueError(f"weights[{layer}] has no heads (shape {tuple(w.shape)})")
        _check_rows(w, layer, tokens, SUM_TOLERANCE.get(size, 1e-3))
        layers.append(w)
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string or None, got {title!r} (a {type(title).__name__})")
    return AttentionExplorer(tokens, np.stack(layers).astype(np.float32), title)


_STYLE = """
#__UID__ { line-height: 1.5; margin: 0.3em 0; }
#__UID__ .mx-title { font-weight: 600; margin-bottom: 0.2em; }
#__UID__ .mx-tokens { max-height: 18em; overflow-y: auto; padding: 4px 2px; line-height: 2;
  font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; }
#__UID__ .mx-tok { display: inline-block; white-space: pre; padding: 0 3px; margin: 1px; line-height: 1.5;
  border: 1px solid #bbb; border-radius: 3px; cursor: default; }
#__UID__ .mx-later { color: #767676; border-style: dashed; }
#__UID__ .mx-query { box-shadow: 0 0 0 3px #e66100; }
#__UID__ .mx-tok:focus-visible, #__UID__ button:focus-visible { outline: 3px solid #000; outline-offset: 3px;
  box-shadow: 0 0 0 3px #e66100, 0 0 0 6px #fff; }
#__UID__ .mx-controls, #__UID__ .mx-legend { display: flex; flex-wrap: wrap; align-items: center; gap: 0.3em 1em;
  margin: 0.2em 0; }
#__UID__ .mx-controls button, #__UID__ .mx-cell { font: inherit; color: #000; background: #f4f4f4;
  border: 1px solid #888; border-radius: 3px; padding: 0 0.6em; margin: 0 1px; cursor: pointer; }
#__UID__ .mx-controls button[aria-pressed="true"], #__UID__ .mx-cell[aria-pressed="true"] { background: #08519c;
  color: #fff; border-color: #08306b; }
#__UID__ .mx-ramp { display: inline-block; width: 10em; height: 0.9em; border: 1px solid #888;
  vertical-align: middle; }
#__UID__ .mx-readout { margin: 0.3em 0; min-height: 1.5em; }
#__UID__ .mx-grid { display: grid; gap: 4px; align-items: center; justify-content: start; margin-top: 0.3em; }
#__UID__ .mx-cell { padding: 2px; font-size: 0.8em; line-height: 1.2; text-align: center; }
#__UID__ .mx-map { position: relative; width: 84px; height: 84px; margin: 0 auto; }
#__UID__ .mx-map canvas { width: 100%; height: 100%; image-rendering: pixelated; display: block; }
#__UID__ .mx-mark { position: absolute; left: -2px; right: -2px; min-height: 2px; outline: 2px solid #e66100; }
"""

# The page's script, with no global name: it finds its own <div> (the script's parent; by id
# where a page moved it), builds the controls, the legend, the read-out and the grid of maps,
# and recolours the tokens whenever the query, the layer or the head changes.
_SCRIPT = """
(function () {
  "use strict";
  var me = document.currentScript, root = me && me.parentNode;
  if (!root || !root.classList || !root.classList.contains("mha-explorer")) root = document.getElementById("__UID__");
  if (!root || root.getAttribute("data-mx-ready")) return;
  root.setAttribute("data-mx-ready", "1");
  var D = JSON.parse(root.querySelector("script.mx-data").textContent);
  var L = D.tokens.length, S = D.scale, STOPS = __STOPS__, WHITE = __WHITE__, TOP = 5;
  var RAMP = [];  // RAMP[v]: the colour of the weight v / S, as colour() in explorer.py computes it
  for (var v = 0; v <= S; v++) {
    var x = v / S * (STOPS.length - 1), k = Math.min(Math.floor(x), STOPS.length - 2), t = x - k;
    RAMP.push([0, 1, 2].map(function (c) { return Math.round(STOPS[k][c] + (STOPS[k + 1][c] - STOPS[k][c]) * t); }));
  }
  var st = {layer: 0, head: 0, query: L - 1};
  var toks = Array.prototype.slice.call(root.querySelectorAll(".mx-tok"));
  var note = root.querySelector(".mx-nojs");
  if (note) note.parentNode.removeChild(note);

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function css(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
  function row(l, h, q) { var o = q * (q + 1) / 2; return D.w[l][h].slice(o, o + q + 1); }
  function name(i) { return "\\u201c" + toks[i].textContent + "\\u201d (" + i + ")"; }
  function top(r, n) {
    return r.map(function (v, k) { return k; })
            .sort(function (a, b) { return r[b] - r[a] || a - b; }).slice(0, n);
  }
  function button(text, label, onclick) {
    var b = el("button", "", text);
    b.type = "button";
    b.setAttribute("aria-label", label);
    b.addEventListener("click", onclick);
    return b;
  }

  // Layer and head buttons.
  var controls = el("div", "mx-controls"), pick = {layer: [], head: []};
  [["layer", D.layers, 1], ["head", D.heads, 0]].forEach(function (g) {
    var group = el("div", "mx-group");
    group.setAttribute("role", "group");
    group.setAttribute("aria-label", g[0]);
    group.appendChild(el("span", "", g[0] + ": "));
    for (var i = 0; i < g[1]; i++) {
      (function (i) {
        var b = button(String(i + g[2]), g[0] + " " + (i + g[2]), function () { st[g[0]] = i; update(); });
        b.setAttribute("data-" + g[0], i);
        pick[g[0]].push(b);
        group.appendChild(b);
      })(i);
    }
    controls.appendChild(group);
  });

  // Legend: the colour scale and what a dashed token is.
  var legend = el("div", "mx-legend"), ramp = el("span", "mx-ramp"), stops = [];
  for (var s = 0; s <= 8; s++) stops.push(css(RAMP[Math.round(s * S / 8)]) + " " + (s * 12.5) + "%");
  ramp.style.background = "linear-gradient(to right, " + stops.join(", ") + ")";
  ramp.setAttribute("role", "img");
  ramp.setAttribute("aria-label", "colour scale: the weight a token gets, from 0 (white) to 1 (dark blue)");
  var scale = el("span");
  scale.appendChild(el("span", "", "weight from the query: 0 "));
  scale.appendChild(ramp);
  scale.appendChild(el("span", "", " 1"));
  var later = el("span", "", "later tokens, dashed: masked (a token sees only itself and earlier ones)");
  legend.appendChild(scale);
  legend.appendChild(later);

  // The tokens: a list of options; hover, click or focus one to make it the query.
  var list = root.querySelector(".mx-tokens");
  list.setAttribute("role", "listbox");
  list.setAttribute("aria-label", "the text's tokens: choose the query with the arrow keys, Home and End");
  toks.forEach(function (t, i) {
    t.setAttribute("role", "option");
    t.addEventListener("mouseenter", function () { select(i); });
    t.addEventListener("focus", function () { select(i); });
    t.addEventListener("click", function () { t.focus(); });
  });
  list.addEventListener("keydown", function (e) {
    var q = st.query, to = {ArrowLeft: q - 1, ArrowUp: q - 1, ArrowRight: q + 1, ArrowDown: q + 1,
                            Home: 0, End: L - 1}[e.key];
    if (to === undefined) return;
    // Handled here: the text box does not scroll, and a notebook's own shortcuts for these keys
    // (JupyterLab's command mode binds the arrows to "move to another cell") skip the event.
    e.preventDefault();
    e.stopPropagation();
    toks[Math.max(0, Math.min(L - 1, to))].focus();
  });

  var readout = el("p", "mx-readout");
  readout.setAttribute("aria-live", "polite");

  // Every layer and head: a small map each (queries down, keys across), the query's row marked.
  var grid = el("div", "mx-grid"), cells = [];
  grid.setAttribute("role", "group");
  grid.setAttribute("aria-label", "every layer and head: choose one to show it");
  grid.style.gridTemplateColumns = "auto repeat(" + D.heads + ", auto)";
  for (var l = 0; l < D.layers; l++) {
    grid.appendChild(el("span", "", "layer " + (l + 1)));
    for (var h = 0; h < D.heads; h++) {
      (function (l, h) {
        var b = button("", "", function () { st.layer = l; st.head = h; update(); });
        b.className = "mx-cell";
        var map = el("div", "mx-map"), cv = el("canvas"), mark = el("div", "mx-mark"), caption = el("span");
        cv.width = L;
        cv.height = L;
        cv.setAttribute("aria-hidden", "true");
        draw(cv, D.w[l][h]);
        mark.style.height = (100 / L) + "%";
        map.appendChild(cv);
        map.appendChild(mark);
        b.appendChild(map);
        b.appendChild(el("span", "", "head " + h));
        b.appendChild(el("br"));
        b.appendChild(caption);
        cells.push({layer: l, head: h, button: b, mark: mark, caption: caption});
        grid.appendChild(b);
      })(l, h);
    }
  }
  function draw(cv, w) {
    var ctx = cv.getContext("2d"), img = ctx.createImageData(L, L), p = img.data, o = 0;
    for (var q = 0; q < L; q++) {
      for (var k = 0; k < L; k++) {
        var c = k <= q ? RAMP[w[o++]] : [238, 238, 238], i = 4 * (q * L + k);
        p[i] = c[0]; p[i + 1] = c[1]; p[i + 2] = c[2]; p[i + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  root.insertBefore(controls, list);
  root.insertBefore(legend, list);
  root.appendChild(readout);
  root.appendChild(grid);

  function select(i) { if (i !== st.query) { st.query = i; update(); } }
  function update() {
    var q = st.query, r = row(st.layer, st.head, q);
    toks.forEach(function (t, i) {
      var w = i <= q ? r[i] / S : null;
      t.style.background = w === null ? "" : css(RAMP[r[i]]);
      t.style.color = w === null ? "" : (w > WHITE ? "#fff" : "#000");
      t.classList.toggle("mx-later", w === null);
      t.classList.toggle("mx-query", i === q);
      t.setAttribute("aria-selected", i === q ? "true" : "false");
      t.tabIndex = i === q ? 0 : -1;
      if (w === null) { t.removeAttribute("data-w"); t.title = "after the query: masked"; }
      else { t.setAttribute("data-w", w.toFixed(3)); t.title = "weight " + w.toFixed(3) + " from " + name(q); }
      t.setAttribute("aria-label", name(i) + (w === null ? ", masked" : ", weight " + w.toFixed(3)));
    });
    ["layer", "head"].forEach(function (g) {
      pick[g].forEach(function (b, i) { b.setAttribute("aria-pressed", i === st[g] ? "true" : "false"); });
    });
    readout.textContent = "Layer " + (st.layer + 1) + ", head " + st.head + ": " + name(q) +
      " gives the most weight to " + top(r, TOP).map(function (k) {
        return name(k) + " " + (r[k] / S).toFixed(3);
      }).join(", ") + ".";
    cells.forEach(function (c) {
      var cr = row(c.layer, c.head, q), k = top(cr, 1)[0], mine = c.layer === st.layer && c.head === st.head;
      c.mark.style.top = (100 * q / L) + "%";
      c.caption.textContent = "\\u2192 " + toks[k].textContent.slice(0, 8) + " " + (cr[k] / S).toFixed(2);
      c.button.setAttribute("aria-pressed", mine ? "true" : "false");
      c.button.setAttribute("aria-label", "layer " + (c.layer + 1) + ", head " + c.head + ": " + name(q) +
                            " gives the most weight to " + name(k) + ", " + (cr[k] / S).toFixed(3));
    });
  }
  update();
})();
"""
