"""One ONNX graph for a Transformer family (decoder, encoder, encoder-decoder, ViT), optionally with a KV cache."""

from __future__ import annotations

from collections.abc import Mapping

from onnx import TensorProto

from ...errors import SpecError
from ...ir.graph import LayerGraph
from .builder import ExportOptions, GraphBuilder, LazyModel, symbolic
from .contrib import check_contrib
from .emit import emit_ops
from .kv_cache import KVCache
from .positions import add_input as add_position_ids
from .positions import plan as plan_positions


def validate(g: LayerGraph, opts: ExportOptions) -> None:
    """What would make the export fail, checked before any weight is allocated."""
    if opts.kv_cache:
        KVCache.plan(g)
    if opts.attention == "contrib":
        for op in g.ops():
            if op.kind == "attention":
                check_contrib(op, opts.dtype)
            if op.kind == "latent_attention":
                raise SpecError(
                    f"{op.name}: latent attention exports with the standard Attention op only",
                    hint="use --attention standard",
                )


def build_transformer(g: LayerGraph, params: Mapping[str, tuple[int, ...]], opts: ExportOptions) -> LazyModel:
    b = GraphBuilder(str(g.meta.get("name", "model")), opts, params)
    cache = KVCache.plan(g) if opts.kv_cache else None
    cached_pad = cache is not None and any(op.attrs.padding and op.inputs[-1] == "attention_mask" for op in cache.ops)
    for inp in g.inputs.values():
        if inp.name == "attention_mask" and not opts.padding_mask:
            continue  # every key valid; the attention nodes get no padding mask
        elem = TensorProto.INT64 if inp.dtype == "int64" else b.ftype
        dims = symbolic(inp.shape, {1: "total_sequence"} if inp.name == "attention_mask" and cached_pad else None)
        b.values[inp.name] = b.add_input(inp.name, elem, dims)
    b.positions = plan_positions(g)
    add_position_ids(b)
    if cache is not None:
        b.cache = cache
        cache.add_inputs(b)
    emit_ops(b, g.ops())
    for name, op_name in g.outputs.items():
        b.add_output(name, b.values[op_name], b.ftype, symbolic(g.op(op_name).shape))
    if cache is not None:
        cache.add_outputs(b, "total_sequence")
    return b.lazy(doc=f"specc {g.meta.get('family')} {g.meta.get('name')}")
