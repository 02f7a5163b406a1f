"""import-hf: a Hugging Face config.json (and, when beside it, its checkpoint's names and shapes) → a spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import SpecError
from .app import app, err, out
from .app import output as check_output


@app.command("import-hf")
def import_hf(
    path: Annotated[Path, typer.Argument(help="a save_pretrained folder holding config.json, or the file itself")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="spec file to write (default NAME.yaml)")] = (
        None
    ),
    name: Annotated[str | None, typer.Option("--name", help="spec name (default: from the config or folder)")] = None,
    check_weights: Annotated[
        bool,
        typer.Option("--check-weights/--no-check-weights", help="check the checkpoint beside config.json (headers)"),
    ] = True,
) -> None:
    """Import a Hugging Face model's config.json as a spec; fields specc cannot express are errors."""
    from ..interop import check_names
    from ..interop import import_hf as do_import
    from ..interop import safetensors_read as checkpoint
    from ..interop.hf_import import write
    from ..ir.lower import lower
    from .compile_cmd import weight_files

    config = path / "config.json" if path.is_dir() else path
    found = checkpoint.find(path) if path.exists() else None
    inputs = [(config, f"the config {config}"), *weight_files(found)]
    if output is not None:
        check_output(output, *inputs)  # before reading anything: a located refusal, nothing overwritten
    imported = do_import(path, name=name)
    g = lower(imported.spec)
    weights = checkpoint.find(path) if check_weights else None
    if weights is not None:
        problems = check_names(g, checkpoint.shapes(weights))
        if problems:
            raise SpecError(problems)
    target = output or Path(f"{imported.document['name']}.yaml")
    check_output(target, *inputs)
    target = write(imported, target)
    for note in imported.notes:
        err.print(f"note: {note}", markup=False)
    out.print(
        f"wrote {target}: {imported.architecture} → {imported.spec.kind}, {g.num_params():,} parameters", markup=False
    )
    if weights is not None:
        out.print(
            f"checked {weights.name}: every tensor maps onto the spec (load it with --weights {weights})", markup=False
        )
