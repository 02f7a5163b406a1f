"""compile: one spec to a torch checkpoint, a standalone model.py, or an ONNX graph."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from .app import Dtype, SetOpt, SpecArg, app, load, out
from .app import output as check_output


def weight_files(weights: Path | None) -> list[tuple[Path, str]]:
    """The files ``--weights`` reads (a file, an index and its shards, a save_pretrained folder's shards)."""
    if weights is None:
        return []
    from ..errors import SpecError
    from ..interop import safetensors_read as checkpoint

    role = f"the weights {weights}"
    try:
        return [(weights, role), *((f, role) for f in checkpoint.files(weights))]
    except (SpecError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return [(weights, role)]  # unreadable: the loader reports it when it reads them


class Target(str, Enum):
    torch = "torch"
    python = "python"
    onnx = "onnx"


class AttentionOp(str, Enum):
    standard = "standard"
    contrib = "contrib"


class MoEForm(str, Enum):
    sparse = "sparse"
    dense = "dense"


class Quantize(str, Enum):
    int8 = "int8"
    int4 = "int4"


_DEFAULT_SUFFIX = {Target.torch: ".safetensors", Target.python: ".py", Target.onnx: ".onnx"}


@app.command("compile")
def compile_(
    spec: SpecArg,
    target: Annotated[Target, typer.Option("--target", "-t", help="torch | python | onnx")] = Target.torch,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="output file")] = None,
    weights: Annotated[Path | None, typer.Option("--weights", "-w", help="safetensors weights to load")] = None,
    dtype: Annotated[Dtype | None, typer.Option("--dtype", help="fp32 | fp16 | bf16 (default: the spec's)")] = None,
    opset: Annotated[int | None, typer.Option("--opset", help="ONNX opset: 23 or 24  [default: 23]")] = None,
    attention: Annotated[
        AttentionOp | None,
        typer.Option("--attention", help="ONNX attention op: standard (opset 23/24) | contrib  [default: standard]"),
    ] = None,
    kv_cache: Annotated[bool, typer.Option("--kv-cache", help="ONNX: past_key_values inputs, present outputs")] = False,
    moe: Annotated[
        MoEForm | None,
        typer.Option(
            "--moe",
            help="ONNX MoE: sparse (experts run on their routed tokens) | dense (static shapes)  [default: sparse]",
        ),
    ] = None,
    quantize: Annotated[
        Quantize | None,
        typer.Option(
            "--quantize",
            help="ONNX: weight-only int8 | int4 linears (MatMulNBits) and token embeddings (GatherBlockQuantized)",
        ),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option("--block-size", help="--quantize: input channels per scale: 16 | 32 | 64 | 128  [default: 32]"),
    ] = None,
    quantize_head: Annotated[
        bool | None,
        typer.Option(
            "--quantize-head/--no-quantize-head",
            help="--quantize: also quantize lm_head (--no-quantize-head keeps it, and a table tied to it, float)  "
            "[default: quantize-head]",
            show_default=False,
        ),
    ] = None,
    quantize_embedding: Annotated[
        bool | None,
        typer.Option(
            "--quantize-embedding/--no-quantize-embedding",
            help="--quantize: token embeddings as GatherBlockQuantized (a tied head's weight shared); default: "
            "where the onnxruntime in use supports it",
            show_default=False,
        ),
    ] = None,
    genai: Annotated[
        bool,
        typer.Option(
            "--genai",
            help="ONNX: also write genai_config.json (and the weights folder's tokenizer files) for "
            "onnxruntime-genai; decoder-only with --kv-cache",
        ),
    ] = False,
    sets: SetOpt = None,
) -> None:
    """Compile a spec: weights + spec (torch), a standalone model.py (python) or ONNX with fused attention."""
    _refuse_unused(
        target,
        {
            "--opset": opset,
            "--attention": attention,
            "--kv-cache": kv_cache or None,
            "--moe": moe,
            "--quantize": quantize,
            "--genai": genai or None,
        },
        {"--block-size": block_size, "--quantize-head": quantize_head, "--quantize-embedding": quantize_embedding},
        quantize,
    )
    s = load(spec, sets)
    path = output or Path(f"{s.name}{_DEFAULT_SUFFIX[target]}")
    check_output(path, *weight_files(weights))  # before building or exporting anything
    if target is Target.onnx:
        from ..backends.onnx.export import step_path

        if s.kind == "rnn_seq2seq":
            check_output(step_path(path), *weight_files(weights))
        if s.kind == "encoder_decoder" and kv_cache:
            from ..backends.onnx.graph_encdec import decoder_path

            check_output(decoder_path(path), *weight_files(weights))
        if genai:
            from ..backends.onnx.genai import targets

            for extra in targets(path, weights):
                check_output(extra, *weight_files(weights))
    dt = dtype.value if dtype else None
    if target is Target.torch:
        from ..backends.torch.checkpoint import compile_checkpoint

        compile_checkpoint(s, path, weights=weights, dtype=dt, last=True)
    elif target is Target.python:
        from ..backends.torch.standalone import write_model_py

        write_model_py(s, path, weights=weights, last=True)
    else:
        from ..backends.onnx.export import export_onnx

        opset, attention, moe = 23 if opset is None else opset, attention or AttentionOp.standard, moe or MoEForm.sparse
        export_onnx(s, path, weights=weights, dtype=dt, opset=opset, attention=attention.value, kv_cache=kv_cache,
                    moe=moe.value, quantize=quantize.value if quantize else None, block_size=block_size,
                    quantize_head=quantize_head, quantize_embedding=quantize_embedding, genai=genai,
                    last=True)  # fmt: skip
    out.print(f"wrote {path}")


def _refuse_unused(target: Target, onnx_only: dict, quantize_only: dict, quantize: Quantize | None) -> None:
    """An option given where it does nothing is a user error, not silently ignored."""
    from ..errors import SpecError

    for flag, value in onnx_only.items():
        if value is not None and target is not Target.onnx:
            raise SpecError(f"{flag} applies to --target onnx", hint=f"the {target.value} target has no such setting")
    for flag, value in quantize_only.items():
        if value is not None and quantize is None:
            shown = flag if value is not False else flag.replace("--", "--no-", 1)
            raise SpecError(
                f"{shown} applies with --quantize int8|int4", hint="without --quantize every weight is float"
            )
