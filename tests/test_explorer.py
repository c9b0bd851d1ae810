"""mha_lib.explorer: the attention explorer that chapter 09 shows on a text the learner types.

Without a browser: its inputs are checked with errors that say what is wrong; its HTML loads
nothing from anywhere (no URL, no src or href); every view has ids of its own; the weights it
stores round-trip to 3 decimals; its plain-text form is one short line; ``.figure()`` draws
every head. In headless Chromium with nothing reachable but the page (tests/browser_support.py):

- (a) the HTML in a file: hovering a token, or moving to it with the keyboard, colours every
  earlier token by the weight it gets, in the palette's colour for that weight; the head and
  layer buttons and the grid switch heads; a second explorer in the page is left alone;
- (b) JupyterLab: a notebook whose stored output was not made in the session (untrusted:
  JupyterLab runs no script in it) shows the tokens and "Run the cell to explore"; run, the
  cell builds an explorer from a tiny random ``MultiHeadAttention``, and hovering, the keys and
  the buttons work there, without moving JupyterLab's cell selection;
- (c) the web book (book/build.py on a one-chapter course, as in test_book.py): the stored
  output is interactive and answers a hover;
- (d) chapter 09's stored output, the shipped language model on the chapter's snippet: its
  weights are the model's, and in a page hovering and the buttons colour the tokens by them.

Screenshots go to ``artifacts/explorer/``.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from browser_support import VIEWPORT, launch, start_lab, sync_playwright  # noqa: F401 - a fixture

from mha_lib import MultiHeadAttention, attention_explorer, causal_mask
from mha_lib.explorer import MAX_TOKENS, SCALE, AttentionExplorer, colour, visible

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts" / "explorer"
TOKENS = ["The", " cat", " sat", " on", " the", " mat", ".", "\n", "It", " was", " <b>happy</b>", " &", " $5",
          " `rich`", " </script>"]

# The cell that (b)'s notebook runs, and that the tests run here for the weights to expect.
MODEL_CELL = """import torch
from mha_lib import MultiHeadAttention, attention_explorer, causal_mask

torch.manual_seed(0)
tokens = ["The", " cat", " sat", " on", " the", " mat", "."]
L, d_model, H = len(tokens), 16, 4
x = torch.randn(1, L, d_model) * 3
weights = []
with torch.no_grad():
    for layer in range(2):
        x, w = MultiHeadAttention(d_model, H)(x, x, x, mask=causal_mask(L), return_weights=True)
        weights.append(w)  # (1, H, L, L)
attention_explorer(tokens, weights, title="a tiny random model")"""


def model_weights(length: int, layers: int = 2, heads: int = 4, seed: int = 0, sharp: float = 3.0) -> list[torch.Tensor]:
    """Causal weights of random MultiHeadAttention layers, (1, H, L, L) each."""
    torch.manual_seed(seed)
    x = torch.randn(1, length, 16) * sharp
    out = []
    with torch.no_grad():
        for _ in range(layers):
            out.append(MultiHeadAttention(16, heads)(x, x, x, mask=causal_mask(length), return_weights=True)[1])
    return out


def stored_data(markup: str) -> dict:
    """The weights and tokens a view stores, read back from its HTML."""
    found = re.findall(r'<script type="application/json" class="mx-data">(.*?)</script>', markup, re.S)
    assert len(found) == 1, f"expected one data block, found {len(found)}"
    return json.loads(found[0])


def view_id(markup: str) -> str:
    return re.match(r'<div id="(mhax-[\w-]+)"', markup).group(1)


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(markup: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(markup)
    return parser.tags


# ------------------------------------------------------------------------- without a browser

def test_its_text_is_one_short_line() -> None:
    explorer = attention_explorer([str(i) for i in range(37)], model_weights(37))
    assert repr(explorer) == "AttentionExplorer(2 layers × 4 heads, 37 tokens)"
    one = attention_explorer(["a"], [torch.ones(1, 1, 1)])
    assert repr(one) == "AttentionExplorer(1 layer × 1 head, 1 token)"
    # A second run of the same cell makes the same HTML but for its id's count (nbval compares text/html too)
    first = explorer._repr_html_()
    second = attention_explorer([str(i) for i in range(37)], model_weights(37))._repr_html_()
    assert view_id(first).rsplit("-", 1)[0] == view_id(second).rsplit("-", 1)[0]
    assert first.replace(view_id(first), "ID") == second.replace(view_id(second), "ID"), "not deterministic"


def test_nbval_compares_the_text_and_the_tokens_not_the_weights() -> None:
    """tests/nbval_sanitize.cfg, read as nbval reads it: two views of the same tokens with weights
    from other machines (here: other seeds) compare equal; other tokens or another title do not."""
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())

    def sanitized(explorer: AttentionExplorer) -> str:
        markup = explorer._repr_html_()
        for regex, replace in patterns:
            markup = re.sub(regex, replace, markup)
        return markup

    tokens = [" one", " two", " three"]
    here = sanitized(attention_explorer(tokens, model_weights(3), title="t"))
    assert "WEIGHTS" in here and "mhax-ID" in here and "mhax-ID-" not in here
    assert not re.search(r"mhax-(?!ID)", here), "an id escaped the sanitizer"
    assert sanitized(attention_explorer(tokens, model_weights(3, seed=1), title="t")) == here
    assert sanitized(attention_explorer([" one", " two", " four"], model_weights(3), title="t")) != here
    assert sanitized(attention_explorer(tokens, model_weights(3), title="u")) != here


def _nan_row() -> torch.Tensor:
    w = model_weights(4, layers=1)[0][0]
    w[1, 2] = float("nan")
    return w


@pytest.mark.parametrize(("tokens", "weights", "error", "message"), [
    ("the cat", None, TypeError, r"tokens must be a list of strings.*got a str: for its characters pass list\(text\)"),
    ([1, 2, 3], None, TypeError, r"tokens\[0\] is 1 \(an? int\); tokens must be strings"),
    ([], [], ValueError, r"tokens is empty"),
    (["a"] * (MAX_TOKENS + 1), None, ValueError, r"tokens has 513 tokens, more than the explorer shows \(512\)"),
    (list("abc"), torch.rand(2, 3, 3).softmax(-1), TypeError,
     r"weights must be a list with one \(H, L, L\) tensor per layer, got a Tensor of shape \(2, 3, 3\); "
     r"for one layer pass \[weights\]"),
    (list("abc"), [], ValueError, r"weights is an empty list"),
    (list("abc"), [[[1.0]]], TypeError, r"weights\[0\] must be a tensor \(or NumPy array\).*got list"),
    (list("abc"), [torch.ones(3, 3, dtype=torch.long)], TypeError, r"weights\[0\] must hold floating-point.*torch\.int64"),
    (list("abc"), [torch.eye(3)], ValueError, r"weights\[0\] must be \(H, L, L\) or \(1, H, L, L\), got shape \(3, 3\);"
     r" one head: pass w\[None\]"),
    (list("abc"), [torch.eye(3).expand(2, 4, 3, 3)], ValueError, r"got shape \(2, 4, 3, 3\); a batch of 2: pick one"),
    (list("abcd"), model_weights(3, layers=1), ValueError,
     r"weights\[0\] has shape \(4, 3, 3\), but there are 4 tokens: each layer must be \(H, 4, 4\)"),
    (list("abc"), [model_weights(3, heads=4)[0], model_weights(3, heads=2)[0]], ValueError,
     r"weights\[1\] has 2 heads but weights\[0\] has 4"),
    (list("abc"), [torch.rand(2, 3, 3).tril()], ValueError, r"weights\[0\], head 0, query 0 \('a'\): its weights sum "
     r"to .*, not 1: pass the softmax's weights"),
    (list("abc"), [torch.rand(2, 3, 3).softmax(-1)], ValueError, r"weights\[0\], head 0, query 0 \('a'\) gives the "
     r"later token 1 \('b'\) the weight .*: the explorer shows causal attention.*mask=causal_mask\(L\)"),
    (list("abc"), [torch.tensor([[[1.0, 0, 0], [1.5, -0.5, 0], [0.2, 0.3, 0.5]]])], ValueError,
     r"weights\[0\], head 0, query 1 \('b'\) gives key 1 the weight -0\.5: weights are >= 0"),
    (list("abcd"), [_nan_row()], ValueError, r"weights\[0\], head 1, query 2 \('c'\) holds nan: attention weights "
     r"are finite"),
])
def test_bad_inputs_are_refused_saying_what_is_wrong(tokens, weights, error, message) -> None:
    with pytest.raises(error, match=message):
        attention_explorer(tokens, weights if weights is not None else model_weights(3))


def test_title_must_be_text() -> None:
    with pytest.raises(TypeError, match=r"title must be a string or None, got 3 \(an? int\)"):
        attention_explorer(list("abc"), model_weights(3), title=3)


def test_a_batch_of_one_arrays_half_precision_and_a_gpu_style_tensor_are_accepted() -> None:
    w = model_weights(6)
    reference = attention_explorer(list("abcdef"), w).data()
    assert attention_explorer(list("abcdef"), [x[0] for x in w]).data() == reference
    assert attention_explorer(tuple("abcdef"), [x.numpy() for x in w]).data() == reference
    requires_grad = [x.clone().requires_grad_() for x in w]
    assert attention_explorer(list("abcdef"), requires_grad).data() == reference
    half = attention_explorer(list("abcdef"), [x.half() for x in w]).data()  # 16-bit: rows sum to 1 within 2e-2
    assert np.abs(np.array(half["w"]) - np.array(reference["w"])).max() <= 2, "half precision moved a weight by > 2e-3"


def test_the_stored_weights_round_trip_to_three_decimals() -> None:
    w = model_weights(len(TOKENS))
    explorer = attention_explorer(TOKENS, w, title="round </script> trip")
    data = stored_data(explorer._repr_html_())
    assert data["tokens"] == TOKENS and data["scale"] == SCALE == 1000
    assert (data["layers"], data["heads"]) == (2, 4)
    length = len(TOKENS)
    for layer in range(2):
        for head in range(4):
            flat = data["w"][layer][head]
            assert len(flat) == length * (length + 1) // 2, "only the lower triangle is stored"
            assert all(isinstance(v, int) and 0 <= v <= SCALE for v in flat)
            full = np.zeros((length, length))
            for q in range(length):
                full[q, :q + 1] = flat[q * (q + 1) // 2:(q + 1) * (q + 2) // 2]
            expected = w[layer][0, head].numpy()
            assert np.abs(full / SCALE - expected).max() <= 0.0005 + 1e-7, (layer, head)
            assert np.abs(full.sum(axis=1) / SCALE - 1).max() <= length * 0.0005


def test_the_html_loads_nothing_from_anywhere() -> None:
    markup = attention_explorer(TOKENS, model_weights(len(TOKENS)), title="offline")._repr_html_()
    assert not re.search(r"https?:|//[\w.-]+\.\w", markup), "a URL in the HTML"
    found = tags(markup)
    assert {t for t, _ in found} <= {"div", "style", "p", "code", "span", "br", "script"}, {t for t, _ in found}
    linked = [(t, a) for t, a in found if {"src", "href", "srcset", "action", "data"} & set(a)]
    assert not linked, f"elements that load something: {linked}"
    for word in ("@import", "url(", "import(", "require(", "fetch(", "XMLHttpRequest", "WebSocket", "ipywidgets",
                 "jupyter-widgets", "eval("):
        assert word not in markup, word
    scripts = [a for t, a in found if t == "script"]
    assert scripts == [{"type": "application/json", "class": "mx-data"}, {}], scripts


def test_every_view_has_ids_of_its_own() -> None:
    """Two explorers, and one shown twice: four ids; every CSS rule is scoped to its view's id."""
    one = attention_explorer(list("abc"), model_weights(3))
    other = attention_explorer(list("abc"), model_weights(3, seed=1))
    views = [one._repr_html_(), one._repr_html_(), other._repr_html_(), attention_explorer(list("abc"),
                                                                                           model_weights(3))._repr_html_()]
    ids = [a["id"] for markup in views for _, a in tags(markup) if "id" in a]
    assert len(ids) == 4 and len(set(ids)) == 4, ids
    for markup, uid in zip(views, ids):
        style = re.search(r"<style>(.*?)</style>", markup, re.S).group(1)
        selectors = [s.strip() for rule in re.findall(r"([^{}]+)\{", style) for s in rule.split(",")]
        assert selectors and all(s.startswith(f"#{uid} ") or s == f"#{uid}" for s in selectors), selectors
        assert f'getElementById("{uid}")' in markup


def test_tokens_are_escaped_and_their_whitespace_shown() -> None:
    assert [visible(t) for t in (" the", "\n", "a\tb", "\x07", "", "é")] == ["·the", "↵", "a⇥b", "\\x07", "∅", "é"]
    markup = attention_explorer(TOKENS, model_weights(len(TOKENS)), title="<i>title</i>")._repr_html_()
    text = re.search(r'<div class="mx-tokens">(.*?)</div>', markup, re.S).group(1)
    spans = re.findall(r'<span class="mx-tok" data-i="(\d+)">(.*?)</span>', text)
    assert [int(i) for i, _ in spans] == list(range(len(TOKENS)))
    assert spans[10][1] == "·&lt;b&gt;happy&lt;/b&gt;" and spans[11][1] == "·&amp;" and spans[7][1] == "↵"
    assert spans[13][1] == "·&#96;rich&#96;", "backticks would become <code> in the book"
    assert "</span><br>" in text and "<b>" not in text and "<i>title" not in markup
    assert "&lt;i&gt;title&lt;/i&gt;" in markup


def test_the_palette_is_matplotlibs_blues_and_readable() -> None:
    from matplotlib import colormaps

    blues = colormaps["Blues"]
    for w in np.linspace(0, 1, 41):
        expected = [round(c * 255) for c in blues(w)[:3]]
        # (matplotlib looks colours up in a table of 256: up to 2 apart where the ramp is steep)
        assert max(abs(a - b) for a, b in zip(colour(w), expected)) <= 2, (w, colour(w), expected)
    shades = [sum(colour(w)) for w in np.linspace(0, 1, 11)]
    assert shades == sorted(shades, reverse=True), "a heavier weight must be darker"


def test_the_static_figure_shows_every_head_with_token_labels() -> None:
    explorer = attention_explorer(TOKENS, model_weights(len(TOKENS)), title="all heads")
    fig = explorer.figure()
    try:
        maps = [ax for ax in fig.axes if ax.get_images()]
        assert len(maps) == 8, len(maps)
        assert [ax.get_title() for ax in maps[:5]] == ["layer 1 · head 0", "layer 1 · head 1", "layer 1 · head 2",
                                                       "layer 1 · head 3", "layer 2 · head 0"]
        assert [t.get_text() for t in maps[4].get_yticklabels()] == [visible(t) for t in TOKENS]
        assert [t.get_text() for t in maps[7].get_xticklabels()] == [visible(t) for t in TOKENS]
        shown = maps[1].get_images()[0].get_array()
        assert shown.mask[0, 1] and not shown.mask[1, 0], "later tokens are masked (grey)"
        assert fig.get_suptitle() == "all heads"
    finally:
        plt.close(fig)
    long = attention_explorer([f"t{i}" for i in range(100)], model_weights(100, layers=1, heads=1)).figure()
    try:
        assert len(long.axes[0].get_xticklabels()) <= 32
    finally:
        plt.close(long)


def test_the_view_of_128_tokens_2_layers_4_heads_is_small() -> None:
    """~66,000 weights in thousandths: under 250 kB (the module's docstring states the size)."""
    markup = attention_explorer([f" w{i}" for i in range(128)], model_weights(128))._repr_html_()
    assert sum(len(head) for layer in stored_data(markup)["w"] for head in layer) == 2 * 4 * 128 * 129 // 2
    assert len(markup.encode()) < 250_000, f"{len(markup.encode())} bytes"


# ----------------------------------------------------------------------------- in a browser

# Runs in the page: each token of one view, with its colour, and what is focused.
TOKENS_JS = """(root) => ({
    tokens: Array.from(root.querySelectorAll('.mx-tok')).map(t => ({
        background: getComputedStyle(t).backgroundColor, later: t.classList.contains('mx-later'),
        query: t.classList.contains('mx-query'), text: t.textContent,
        selected: t.getAttribute('aria-selected'), tabindex: t.tabIndex})),
    focused: root.contains(document.activeElement) && document.activeElement.classList.contains('mx-tok')
        ? Number(document.activeElement.dataset.i) : null,
    outline: document.activeElement ? getComputedStyle(document.activeElement).outlineStyle : null,
    readout: (root.querySelector('.mx-readout') || {}).textContent || '',
    pressed: Array.from(root.querySelectorAll('[aria-pressed="true"]')).map(b => b.getAttribute('aria-label')),
})"""


def rgb(css: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", css)[:3])


def check_colours(state: dict, tokens: list[str], weights: list[torch.Tensor], layer: int, head: int, query: int,
                  where: str) -> None:
    """Every token up to the query has the palette's colour of the weight it gets from the query;
    later ones have none; the read-out names the heaviest key first, with its stored weight."""
    row = weights[layer][0, head, query].numpy()
    stored = np.rint(row[:query + 1] * SCALE).astype(int)  # as the page stores them
    shown_tokens = state["tokens"]
    assert [t["text"] for t in shown_tokens] == [visible(t) for t in tokens], f"{where}: the tokens differ"
    assert [t["query"] for t in shown_tokens].index(True) == query, f"{where}: the query is not token {query}"
    for k, token in enumerate(shown_tokens):
        if k > query:
            assert token["later"] and rgb(token["background"]) == (0, 0, 0), f"{where}: later token {k}: {token}"
            continue
        shown, expected = rgb(token["background"]), colour(row[k])
        assert max(abs(a - b) for a, b in zip(shown, expected)) <= 1, (
            f"{where}: layer {layer + 1}, head {head}, query {query}: token {k} has weight {row[k]:.3f}, "
            f"coloured {shown}, expected {expected}")
    heaviest = int(np.argmax(stored))  # the first of equals, as the page sorts them
    assert f"Layer {layer + 1}, head {head}: " in state["readout"], state["readout"]
    expected = (f"the most weight to \u201c{visible(tokens[heaviest])}\u201d ({heaviest}) "
                f"{stored[heaviest] / SCALE:.3f}")
    assert expected in state["readout"], f"{where}: {state['readout']!r} lacks {expected!r}"


def page_with(views: list[str]) -> str:
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>explorer</title></head><body>"
            + "<h1>Two explorers</h1>" + "".join(views) + "</body></html>")


def _watch(page, allowed: str) -> list[str]:
    """Record console errors, page errors and every request that doesn't start with ``allowed``
    (refused: nothing else is reachable)."""
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def refuse(route) -> None:
        if route.request.url.startswith((allowed, "data:")):
            route.continue_()
        else:
            problems.append(f"request: {route.request.url}")
            route.abort()
    page.route("**/*", refuse)
    return problems


@pytest.mark.browser
def test_hover_keys_and_buttons_colour_the_tokens_by_their_weights(tmp_path: Path, sync_playwright) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    first, second = model_weights(len(TOKENS)), model_weights(len(TOKENS), seed=1)
    views = [attention_explorer(TOKENS, first, title="first")._repr_html_(),
             attention_explorer(TOKENS, second, title="second")._repr_html_()]
    (tmp_path / "page.html").write_text(page_with(views), encoding="utf-8")
    a, b = (f"#{view_id(v)}" for v in views)
    last = len(TOKENS) - 1
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            problems = _watch(page, "file://")
            page.goto((tmp_path / "page.html").as_uri(), wait_until="load")
            state = lambda view: page.locator(view).evaluate(TOKENS_JS)  # noqa: E731
            assert page.locator(".mx-nojs").count() == 0, "the note for when no script runs is still shown"
            check_colours(state(a), TOKENS, first, 0, 0, last, "at first")
            before_b = state(b)

            page.locator(f"{a} .mx-tok").nth(5).hover()
            check_colours(state(a), TOKENS, first, 0, 0, 5, "hover")
            assert state(b) == before_b, "hovering in one explorer changed the other"

            page.locator(f"{a} button[aria-label='head 2']").click()
            check_colours(state(a), TOKENS, first, 0, 2, 5, "head 2")
            page.locator(f"{a} button[aria-label='layer 2']").click()
            check_colours(state(a), TOKENS, first, 1, 2, 5, "layer 2")
            assert state(a)["pressed"][:2] == ["layer 2", "head 2"]

            # The keyboard: Tab from the last head button enters the text at the query, the arrows move it.
            page.locator(f"{a} button[aria-label='head 3']").focus()
            page.keyboard.press("Enter")
            page.keyboard.press("Tab")
            seen = state(a)
            assert seen["focused"] == 5 and seen["outline"] != "none", f"Tab went elsewhere: {seen['focused']}"
            page.keyboard.press("ArrowLeft")
            seen = state(a)
            assert seen["focused"] == 4 and seen["outline"] != "none"
            check_colours(seen, TOKENS, first, 1, 3, 4, "ArrowLeft")
            assert [t["tabindex"] for t in seen["tokens"]].count(0) == 1, "one tab stop in the text"
            page.keyboard.press("Home")
            check_colours(state(a), TOKENS, first, 1, 3, 0, "Home")
            page.keyboard.press("End")
            check_colours(state(a), TOKENS, first, 1, 3, last, "End")
            page.keyboard.press("ArrowRight")  # at the end: stays
            check_colours(state(a), TOKENS, first, 1, 3, last, "ArrowRight at the end")
            page.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)

            # The grid of every head: clicking a map shows that head.
            page.locator(f"{a} .mx-cell[aria-label^='layer 1, head 1:']").click()
            check_colours(state(a), TOKENS, first, 0, 1, last, "grid")
            labels = page.locator(f"{a} .mx-cell").evaluate_all("cs => cs.map(c => c.getAttribute('aria-label'))")
            assert len(labels) == 8 and all("gives the most weight to" in label for label in labels), labels
            assert state(b) == before_b
        finally:
            browser.close()
    assert not problems, problems


# --------------------------------------------------------------------------- (b) JupyterLab

def _notebook(cells: list[dict]) -> str:
    return json.dumps({"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                   "language": "python"},
                                                    "language_info": {"name": "python"}},
                       "nbformat": 4, "nbformat_minor": 5}, indent=1)


def _run_the_cell() -> tuple[list[str], list[torch.Tensor]]:
    """The tokens and weights the notebook's cell makes (the same seed and code, here)."""
    namespace: dict = {}
    exec(compile(MODEL_CELL, "<the notebook's cell>", "exec"), namespace)  # noqa: S102 - the test's own code
    return namespace["tokens"], namespace["weights"]


KERNEL_IDLE_JS = """() => Array.from(document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem'))
    .some(e => /^(?!No Kernel).+ \\| Idle$/.test(e.textContent.trim()))"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """JupyterLab on loopback serving a temporary folder, with its own settings and trust database
    (JUPYTER_DATA_DIR), so that a notebook the test writes is untrusted, as a cloned one is."""
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    root.mkdir()
    settings = base / "settings" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"windowingMode": "none"}))
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(base / "settings"), JUPYTER_DATA_DIR=str(base / "data"),
               JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"), JUPYTER_RUNTIME_DIR=str(base / "runtime"),
               IPYTHONDIR=str(base / "ipython"), MPLBACKEND="module://matplotlib_inline.backend_inline",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    log = base / "jupyter.log"
    process, url, token = start_lab(root, [], env, log)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, f"JupyterLab exited:\n{log.read_text(errors='replace')[-3000:]}"
            try:
                request = urllib.request.Request(f"{url}/api/status", headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            assert time.monotonic() < deadline, f"JupyterLab did not answer:\n{log.read_text(errors='replace')[-3000:]}"
            time.sleep(0.25)
        yield f"{url}/lab/tree/{{}}?token={token}", root
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the server led its own session: its kernels go with it
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.browser
def test_in_jupyterlab_a_stored_output_says_run_the_cell_and_a_run_one_answers_hover_and_keys(
        lab: tuple[str, Path], sync_playwright) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    address, root = lab
    tokens, weights = _run_the_cell()
    stored = attention_explorer(tokens, weights, title="a tiny random model")
    cells = [
        {"cell_type": "markdown", "id": "title", "metadata": {}, "source": "# Every head"},
        {"cell_type": "code", "id": "explore", "metadata": {}, "execution_count": 1, "source": MODEL_CELL,
         "outputs": [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                      "data": {"text/plain": repr(stored), "text/html": stored._repr_html_()}}]},
        {"cell_type": "code", "id": "after", "metadata": {}, "execution_count": None, "source": "print('after')",
         "outputs": []},
    ]
    (root / "explorer.ipynb").write_text(_notebook(cells), encoding="utf-8")
    view = ".jp-OutputArea-output .mha-explorer"
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            problems = _watch(page, address.split("/lab/")[0])
            page.goto(address.format("explorer.ipynb"), timeout=90_000)
            page.locator(view).first.wait_for(timeout=90_000)
            # Untrusted (not made in this session): sanitized, no script ran; the tokens and the note show.
            note = page.locator(f"{view} .mx-nojs")
            assert note.is_visible() and "Run the cell to explore" in note.inner_text()
            assert page.locator(f"{view} .mx-controls").count() == 0, "a script ran in an untrusted output"
            assert page.locator(f"{view} .mx-tokens").inner_text() == "The·cat·sat·on·the·mat."
            page.screenshot(path=str(ARTIFACTS / "lab_stored.png"))

            page.wait_for_function(KERNEL_IDLE_JS, timeout=90_000, polling=250)
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
            page.locator("#jp-mainmenu-run .lm-Menu-item",
                         has=page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$"))).click()
            page.locator(f"{view} .mx-controls").wait_for(timeout=120_000)
            page.wait_for_function(KERNEL_IDLE_JS, timeout=60_000, polling=250)
            assert page.locator(view).count() == 1 and page.locator(f"{view} .mx-nojs").count() == 0
            state = lambda: page.locator(view).evaluate(TOKENS_JS)  # noqa: E731
            check_colours(state(), tokens, weights, 0, 0, 6, "after the run")

            page.locator(f"{view} .mx-tok").nth(3).hover()
            check_colours(state(), tokens, weights, 0, 0, 3, "hover")
            page.locator(f"{view} button[aria-label='head 1']").click()
            page.locator(f"{view} button[aria-label='layer 2']").click()
            check_colours(state(), tokens, weights, 1, 1, 3, "layer 2, head 1")

            page.locator(f"{view} .mx-tok").nth(3).click()
            active = "() => Array.from(document.querySelectorAll('.jp-Notebook .jp-Cell')).findIndex(c => " \
                     "c.classList.contains('jp-mod-active'))"
            cell = page.evaluate(active)
            for key, query in (("ArrowLeft", 2), ("ArrowUp", 1), ("ArrowDown", 2), ("End", 6)):
                page.keyboard.press(key)
                seen = state()
                assert seen["focused"] == query, f"{key}: focus on token {seen['focused']}, expected {query}"
                check_colours(seen, tokens, weights, 1, 1, query, key)
                assert page.evaluate(active) == cell, f"{key} also moved JupyterLab's cell selection"
            page.locator(view).scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "lab_run.png"))
        finally:
            browser.close()
    assert not problems, problems


# ---------------------------------------------------------------------------- (c) the web book

@pytest.mark.browser
def test_in_the_web_book_the_stored_output_answers_a_hover(tmp_path: Path, sync_playwright) -> None:
    """book/build.py on a one-chapter course whose cell stores two explorers: both are
    interactive in the built page, MathJax and the hints' backticks leave the tokens alone."""
    sys.path.insert(0, str(ROOT / "book"))
    import build as book_build  # book/build.py

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    first, second = model_weights(len(TOKENS)), model_weights(len(TOKENS), seed=1)
    outputs = [{"output_type": "display_data", "metadata": {},
                "data": {"text/plain": repr(e), "text/html": e._repr_html_()}}
               for e in (attention_explorer(TOKENS, first, title="first"),
                         attention_explorer(TOKENS, second, title="second"))]
    cells = [{"cell_type": "markdown", "id": "t", "metadata": {}, "source": "# Chapter 01 · Explore\n\nSome $x^2$."},
             {"cell_type": "code", "id": "c", "metadata": {}, "execution_count": 1, "source": "explore()",
              "outputs": outputs}]
    root = tmp_path / "course"
    (root / "chapters").mkdir(parents=True)
    (root / "chapters" / "01_explore.ipynb").write_text(_notebook(cells), encoding="utf-8")
    src, out = tmp_path / "src", tmp_path / "book"
    book_build.stage(src, root=root, repo={"url": "", "branch": "main", "configured": False})
    book_build.build(out, src)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    site = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with sync_playwright() as p:
            browser = launch(p)
            try:
                page = browser.new_page(viewport=VIEWPORT)
                problems = _watch(page, site)
                page.goto(f"{site}/chapters/01_explore.html", wait_until="load", timeout=60_000)
                page.evaluate("async () => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
                              "{ await MathJax.startup.promise; } }")
                views = page.locator("article .mha-explorer")
                assert views.count() == 2, f"{views.count()} explorers in the page"
                a, b = (f"#{views.nth(i).get_attribute('id')}" for i in range(2))
                assert page.locator("article .mx-controls").count() == 2, "a script did not run in the book"
                assert page.locator("article .mha-explorer mjx-container").count() == 0, "MathJax typeset a token"
                assert page.locator("article mjx-container").count() >= 1, "the page's own formula is not typeset"
                before_b = page.locator(b).evaluate(TOKENS_JS)
                assert [t["text"] for t in before_b["tokens"]] == [visible(t) for t in TOKENS]
                page.locator(f"{a} .mx-tok").nth(9).hover()
                check_colours(page.locator(a).evaluate(TOKENS_JS), TOKENS, first, 0, 0, 9, "hover in the book")
                page.locator(f"{a} button[aria-label='head 3']").click()
                check_colours(page.locator(a).evaluate(TOKENS_JS), TOKENS, first, 0, 3, 9, "head 3 in the book")
                assert page.locator(b).evaluate(TOKENS_JS) == before_b, "one explorer changed the other"
                page.locator(a).scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / "book.png"))
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert not problems, problems


# --------------------------------------------------------------- chapter 09's stored explorer

SNIPPET_09 = "        self.assertEqual(x, 1)\n        self.assertEqual(y, 2)\n"  # the text chapter 09 explores


def chapter_09_explorer() -> str:
    """The explorer's HTML as chapter 09's notebook stores it (one explorer in the chapter)."""
    notebook = json.loads((ROOT / "chapters" / "09_heads_in_a_language_model.ipynb").read_text(encoding="utf-8"))
    found = ["".join(out["data"]["text/html"]) for cell in notebook["cells"] if cell["cell_type"] == "code"
             for out in cell.get("outputs", []) if "mha-explorer" in "".join(out.get("data", {}).get("text/html", ""))]
    assert len(found) == 1, f"chapter 09 stores {len(found)} explorers, expected 1"
    return found[0]


def shipped_weights_09() -> tuple[list[str], list[torch.Tensor]]:
    """The tokens and each layer's (1, H, L, L) weights of the shipped model on chapter 09's snippet."""
    from mha_lib.textlm import load_checkpoint

    model, tokenizer, _ = load_checkpoint()
    ids = torch.tensor([tokenizer.encode(SNIPPET_09)])
    with torch.no_grad():
        _, weights = model(ids, return_weights=True)
    return [repr(t)[1:-1] for t in tokenizer.tokens(ids[0].tolist())], weights


def test_chapter_09_stores_the_shipped_models_weights_on_its_snippet() -> None:
    data = stored_data(chapter_09_explorer())
    tokens, weights = shipped_weights_09()
    assert data["tokens"] == tokens
    assert (data["layers"], data["heads"]) == (2, 4)
    length = len(tokens)
    for layer in range(2):
        for head in range(4):
            flat = data["w"][layer][head]
            full = np.zeros((length, length))
            for q in range(length):
                full[q, :q + 1] = flat[q * (q + 1) // 2:(q + 1) * (q + 2) // 2]
            # stored to 3 decimals; another CPU's kernels move a weight by far less than that
            assert np.abs(full / SCALE - weights[layer][0, head].numpy()).max() <= 0.0005 + 1e-4, (layer, head)


@pytest.mark.browser
def test_chapter_09s_stored_explorer_answers_hover_and_buttons(tmp_path: Path, sync_playwright) -> None:
    """The output chapter 09 ships (not a tiny model's): in a page with nothing else reachable,
    hovering a token and switching layer and head colour the tokens by the shipped model's weights."""
    markup = chapter_09_explorer()
    tokens, weights = shipped_weights_09()
    (tmp_path / "page.html").write_text(page_with([markup]), encoding="utf-8")
    view = f"#{view_id(markup)}"
    query = tokens.index("y")  # the second line's argument: it has a line above to look at
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            problems = _watch(page, "file://")
            page.goto((tmp_path / "page.html").as_uri(), wait_until="load")
            state = lambda: page.locator(view).evaluate(TOKENS_JS)  # noqa: E731
            page.locator(f"{view} .mx-tok").nth(query).hover()
            check_colours(state(), tokens, weights, 0, 0, query, "chapter 09, hover")
            page.locator(f"{view} button[aria-label='layer 2']").click()
            page.locator(f"{view} button[aria-label='head 3']").click()
            check_colours(state(), tokens, weights, 1, 3, query, "chapter 09, layer 2 head 3")
        finally:
            browser.close()
    assert not problems, problems
