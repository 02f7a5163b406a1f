"""compile: one spec to a torch checkpoint, a standalone model.py, or an ONNX graph."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from .app import Dtype, SetOpt, SpecArg, app, load, out


class Target(str, Enum):
    torch = "torch"
    python = "python"
    onnx = "onnx"


class AttentionOp(str, Enum):
    standard = "standard"
    contrib = "contrib"


_DEFAULT_SUFFIX = {Target.torch: ".safetensors", Target.python: ".py", Target.onnx: ".onnx"}


@app.command("compile")
def compile_(
    spec: SpecArg,
    target: Annotated[Target, typer.Option("--target", "-t", help="torch | python | onnx")] = Target.torch,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="output file")] = None,
    weights: Annotated[Path | None, typer.Option("--weights", "-w", help="safetensors weights to load")] = None,
    dtype: Annotated[Dtype | None, typer.Option("--dtype", help="fp32 | fp16 | bf16 (default: the spec's)")] = None,
    opset: Annotated[int, typer.Option("--opset", help="ONNX opset: 23 or 24")] = 23,
    attention: Annotated[
        AttentionOp, typer.Option("--attention", help="ONNX attention op: standard (opset 23/24) | contrib")
    ] = AttentionOp.standard,
    kv_cache: Annotated[bool, typer.Option("--kv-cache", help="ONNX: past_key_values inputs, present outputs")] = False,
    sets: SetOpt = None,
) -> None:
    """Compile a spec: weights + spec (torch), a standalone model.py (python) or ONNX with fused attention."""
    s = load(spec, sets)
    path = output or Path(f"{s.name}{_DEFAULT_SUFFIX[target]}")
    dt = dtype.value if dtype else None
    if target is Target.torch:
        from ..backends.torch.checkpoint import compile_checkpoint

        compile_checkpoint(s, path, weights=weights, dtype=dt)
    elif target is Target.python:
        from ..backends.torch.standalone import write_model_py

        write_model_py(s, path, weights=weights)
    else:
        from ..backends.onnx.export import export_onnx

        export_onnx(s, path, weights=weights, dtype=dt, opset=opset, attention=attention.value, kv_cache=kv_cache)
    out.print(f"wrote {path}")
