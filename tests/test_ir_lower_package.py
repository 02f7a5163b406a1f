"""The lowering package imports one way: the entry point → a model kind made of towers (``dual_encoder``) → one
module per model kind → the Transformer stack (``blocks``) → the shared ``context``; no module imports one above it
or a sibling of its own rank."""

from __future__ import annotations

import ast
from pathlib import Path

import specc.ir.lower as package
from specc.ir.lower import lower

ROOT = Path(package.__file__).parent
KINDS = {"decoder", "encoder", "encoder_decoder", "vit", "rnn_seq2seq"}
COMPOSITE_KINDS = {"dual_encoder"}  # a kind whose parts are other kinds' towers
RANK = {"context": 0, "blocks": 1, **dict.fromkeys(KINDS, 2), **dict.fromkeys(COMPOSITE_KINDS, 3), "__init__": 4}


def _siblings(path: Path) -> set[str]:
    """The modules of this package that ``path`` imports (relative imports of level 1)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.add(node.module or "__init__")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specc.ir.lower"):
            out.add((node.module or "").removeprefix("specc.ir.lower").lstrip(".") or "__init__")
    return out


def test_every_module_is_ranked_and_imports_only_downwards() -> None:
    modules = {p.stem: p for p in ROOT.glob("*.py")}
    assert set(modules) == set(RANK), "a new module of the lowering package needs its place in RANK"
    for name, path in modules.items():
        for dep in _siblings(path):
            assert RANK[dep] < RANK[name], f"lower/{name}.py imports {dep} (rank {RANK[dep]} ≥ {RANK[name]})"


def test_the_entry_point_keeps_its_name() -> None:
    assert lower.__module__ == "specc.ir.lower" and callable(lower)
