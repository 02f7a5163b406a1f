"""Human views of a LayerGraph: text summary, DOT, mermaid, JSON."""

from __future__ import annotations

import json
import re
from collections import Counter

from .graph import LayerGraph


def shape_str(shape: tuple) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def summary_lines(g: LayerGraph, parameters: int | None = None) -> list[str]:
    """``parameters``: the count to print (the analyzer's reference total); by default the tensors specc stores."""
    m = g.meta
    kinds = Counter(op.kind for op in g.ops())
    count = g.num_params() if parameters is None else parameters
    return [
        f"{m['name']}: {m['family']} ({m['task']}), {len(g)} ops, {count:,} parameters",
        "inputs:  " + ", ".join(f"{i.name}{shape_str(i.shape)}:{i.dtype}" for i in g.inputs.values()),
        "outputs: " + ", ".join(f"{k}{shape_str(g.shape_of(v))} ← {v}" for k, v in g.outputs.items()),
        "ops:     " + ", ".join(f"{k}×{n}" for k, n in sorted(kinds.items())),
    ]


def table_rows(g: LayerGraph) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for op in g.ops():
        params = sum(_numel(p.shape) for p in op.params.values())
        tied = f" (tied {op.tied_to})" if op.tied_to else ""
        rows.append((op.name, op.kind, op.category, shape_str(op.shape), f"{params:,}{tied}" if params or tied else ""))
    return rows


def _ident(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def to_dot(g: LayerGraph) -> str:
    lines = [f'digraph "{g.meta["name"]}" {{', "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for name, i in g.inputs.items():
        lines.append(f'  {_ident(name)} [label="{name}\\n{shape_str(i.shape)}", shape=ellipse];')
    for op in g.ops():
        lines.append(f'  {_ident(op.name)} [label="{op.name}\\n{op.kind} {shape_str(op.shape)}"];')
    for src, dst in g.graph.edges:
        lines.append(f"  {_ident(src)} -> {_ident(dst)};")
    for out, src in g.outputs.items():
        lines.append(f'  out_{_ident(out)} [label="{out}", shape=ellipse];')
        lines.append(f"  {_ident(src)} -> out_{_ident(out)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(g: LayerGraph) -> str:
    lines = ["flowchart TD"]
    for name, i in g.inputs.items():
        lines.append(f'  {_ident(name)}(["{name} {shape_str(i.shape)}"])')
    for op in g.ops():
        lines.append(f'  {_ident(op.name)}["{op.name}<br/>{op.kind} {shape_str(op.shape)}"]')
    for src, dst in g.graph.edges:
        lines.append(f"  {_ident(src)} --> {_ident(dst)}")
    for out, src in g.outputs.items():
        lines.append(f'  out_{_ident(out)}(["{out}"])')
        lines.append(f"  {_ident(src)} --> out_{_ident(out)}")
    return "\n".join(lines) + "\n"


def to_json(g: LayerGraph) -> str:
    return json.dumps(g.to_dict(), indent=2) + "\n"
