"""``export_onnx``: spec → lower → ONNX graph(s) with weight placeholders → check → weights streamed from their
source into the staged files (stream.py) → atomic rename.

Memory: the export never holds the model. Each parameter is read (a checkpoint's rows by pread, the seeded init
drawn piece by piece), cast or quantized and written a chunk at a time, so the peak is a fixed few hundred MB
above the interpreter whatever the model's size (``export_peak_bytes``), and the memory check refuses only
what that peak does not fit.

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

import json
import os
from pathlib import Path
from typing import Any

from ...errors import SpecError
from ...io import output_target
from ...ir.graph import LayerGraph
from ...ir.lower import lower
from ...spec.schema import DTYPE_BYTES
from ...spec.serialize import SPEC_KEY, spec_json
from ...version import __version__
from . import graph_encdec
from .builder import ExportOptions
from .graph_transformer import build_transformer, validate
from .kv_cache import buffer_metadata, layout
from .quantize import Quantization, quantize_model
from .recipes import CHUNK_BYTES
from .save import set_metadata
from .sources import WeightSource, open_weights
from .stream import write_models

STREAM_FIXED = 256 << 20  # above the interpreter: measured at most 0.4 GB of address space with the chunks


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
    genai: bool = False,
    last: bool = False,
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
    static shapes, no data-dependent ops); see ops_moe.py. ``genai``: also write ``genai_config.json`` (and the
    tokenizer files of the weights' folder) so onnxruntime-genai loads the model (decoder-only with
    ``kv_cache``; genai.py).
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
    if genai:
        from . import genai as genai_config

        genai_config.validate(g, opts, quant is not None)
    given = Path(path)
    path = output_target(given, inputs=_weight_inputs(weights))  # before any work; symlinks resolved
    if genai:
        genai_config.check_targets(path, weights)
    if family == "rnn_seq2seq":
        output_target(step_path(path), inputs=_weight_inputs(weights))
    if split:
        output_target(graph_encdec.decoder_path(path), inputs=_weight_inputs(weights))
    source = open_weights(g, weights)  # headers checked; nothing read yet
    _check_memory(g, opts, quant, source)
    params = {name: tuple(p.shape) for name, p in g.params().items()}
    base = _metadata(spec, g, opts)
    if quant is not None:
        base.update(quant.metadata())
    if family == "rnn_seq2seq":
        from .graph_rnn import build_rnn

        encoder, step = build_rnn(g, params, opts)
        set_metadata(encoder.model, {**base, "specc.role": "encoder", "specc.decoder_step": step_path(path).name})
        set_metadata(step.model, {**base, "specc.role": "decoder_step", "specc.encoder": path.name})
        write_models([(step, step_path(path)), (encoder, path)], source, check, last)
        return given
    if split:
        dec_path = graph_encdec.decoder_path(path)
        base["specc.kv_layout"] = graph_encdec.LAYOUT
        encoder, decoder = graph_encdec.build_encoder(g, params, opts), graph_encdec.build_decoder(g, params, opts)
        if quant is not None:
            encoder = quantize_model(encoder, g, quant, opts.dtype, source)
            decoder = quantize_model(decoder, g, quant, opts.dtype, source)
        set_metadata(encoder.model, {**base, "specc.role": "encoder", "specc.decoder": dec_path.name})
        set_metadata(decoder.model, {**base, "specc.role": "decoder", "specc.encoder": path.name})
        write_models([(decoder, dec_path), (encoder, path)], source, check, last)
        return given
    model = build_transformer(g, params, opts)
    if quant is not None:
        model = quantize_model(model, g, quant, opts.dtype, source)
    set_metadata(model.model, {**base, "specc.role": "model"})
    write_models([(model, path)], source, check, last and not genai)
    if genai:
        genai_config.write(g, opts, path, weights, last)
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
    from ...interop import safetensors_read as checkpoint

    try:
        return [Path(weights), *checkpoint.files(weights)]
    except (SpecError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return [Path(weights)]  # unreadable: the weights loader reports it


def export_peak_bytes(params: int, dtype: str, held: int = 0, whole: bool = False) -> int:
    """Peak memory of an export above the interpreter's (torch, onnx and onnxruntime imported).

    Streamed (every export but ``quantize_dynamic``): a fixed part (the graph, onnxruntime's quantizer, the
    chunks a recipe has in flight: recipes.CHUNK_BYTES, a few copies) plus ``held``, what the source holds at
    once (a seeded parameter drawn whole: norms, RNN weights; a parameter a checkpoint's transform builds whole).
    Whole (``whole=True``, the dynamic quantizer's model in memory), measured on gpt2 124M: 16.9 B/param in
    fp32, 12.2 in fp16, rounded up: params · (4.4 + 4 · bytes of the dtype)."""
    if whole:
        return int(params * (4.4 + 4 * DTYPE_BYTES[dtype]))
    return STREAM_FIXED + 8 * CHUNK_BYTES + 2 * held


def _check_memory(g: LayerGraph, opts: ExportOptions, quant: Quantization | None, source: WeightSource) -> None:
    """Refuse, before any weight is read or drawn, an export whose peak will not fit (``export_peak_bytes``)."""
    import torch

    from ..torch.memory import available, gib

    params = g.num_params()
    whole = quant is not None and quant.method == "dynamic"
    need = export_peak_bytes(params, opts.dtype, source.held_bytes(), whole)
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
        meta["specc.kv_layout"] = layout(g)
        meta.update(buffer_metadata(g, opts))
    if any(op.kind == "moe" for op in g.ops()):
        meta["specc.moe"] = opts.moe
    return meta
