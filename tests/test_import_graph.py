"""The package's import graph: no circles, and no module imports from a layer above its own.

Every module of ``specc`` is parsed with ``ast`` (nothing is imported, so the test is fast and sees imports
inside functions too); ``from x import y`` counts as an import of the submodule ``x.y`` where there is one,
else of ``x``. Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``: those implicit edges are
left out, as import linters do (a package's ``__init__`` re-exporting its modules would otherwise tie every
module to all of its siblings).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "specc"

# The layers, lowest first: a module may import from its own layer and the layers below it. Each entry names
# modules and packages by prefix (the longest match wins); ``specc`` itself (specc/__init__.py) is the Python API
# over the backends, parallel and training code, so it sits above them and below the CLI.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("specc.errors", "specc.version"),
    ("specc.io", "specc.cache", "specc._generated"),  # reading and writing files, the private code cache
    ("specc.spec",),
    ("specc.ir",),
    ("specc.analysis", "specc.interop"),  # both read the IR; neither imports the other
    ("specc.backends", "specc.backends.torch"),
    ("specc.backends.onnx",),  # reuses the torch backend's RoPE tables, weight checks and random init
    ("specc.runtime",),
    ("specc.checkpoint_format",),  # the training checkpoint's format, read by parallel and train
    ("specc.parallel",),
    ("specc.train",),
    ("specc",),
    ("specc.cli", "specc.__main__", "specc.demo"),
)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def where(self) -> str:
        return f"{_path(self.source)}:{self.line}: {self.source} -> {self.target}"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _path(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _imports(module: str) -> Iterator[Edge]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def known(name: str) -> str | None:  # the module a dotted name lives in (a.b.func → a.b)
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in MODULES else origin for a in node.names]
        for name in targets:
            target = known(name) if name == PACKAGE or name.startswith(PACKAGE + ".") else None
            if target is not None and target != module:
                yield Edge(module, target, node.lineno)


EDGES = [edge for module in MODULES for edge in _imports(module)]


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for e in EDGES:
        g.add_edge(e.source, e.target, edge=e)
    return g


def _cycles() -> dict[frozenset[str], str]:
    """Each circle (a strongly connected component of more than one module) with one loop through it."""
    g = _graph()
    found = {}
    for component in nx.strongly_connected_components(g):
        if len(component) > 1:
            loop = nx.find_cycle(g.subgraph(component))
            found[frozenset(component)] = "\n    ".join(g.edges[a, b]["edge"].where() for a, b in loop)
    return found


def _layer(module: str) -> int:
    best = max(
        ((len(prefix), i) for i, names in enumerate(LAYERS) for prefix in names if _within(module, prefix)),
        default=None,
    )
    assert best is not None, f"{_path(module)}: module {module} is in no layer of LAYERS"
    return best[1]


def _within(module: str, prefix: str) -> bool:
    if prefix == PACKAGE:
        return module == PACKAGE
    return module == prefix or module.startswith(prefix + ".")


def test_the_graph_sees_imports_of_every_form() -> None:
    """The parser finds relative, submodule and function-local imports (a check of the checker)."""
    edges = {(e.source, e.target) for e in EDGES}
    assert ("specc.spec.loader", "specc.io.read") in edges  # from ..io import read: the submodule, not the package
    assert ("specc.io", "specc.io.atomic") in edges  # from .atomic import ... in a package's __init__
    assert ("specc", "specc.backends.torch.build") in edges  # inside a function: from .backends.torch.build import
    assert all(not e.target.endswith(".__init__") for e in EDGES)


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)


def test_no_import_circles() -> None:
    cycles = _cycles()
    listed = "\n".join(f"  {', '.join(sorted(c))}:\n    {loop}" for c, loop in cycles.items())
    assert not cycles, "import circles:\n" + listed


def test_no_import_from_a_layer_above() -> None:
    upward = [
        f"{e.where()} (layer {_layer(e.source)} imports layer {_layer(e.target)})"
        for e in EDGES
        if _layer(e.target) > _layer(e.source)
    ]
    assert not upward, "imports from a higher layer:\n  " + "\n  ".join(upward)
