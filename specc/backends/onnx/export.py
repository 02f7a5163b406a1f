"""``export_onnx``: spec → lower → weights (torch backend's) → ONNX graph(s) → check → atomic save.

Files written:
- Transformer families: one model at ``path``.
- RNN seq2seq: the encoder at ``path`` and the one-step decoder at ``<stem>.decoder_step.onnx`` beside it
  (see graph_rnn.py for their inputs and outputs); the encoder's metadata names the step file.
- Encoder-decoder with ``kv_cache``: the encoder at ``path`` and the decoder (self and cross caches) at
  ``<stem>.decoder.onnx`` (graph_encdec.py); the encoder's metadata names the decoder file.
Every model carries the spec (JSON) and export facts in ``metadata_props`` under ``specc.*`` keys.

Writing (through ``specc.io``): the outputs are checked before any work (regular files or new names, not an
input, a writable folder); every file is staged in one hidden folder beside the target, checked there, and
renamed into place in one go (data files first, the model that names them last). Models over 2 GB keep their
tensors in an external data file, ``<name>.data`` -- or, when a file of that name exists (the data of the model
being replaced), ``<name>.<8 hex>.data``, so the old model keeps its data until the new model replaces it and
a reader never pairs a model with another export's data; data files of that naming the new model does not use
are removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

import onnx

from ... import __version__
from ...errors import SpecError
from ...io import atomic_files, output_target
from ...ir.graph import LayerGraph
from ...ir.lower import lower
from ...spec.schema import DTYPE_BYTES
from ...spec.serialize import SPEC_KEY, spec_json
from . import graph_encdec
from . import save as _save
from .builder import ExportOptions
from .graph_transformer import build_transformer, validate
from .kv_cache import LAYOUT, buffer_metadata
from .quantize import Quantization, quantize_model
from .save import set_metadata
from .weights import export_weights


def step_path(path: str | os.PathLike[str]) -> Path:
    """Where the one-step decoder of an RNN seq2seq export lives: ``model.onnx`` → ``model.decoder_step.onnx``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.decoder_step{p.suffix or '.onnx'}")


def export_onnx(
    spec: Any,
    path: str | os.PathLike[str],
    weights: Any = None,
    dtype: str | None = None,
    opset: int = 23,
    attention: str = "standard",
    kv_cache: bool = False,
    padding_mask: bool = True,
    moe: str = "sparse",
    check: bool = True,
    quantize: str | Quantization | None = None,
    block_size: int | None = None,
    quantize_head: bool | None = None,
    quantize_embedding: bool | None = None,
) -> Path:
    """Write ``spec`` as ONNX with one fused attention node per attention layer; returns ``path``.

    ``spec``: a loaded spec, a YAML path, a preset name or a dict. ``weights``: safetensors path with specc
    names, a ``specc compile --target torch`` checkpoint or a name → tensor dict; default the seeded
    initialisation. ``dtype``: fp32 | fp16 | bf16 (default the spec's). ``attention``: ``standard`` (ai.onnx
    Attention, opset 23/24) or ``contrib`` (com.microsoft MultiHeadAttention / GroupQueryAttention).
    ``kv_cache``: ``past_key_values.{i}.key|value`` inputs → ``present.{i}.key|value`` outputs.
    ``padding_mask=False`` drops the ``attention_mask`` input (all tokens valid). Decoder-only graphs also take
    an optional ``position_ids`` input; by default their positions follow ``attention_mask`` (positions.py).
    ``quantize``: ``int8`` | ``int4`` weight-only quantized linears (quantize.py), blocks of ``block_size``
    input channels (default 32), lm_head included unless ``quantize_head=False``, token embeddings unless
    ``quantize_embedding=False`` (default: wherever the onnxruntime in use supports it).
    ``moe``: ``sparse`` (each expert runs on its routed tokens) or ``dense`` (every expert on every token:
    static shapes, no data-dependent ops); see ops_moe.py.
    """
    from ...spec.loader import load_spec

    if not hasattr(spec, "model_dump"):
        spec = load_spec(spec)
    g = lower(spec)
    opts = ExportOptions(
        dtype=dtype or str(g.meta.get("dtype", "fp32")),
        opset=int(opset),
        attention=attention,
        kv_cache=kv_cache,
        padding_mask=padding_mask,
        moe=moe,
    )
    opts.validate()
    quant = _quantization(quantize, block_size, quantize_head, quantize_embedding, g, opts.dtype)
    family = g.meta["family"]
    if family == "rnn_seq2seq" and kv_cache:
        raise SpecError("--kv-cache does not apply to RNN seq2seq", hint="its decoder_step graph carries the state")
    if family == "rnn_seq2seq" and quant is not None:
        raise SpecError("--quantize applies to Transformer models", hint="RNN seq2seq exports stay in float")
    split = family == "encoder_decoder" and kv_cache
    if family != "rnn_seq2seq":
        validate(g, opts)
    if split:
        graph_encdec.validate(g)
    given = Path(path)
    path = output_target(given, inputs=_weight_inputs(weights))  # before any work; symlinks resolved
    if family == "rnn_seq2seq":
        output_target(step_path(path), inputs=_weight_inputs(weights))
    if split:
        output_target(graph_encdec.decoder_path(path), inputs=_weight_inputs(weights))
    _check_memory(g, opts)
    w = export_weights(spec, g, weights)
    base = _metadata(spec, g, opts)
    if quant is not None:
        base.update(quant.metadata())
    if family == "rnn_seq2seq":
        from .graph_rnn import build_rnn

        encoder, step = build_rnn(g, w, opts)
        set_metadata(encoder, {**base, "specc.role": "encoder", "specc.decoder_step": step_path(path).name})
        set_metadata(step, {**base, "specc.role": "decoder_step", "specc.encoder": path.name})
        write_models([(step, step_path(path)), (encoder, path)], check)
        return given
    if split:
        dec_path = graph_encdec.decoder_path(path)
        base["specc.kv_layout"] = graph_encdec.LAYOUT
        encoder, decoder = graph_encdec.build_encoder(g, w, opts), graph_encdec.build_decoder(g, w, opts)
        if quant is not None:
            encoder, decoder = quantize_model(encoder, g, quant), quantize_model(decoder, g, quant)
        set_metadata(encoder, {**base, "specc.role": "encoder", "specc.decoder": dec_path.name})
        set_metadata(decoder, {**base, "specc.role": "decoder", "specc.encoder": path.name})
        write_models([(decoder, dec_path), (encoder, path)], check)
        return given
    model = build_transformer(g, w, opts)
    if quant is not None:
        model = quantize_model(model, g, quant)
    set_metadata(model, {**base, "specc.role": "model"})
    write_models([(model, path)], check)
    return given


def _quantization(
    quantize: str | Quantization | None,
    block_size: int | None,
    head: bool | None,
    embedding: bool | None,
    g: LayerGraph,
    dtype: str,
) -> Quantization | None:
    given = [k for k, v in (("block_size", block_size), ("quantize_head", head), ("quantize_embedding", embedding))
             if v is not None]  # fmt: skip
    if given and (quantize is None or isinstance(quantize, Quantization)):  # settings that would do nothing
        why = "without quantize every weight is float" if quantize is None else "the Quantization given holds them"
        raise SpecError(f"{', '.join(given)} given with quantize={quantize!r}: {why}")
    if quantize is None:
        return None
    if not isinstance(quantize, Quantization):
        block = 32 if block_size is None else int(block_size)
        quantize = Quantization(str(quantize), block, head is not False, embedding=embedding)
    return quantize.resolve(g, dtype)


def _weight_inputs(weights: Any) -> list[Path]:
    """The files a ``weights`` path reads (a file, or a folder's / index's shards): never an output."""
    if not isinstance(weights, (str, os.PathLike)):
        return []
    from ...interop import checkpoint

    try:
        return [Path(weights), *checkpoint.files(weights)]
    except (SpecError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return [Path(weights)]  # unreadable: the weights loader reports it


def write_models(models: list[tuple[onnx.ModelProto, Path]], check: bool = True) -> None:
    """Save ``models`` (each to its path, all in one folder) as one atomic group: staged, checked by the full
    checker on the staged files (by path: several times faster than checking the in-memory proto), then renamed
    data files first, the models in the order given. Tensors go to an external data file when they pass 2 GB."""
    plans: list[tuple[onnx.ModelProto, Path, str | None]] = []
    for model, path in models:
        external = _save.tensor_bytes(model) >= _save.PROTO_LIMIT
        plans.append((model, path, _fresh_data_name(path) if external else None))
    data_targets = [path.with_name(data) for _, path, data in plans if data]
    targets = [*data_targets, *(path for _, path, _ in plans)]
    with atomic_files(targets, like=plans[-1][1]) as staged:
        by_target = dict(zip(targets, staged, strict=True))
        for model, path, data in plans:
            out = str(by_target[path])
            if data:
                onnx.save_model(model, out, save_as_external_data=True, all_tensors_to_one_file=True,
                                location=data, size_threshold=1024)  # fmt: skip
            else:
                onnx.save_model(model, out)
            if check:
                onnx.checker.check_model(out, full_check=True)
    for _, path, data in plans:
        _remove_unused_data(path, keep=data)


def _data_names(path: Path) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(path.name)}(\.[0-9a-f]{{8}})?\.data$")


def _fresh_data_name(path: Path) -> str:
    """``<name>.data`` unless a file of that name exists (the data of the model being replaced)."""
    name = f"{path.name}.data"
    while os.path.lexists(path.with_name(name)):
        name = f"{path.name}.{secrets.token_hex(4)}.data"
    return name


def _remove_unused_data(path: Path, keep: str | None) -> None:
    """Data files of this model's naming that the model just written does not use (an earlier export's)."""
    pattern = _data_names(path)
    folder = path.parent if str(path.parent) else Path(".")
    for entry in os.scandir(folder):
        if entry.name != keep and pattern.match(entry.name) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def export_peak_bytes(params: int, dtype: str) -> int:
    """Peak memory of an export, measured (peak RSS less the interpreter's, gpt2 124M: 16.9 B/param in fp32,
    12.2 in fp16): the fp32 torch weights, the cast tensors, the model proto, its serialisation and the
    checker's reading of the staged file. Rounded up: params · (4.4 + 4 · bytes of the dtype)."""
    return int(params * (4.4 + 4 * DTYPE_BYTES[dtype]))


def _check_memory(g: LayerGraph, opts: ExportOptions) -> None:
    """Refuse, before allocating, an export whose peak will not fit (``export_peak_bytes``)."""
    import torch

    from ..torch.memory import available, gib

    params = g.num_params()
    need = export_peak_bytes(params, opts.dtype)
    free = available(torch.device("cpu"))
    if need > free.bytes:
        raise SpecError(
            f"exporting {g.meta.get('name')} ({params:,} parameters, {opts.dtype}) needs about {gib(need)} of memory "
            f"at its peak, but {gib(free.bytes)} is available (limited by {free.source})",
            hint="nothing was allocated; export a smaller spec (--set blocks=...) or on a larger machine",
        )


def _metadata(spec: Any, g: LayerGraph, opts: ExportOptions) -> dict[str, str]:
    meta = {
        "specc.version": __version__,
        SPEC_KEY: spec_json(spec),
        "specc.family": str(g.meta["family"]),
        "specc.task": str(g.meta.get("task", "")),
        "specc.dtype": opts.dtype,
        "specc.attention": opts.attention,
        "specc.kv_cache": "1" if opts.kv_cache else "0",
        "specc.ir_meta": json.dumps(g.meta, sort_keys=True, default=str),
    }
    if opts.kv_cache:
        meta["specc.kv_layout"] = LAYOUT
        meta.update(buffer_metadata(g, opts))
    if any(op.kind == "moe" for op in g.ops()):
        meta["specc.moe"] = opts.moe
    return meta
