"""The book's figures: alt text and a caption from each figure's title, and images light enough
for the web. Used by build.py on its copy of the notebooks; the committed notebooks keep theirs.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import re
import string
from pathlib import Path

# ------------------------------------------------------------------------------- figures
# Every figure gets alt text and a caption from its title, as the cell's code sets it:
# fig.suptitle(...), a title= argument (plot_attention(..., title=...), ax.set(title=...)),
# ax.set_title(...) or plt.title(...); without a title, from its axis labels. F-strings are
# filled in where the names they use are plain constants of the notebook or loop variables
# over literal ranges and tuples (``f"layer {layer + 1}"`` in ``for layer in range(2)``), else
# "…". They go into the build copy's cell metadata (``mystnb: {image: {alt}, figure:
# {caption}}``), which myst-nb turns into <img alt> and <figcaption>; a cell that shows more
# than one figure, or a figure and other rich outputs, is split into one output cell per figure.
FIGURE_MIMES = ("image/png", "image/jpeg", "image/svg+xml", "image/gif")
UNKNOWN = object()
MAX_LOOP = 16


def _value(node: ast.AST, env: dict):
    """A constant expression's value (numbers, strings, tuples, arithmetic, names bound in
    ``env``); UNKNOWN for anything else. Nothing is executed."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id, UNKNOWN)
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_value(e, env) for e in node.elts]
        return UNKNOWN if any(i is UNKNOWN for i in items) else tuple(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _value(node.operand, env)
        return -v if isinstance(v, (int, float)) else UNKNOWN
    if isinstance(node, ast.BinOp):
        a, b = _value(node.left, env), _value(node.right, env)
        ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
               ast.FloorDiv: lambda x, y: x // y, ast.Div: lambda x, y: x / y, ast.Mod: lambda x, y: x % y}
        if a is UNKNOWN or b is UNKNOWN or type(node.op) not in ops:
            return UNKNOWN
        if isinstance(node.op, ast.Mod) and isinstance(a, str):
            return UNKNOWN  # %-formatting
        try:
            return ops[type(node.op)](a, b)
        except Exception:  # noqa: BLE001 - a type mismatch: not a constant we can know
            return UNKNOWN
    if isinstance(node, ast.JoinedStr):
        return _text(node, env)
    return UNKNOWN


def _text(node: ast.AST, env: dict) -> str | None:
    """A string argument's text: literals as written, f-strings filled in where possible."""
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
                continue
            value = _value(part.value, env)
            spec = part.format_spec
            spec_text = _text(spec, env) if spec is not None else ""
            try:
                if value is UNKNOWN or spec_text is None:
                    raise ValueError
                value = {115: str, 114: repr, 97: ascii}.get(part.conversion, lambda v: v)(value)
                parts.append(format(value, spec_text))
            except (ValueError, TypeError):
                parts.append("…")
        return "".join(parts)
    value = _value(node, env)
    return value if isinstance(value, str) else None


def _bind(target: ast.AST, value, env: dict) -> None:
    if isinstance(target, ast.Name):
        if value is UNKNOWN:
            env.pop(target.id, None)
        else:
            env[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        items = value if isinstance(value, tuple) and len(value) == len(target.elts) else [UNKNOWN] * len(target.elts)
        for t, v in zip(target.elts, items):
            _bind(t, v, env)


def _items(node: ast.AST, env: dict):
    """A literal sequence as a tuple whose unknown elements are UNKNOWN (``[("a", x), ("b", y)]``
    with x, y unknown: ``(("a", UNKNOWN), ("b", UNKNOWN))``); else the value, or UNKNOWN."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_items(e, env) for e in node.elts)
    return _value(node, env)


def _iterations(loop: ast.For, env: dict) -> list:
    """The values a for loop's target takes, where the loop is over literals; [UNKNOWN] otherwise."""
    it = loop.iter
    values = UNKNOWN
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
        args = [_items(a, env) for a in it.args]
        name = it.func.id
        if name == "range" and args and all(isinstance(a, int) for a in args):
            values = tuple(range(*args))
        elif name == "zip" and args:
            known = [a for a in args if isinstance(a, tuple)]
            if known:
                n = min(len(a) for a in known)
                values = tuple(tuple(a[i] if isinstance(a, tuple) else UNKNOWN for a in args) for i in range(n))
        elif name == "enumerate" and len(args) == 1 and isinstance(args[0], tuple):
            values = tuple(enumerate(args[0]))
    else:
        value = _items(it, env)
        if isinstance(value, tuple):
            values = value
    if values is UNKNOWN or len(values) > MAX_LOOP:
        return [UNKNOWN]
    return list(values)


class _FigureText:
    """What one code cell says about its figures, in the order the code runs."""

    def __init__(self, env: dict) -> None:
        self.env = env
        self.suptitles: list[str] = []
        self.titles: list[str] = []
        self.xlabels: list[str] = []
        self.ylabels: list[str] = []

    def run(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue  # a helper's body runs when it is called, with arguments we don't know
            if isinstance(statement, ast.For):
                for value in _iterations(statement, self.env):
                    _bind(statement.target, value, self.env)
                    self.run(statement.body)
                continue
            self._calls(statement)
            if isinstance(statement, ast.Assign):
                value = _value(statement.value, self.env)
                for target in statement.targets:
                    _bind(target, value, self.env)
            elif isinstance(statement, (ast.If, ast.With, ast.Try)):
                for block in ("body", "orelse", "finalbody"):
                    self.run(getattr(statement, block, []) or [])

    def _calls(self, statement: ast.stmt) -> None:
        nodes = [statement]
        if isinstance(statement, (ast.If, ast.With, ast.Try)):
            nodes = [getattr(statement, "test", None)] + list(getattr(statement, "items", []))
        for root in nodes:
            if root is None:
                continue
            for node in sorted((n for n in ast.walk(root) if isinstance(n, ast.Call)),
                               key=lambda n: (n.lineno, n.col_offset)):
                self._call(node)

    def _call(self, node: ast.Call) -> None:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        first = _text(node.args[0], self.env) if node.args else None
        if name == "suptitle" and first:
            self.suptitles.append(first)
        elif name in ("set_title", "title") and first:
            self.titles.append(first)
        elif name in ("set_xlabel", "xlabel") and first:
            self.xlabels.append(first)
        elif name in ("set_ylabel", "ylabel") and first:
            self.ylabels.append(first)
        for keyword in node.keywords:
            text = _text(keyword.value, self.env) if keyword.arg else None
            if not text:
                continue
            {"suptitle": self.suptitles, "title": self.titles, "xlabel": self.xlabels,
             "ylabel": self.ylabels}.get(keyword.arg, []).append(text)


def _python(source: str) -> ast.Module | None:
    """The cell's code as Python (IPython's %magics and !commands left out), or None."""
    lines = ["pass" if re.match(r"\s*[%!]", line) else line for line in source.split("\n")]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _constants(tree: ast.Module | None, env: dict) -> None:
    """Names a cell binds to constants at its top level (``L = 12``), for later f-strings."""
    for statement in tree.body if tree else []:
        if isinstance(statement, ast.Assign):
            value = _value(statement.value, env)
            for target in statement.targets:
                _bind(target, value, env)


def one_line(text: str) -> str:
    return " ".join(text.split())


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(one_line(i) for i in items if i.strip()))


def figure_captions(source: str, figures: int, env: dict) -> list[str | None]:
    """A caption for each of the ``figures`` a cell with this source shows (None: no title found)."""
    tree = _python(source)
    found = _FigureText(dict(env))
    if tree is not None:
        found.run(tree.body)
    suptitles, titles = _unique(found.suptitles), _unique(found.titles)
    if figures > 1 and len(suptitles) == figures:
        return suptitles
    if figures == 1:
        if suptitles and titles and any("…" in t for t in suptitles) and not any("…" in t for t in titles):
            # a suptitle with a part only the run knows: the panels' titles say more
            return ["; ".join(titles[:4]) + f" ({'; '.join(suptitles)})"]
        if suptitles:
            return ["; ".join(suptitles)]
        if titles:
            return ["; ".join(titles[:4]) + ("; …" if len(titles) > 4 else "")]
        ys, xs = _unique(found.ylabels), _unique(found.xlabels)
        if ys and xs:
            text = f"{'; '.join(ys[:3])} against {'; '.join(xs[:2])}"
            return [text[0].upper() + text[1:]]
        return [None]
    if not suptitles and len(titles) == figures:
        return titles
    base = "; ".join((suptitles or titles)[:3])
    return [f"{base} ({i} of {figures})" if base else None for i in range(1, figures + 1)]


def markdown_text(text: str) -> str:
    """``text`` as Markdown that shows it literally (every ASCII punctuation mark escaped)."""
    return "".join("\\" + c if c in string.punctuation else c for c in one_line(text))


def _is_figure(output: dict) -> bool:
    return output.get("output_type") in ("display_data", "execute_result") and any(
        m in output.get("data", {}) for m in FIGURE_MIMES)


def caption_figures(cells: list[dict], where: str) -> list[dict]:
    """The cells with alt text and a caption on every figure (see above); ``where`` names the
    page in the fallback alt text."""
    out: list[dict] = []
    env: dict = {}
    number = 0
    for cell in cells:
        if cell["cell_type"] != "code":
            out.append(cell)
            continue
        source = "".join(cell["source"])
        outputs = cell.get("outputs", [])
        figures = [o for o in outputs if _is_figure(o)]
        if not figures:
            out.append(cell)
            _constants(_python(source), env)
            continue
        captions = figure_captions(source, len(figures), env)
        _constants(_python(source), env)
        options = []
        for caption in captions:
            number += 1
            alt = caption or f"Figure {number} of {where}, drawn by the code above"
            option = {"image": {"alt": one_line(alt)}}
            if caption:
                option["figure"] = {"caption": markdown_text(caption)}
            options.append(option)
        rich = [o for o in outputs if o.get("output_type") in ("display_data", "execute_result")]
        if len(figures) == 1 and len(rich) == 1:
            cell["metadata"] = {**cell.get("metadata", {}), "mystnb": {**cell["metadata"].get("mystnb", {}),
                                                                       **options[0]}}
            out.append(cell)
            continue
        # Several figures, or a figure and other rich outputs: one cell per figure, so that each
        # has its own caption and nothing else is captioned; the later cells show outputs only.
        segments: list[tuple[list[dict], dict | None]] = [([], None)]
        figure = iter(options)
        for output in outputs:
            if _is_figure(output):
                segments.append(([output], next(figure)))
                segments.append(([], None))
            else:
                segments[-1][0].append(output)
        for i, (chunk, option) in enumerate(s for k, s in enumerate(segments) if k == 0 or s[0]):
            metadata = dict(cell.get("metadata", {}))
            if option:
                metadata["mystnb"] = {**metadata.get("mystnb", {}), **option}
            if i:
                metadata["tags"] = [*metadata.get("tags", []), "remove-input"]
            out.append({**cell, "id": f"{cell.get('id', 'cell')}-{i}" if i else cell.get("id", "cell"),
                        # (myst-nb skips a cell without source; remove-input hides this one)
                        "metadata": metadata, "source": source if i == 0 else f"# output {i} of the cell above",
                        "outputs": chunk,
                        "execution_count": cell.get("execution_count") if i == 0 else None})
    return out


# ------------------------------------------------------------------------ light images
# The notebooks draw figures at twice their pixels (retina PNGs, 24-bit colour). Matplotlib's
# figures use few colours, so a 256-colour palette shows them the same: the book keeps the
# palette version when its pixels differ from the original's by less than PALETTE_MEAN_ERROR
# (in 0..255, averaged over pixels and channels) and it is smaller. That halves what a reader
# downloads, and keeps the built book under 10 MB.
PALETTE_MEAN_ERROR = 1.0


def lighter_png(data: str) -> str:
    """A base64 PNG as a 256-colour palette PNG when that is as good to the eye and smaller, else as is."""
    import numpy as np
    from PIL import Image

    raw = base64.b64decode(data)
    image = Image.open(io.BytesIO(raw))
    if image.mode not in ("RGB", "RGBA") or (image.mode == "RGBA" and image.getextrema()[3][0] < 255):
        return data  # transparent pixels: a palette would need care; rare in the course's figures
    rgb = image.convert("RGB")
    palette = rgb.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    error = np.abs(np.asarray(palette.convert("RGB"), dtype=np.int16) - np.asarray(rgb, dtype=np.int16)).mean()
    out = io.BytesIO()
    palette.save(out, format="png", optimize=True)
    if error >= PALETTE_MEAN_ERROR or out.tell() >= len(raw):
        return data
    return base64.b64encode(out.getvalue()).decode("ascii")


def lighter_figures(cells: list[dict], cache: Path | None = None) -> None:
    """Every PNG figure in ``cells`` through :func:`lighter_png`, in place; with ``cache`` (a
    folder), each result is kept there under the original's hash, so a rebuild takes no time."""
    for cell in cells:
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            data = output.get("data", {})
            if "image/png" not in data:
                continue
            png = "".join(data["image/png"]) if isinstance(data["image/png"], list) else data["image/png"]
            png = "".join(png.split())
            kept = cache / f"{hashlib.sha256(png.encode()).hexdigest()}.b64" if cache else None
            if kept is not None and kept.exists():
                data["image/png"] = kept.read_text()
                continue
            data["image/png"] = lighter_png(png)
            if kept is not None:
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(data["image/png"])
