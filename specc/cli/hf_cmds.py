"""import-hf: a Hugging Face config.json (and, when beside it, its checkpoint's names and shapes) → a spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import SpecError
from .app import SetOpt, TrustPickleOpt, app, err, load, out
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
    from ..analysis.params import count_params
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
    total = count_params(g).total
    out.print(f"wrote {target}: {imported.architecture} → {imported.spec.kind}, {total:,} parameters", markup=False)
    if weights is not None:
        out.print(
            f"checked {weights.name}: every tensor maps onto the spec (load it with --weights {weights})", markup=False
        )


@app.command("export-hf")
def export_hf(
    spec: Annotated[str, typer.Argument(help="spec file (YAML) or preset name, or a specc checkpoint")],
    output: Annotated[Path, typer.Option("--output", "-o", help="folder to write (replaced whole)")],
    weights: Annotated[
        Path | None, typer.Option("--weights", "-w", help="safetensors weights for a spec (default: random, seeded)")
    ] = None,
    sets: SetOpt = None,
    trust_pickled_checkpoint: TrustPickleOpt = False,
) -> None:
    """Write a Hugging Face folder (config.json + model.safetensors) that transformers loads with equal logits."""
    from ..interop.hf_export import export_hf as do_export
    from ..io import folder_target
    from ..spec.loader import load_document
    from ..spec.yaml_source import Loc, Located
    from .compile_cmd import weight_files

    source = Path(spec)
    checkpoint = source.is_dir() or (spec.endswith(".safetensors") and source.is_file())
    if checkpoint and (sets or weights is not None):
        option = "--set" if sets else "--weights"
        raise SpecError(f"{option} does not apply to a checkpoint: it holds its own spec and weights")
    target = folder_target(output)
    inputs = [source.resolve(), *(f.resolve() for f, _ in weight_files(weights))]
    if any(i == target or target in i.parents for i in inputs):
        raise SpecError("the output folder holds an input of this command", file=str(output), hint="write elsewhere")
    model_spec, model = _model(spec, checkpoint, weights, sets, trust_pickled_checkpoint)
    doc = Located({}, {(): Loc(spec)}) if checkpoint else load_document(spec)
    params = {name: t for name, t in model.state_dict().items() if name in model.graph.params()}
    done = do_export(model_spec, params, output, doc)
    out.print(f"wrote {done.folder}: {done.architecture}, {done.tensors} tensors", markup=False)


def _model(spec: str, checkpoint: bool, weights: Path | None, sets: list[str] | None, trust: bool) -> tuple[Any, Any]:
    """The spec and the torch model to export: a checkpoint's own, or the spec's with random or given weights."""
    from ..backends.torch import build_torch, load_checkpoint, read_spec

    if Path(spec).is_dir():  # specc train --parallel -o DIR
        from ..parallel.sharded_checkpoint import load as load_distributed

        ck = load_distributed(spec, trust_pickle=trust)
        return ck.spec, build_torch(ck.spec, weights=ck.weights)
    if checkpoint:
        return read_spec(spec), load_checkpoint(spec)
    model_spec = load(spec, sets)
    return model_spec, build_torch(model_spec, weights=None if weights is None else str(weights))
