"""``export_onnx``: spec → lower → weights (torch backend's) → ONNX graph(s) → check → atomic save.

Files written:
- Transformer families: one model at ``path``.
- RNN seq2seq: the encoder at ``path`` and the one-step decoder at ``<stem>.decoder_step.onnx`` beside it
  (see graph_rnn.py for their inputs and outputs); the encoder's metadata names the step file.
Every model carries the spec (JSON) and export facts in ``metadata_props`` under ``specc.*`` keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ... import __version__
from ...errors import SpecError
from ...ir.graph import LayerGraph
from ...ir.lower import lower
from ...spec.schema import DTYPE_BYTES
from ...spec.serialize import SPEC_KEY, spec_json
from .builder import ExportOptions
from .graph_transformer import build_transformer, validate
from .kv_cache import LAYOUT
from .save import save, set_metadata
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
    check: bool = True,
) -> Path:
    """Write ``spec`` as ONNX with one fused attention node per attention layer; returns ``path``.

    ``spec``: a loaded spec, a YAML path, a preset name or a dict. ``weights``: safetensors path with specc
    names, a ``specc compile --target torch`` checkpoint or a name → tensor dict; default the seeded
    initialisation. ``dtype``: fp32 | fp16 | bf16 (default the spec's). ``attention``: ``standard`` (ai.onnx
    Attention, opset 23/24) or ``contrib`` (com.microsoft MultiHeadAttention / GroupQueryAttention).
    ``kv_cache``: ``past_key_values.{i}.key|value`` inputs → ``present.{i}.key|value`` outputs.
    ``padding_mask=False`` drops the ``attention_mask`` input (all tokens valid). Decoder-only graphs also take
    an optional ``position_ids`` input; by default their positions follow ``attention_mask`` (positions.py).
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
    )
    opts.validate()
    path = Path(path)
    family = g.meta["family"]
    if family == "rnn_seq2seq" and kv_cache:
        raise SpecError("--kv-cache does not apply to RNN seq2seq", hint="its decoder_step graph carries the state")
    if family != "rnn_seq2seq":
        validate(g, opts)
    _check_memory(g, opts)
    w = export_weights(spec, g, weights)
    base = _metadata(spec, g, opts)
    if family == "rnn_seq2seq":
        from .graph_rnn import build_rnn

        encoder, step = build_rnn(g, w, opts)
        set_metadata(encoder, {**base, "specc.role": "encoder", "specc.decoder_step": step_path(path).name})
        set_metadata(step, {**base, "specc.role": "decoder_step", "specc.encoder": path.name})
        save(step, step_path(path), check)
        save(encoder, path, check)
        return path
    model = build_transformer(g, w, opts)
    set_metadata(model, {**base, "specc.role": "model"})
    save(model, path, check)
    return path


def _check_memory(g: LayerGraph, opts: ExportOptions) -> None:
    """Refuse, before allocating, an export whose weights will not fit: the fp32 torch weights plus the
    cast copy held by the model proto plus its serialisation (≈ params · (4 + 2·bytes of the dtype))."""
    import torch

    from ..torch.memory import available_bytes, gib

    params = g.num_params()
    need = params * (4 + 2 * DTYPE_BYTES[opts.dtype])
    free = available_bytes(torch.device("cpu"))
    if need > free:
        raise SpecError(
            f"exporting {g.meta.get('name')} ({params:,} parameters, {opts.dtype}) needs about {gib(need)} of memory, "
            f"but {gib(free)} is available",
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
    return meta
