"""validate, graph, schema, presets."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import typer
from rich.table import Table

from ..errors import SpecError
from .app import SetOpt, SpecArg, app, load, out


@app.command()
def validate(
    specs: Annotated[list[str], typer.Argument(help="spec files or preset names")],
    sets: SetOpt = None,
) -> None:
    """Check specs; report every problem as file:line:col. Exit 0 if all are valid, 2 otherwise."""
    from ..analysis.params import count_params
    from ..ir.lower import lower

    problems: list[SpecError] = []
    for path in specs:
        try:
            spec = load(path, sets)
            g = lower(spec)
            out.print(f"{path}: ok ({spec.kind}, {count_params(g).total:,} parameters)")
        except SpecError as e:
            problems.append(e)
    if problems:
        raise SpecError([d for e in problems for d in e.diagnostics])


class GraphFormat(str, Enum):
    text = "text"
    dot = "dot"
    mermaid = "mermaid"
    json = "json"


@app.command()
def graph(
    spec: SpecArg,
    format: Annotated[
        GraphFormat, typer.Option("--format", "-f", help="text | dot | mermaid | json")
    ] = GraphFormat.text,
    sets: SetOpt = None,
) -> None:
    """Lower a spec and print its layer graph."""
    from ..analysis.params import count_params
    from ..ir import render
    from ..ir.lower import lower

    g = lower(load(spec, sets))
    if format is GraphFormat.dot:
        out.out(render.to_dot(g), end="")
    elif format is GraphFormat.mermaid:
        out.out(render.to_mermaid(g), end="")
    elif format is GraphFormat.json:
        out.out(render.to_json(g), end="")
    else:
        for line in render.summary_lines(g, count_params(g).total):
            out.print(line)
        t = Table("op", "kind", "category", "shape", "params", box=None, pad_edge=False)
        for row in render.table_rows(g):
            t.add_row(*row)
        out.print(t)


@app.command()
def schema() -> None:
    """Print the JSON Schema of specs (for yaml-language-server and other editors)."""
    from ..spec.schema import json_schema

    out.out(json.dumps(json_schema(), indent=2))


@app.command()
def presets() -> None:
    """List the preset specs, one line each."""
    from ..analysis.params import count_params
    from ..ir.lower import lower
    from ..spec.loader import load_spec
    from ..spec.presets import find_preset, preset_names

    t = Table("preset", "kind", "blocks", "d_model", "heads", "parameters", "source", box=None, pad_edge=False)
    for name in preset_names():
        path = find_preset(name)
        assert path is not None
        s = load_spec(path)
        blocks = getattr(s, "blocks", None)
        if hasattr(blocks, "encoder"):
            blocks = f"{blocks.encoder}+{blocks.decoder}"
        heads = s.attention.heads if hasattr(s, "attention") else "-"
        d = getattr(s, "d_model", None) or (s.rnn.hidden if hasattr(s, "rnn") else None)
        if s.kind == "dual_encoder":  # image tower + text tower
            v, x = s.vision, s.text
            blocks, d, heads = (
                f"{v.blocks}+{x.blocks}",
                f"{v.d_model}/{x.d_model}",
                f"{v.attention.heads}/{x.attention.heads}",
            )
        total = count_params(lower(s)).total
        t.add_row(name, s.kind, str(blocks or s.rnn.layers), str(d), str(heads), f"{total:,}", s.source or "")
    out.print(t)
