"""No import circle among ``mha_lib``'s modules (issue 34).

Every ``import`` statement of every module counts, also those inside functions and under
``if TYPE_CHECKING:`` (a type hint that needs another module still ties the two together). A
package that re-exports its parts (``from .tensors import check_qkv`` in ``validation/__init__``)
is read through: ``from ..validation import check_qkv`` depends on ``validation.tensors``, and
``from .. import masks`` on ``mha_lib.masks``, not on every module the package gathers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> Iterator[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every import statement of the file."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield from ((module, alias.name) for alias in node.names)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Which of ``package``'s modules each of them imports, re-exports read through."""
    files = {_module_name(path, root): path for path in sorted((root / package).rglob("*.py"))}
    raw = {name: list(_imports(path, name)) for name, path in files.items()}

    def resolve(module: str, attr: str | None, seen: tuple[str, ...] = ()) -> str:
        if attr is None:
            return module
        if f"{module}.{attr}" in files:  # from package import submodule
            return f"{module}.{attr}"
        if files[module].name == "__init__.py" and module not in seen:  # a name the package re-exports
            for source, name in raw[module]:
                if name == attr and source in files and source != module:
                    return resolve(source, attr, (*seen, module))
        return module

    return {name: {resolve(m, a) for m, a in raw[name] if m in files} - {name} for name in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_mha_lib() -> None:
    graph = import_graph(ROOT, "mha_lib")
    assert graph["mha_lib.multi_head"] >= {"mha_lib.validation.tensors", "mha_lib.validation.sizes"}  # read through
    back = sorted((a, b) for a in graph for b in graph[a] if a < b and a in graph[b])
    assert back == [], f"modules that import each other: {back}"
    assert circles(graph) == [], f"import circles among mha_lib's modules: {circles(graph)}"


def test_the_graph_sees_a_circle_through_a_type_hint(tmp_path: Path) -> None:
    """The circle issue 34 found: validation imported the cache for a type hint only."""
    package = tmp_path / "lib"
    (package / "validation").mkdir(parents=True)
    (package / "__init__.py").write_text("from .inference import KVCache\nfrom . import validation\n")
    (package / "validation" / "__init__.py").write_text("from .tensors import check_cache\n")
    (package / "validation" / "tensors.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..inference import KVCache\n"
        "def check_cache(cache: 'KVCache') -> None: ...\n")
    (package / "inference.py").write_text("from .validation import check_cache\nclass KVCache: ...\n")
    graph = import_graph(tmp_path, "lib")
    assert graph["lib.inference"] == {"lib.validation.tensors"}
    assert circles(graph) == [["lib.inference", "lib.validation.tensors"]]
    (package / "validation" / "tensors.py").write_text("def check_cache(cache: object) -> None: ...\n")
    assert circles(import_graph(tmp_path, "lib")) == []
