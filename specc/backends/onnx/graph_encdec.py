"""Encoder-decoder generation without recomputation: the encoder graph, run once, and one decoder graph.

With ``--kv-cache`` an encoder-decoder model is written as two files, I/O named as optimum names them:
- ``NAME.onnx`` (the encoder): ``input_ids``, ``attention_mask`` → ``last_hidden_state``
  ``[batch, encoder_sequence, d_model]``.
- ``NAME.decoder.onnx`` (the decoder): ``input_ids`` (the new decoder tokens), ``encoder_hidden_states``,
  ``encoder_attention_mask``, ``past_key_values.{i}.decoder.key|value`` ``[batch, kv_heads, past_sequence,
  head_dim]`` and ``past_key_values.{i}.encoder.key|value`` ``[batch, kv_heads, past_encoder_sequence,
  head_dim]`` → ``logits``, ``present.{i}.decoder.*`` (past + new) and ``present.{i}.encoder.*``.

Cross-attention K/V: one decoder graph with the empty-past convention (not optimum's pair of decoders with and
without past). On the first step the encoder pasts are empty (length 0) and one ``If`` node projects
``encoder_hidden_states`` to every layer's K/V; on later steps the ``If`` passes the fed pasts through, so the
projections run once per generation. Later steps still feed ``encoder_hidden_states`` (read only for its
batch and length: the branch that reads it does not run). The cross-attention node takes those K/V 4-D
(``[batch, kv_heads, encoder_sequence, head_dim]``), so its query is reshaped to 4-D as well (onnxruntime's
``Attention`` wants equal ranks; ``MultiHeadAttention`` takes a 3-D query with 4-D K/V directly).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from ...errors import SpecError
from ...ir.graph import LayerGraph, Op
from .builder import CONTRIB, ExportOptions, GraphBuilder, LazyModel, symbolic
from .emit import emit_ops
from .kv_cache import KVCache
from .masks import additive, combined_keep
from .ops_dense import linear_bias, weight_t

ENC_SEQ, PAST_ENC_SEQ = "encoder_sequence", "past_encoder_sequence"
HIDDEN, ENC_MASK = "encoder_hidden_states", "encoder_attention_mask"
LAYOUT = (
    "past_key_values.{i}.decoder.key|value -> present.{i}.decoder.key|value: [batch, kv_heads, past_sequence, "
    "head_dim]; past_key_values.{i}.encoder.key|value (empty on the first step) -> present.{i}.encoder.key|value: "
    "[batch, kv_heads, encoder_sequence, head_dim]"
)


def decoder_path(path: str | Path) -> Path:
    """``model.onnx`` → ``model.decoder.onnx`` (the decoder of an encoder-decoder KV-cache export)."""
    p = Path(path)
    return p.with_name(f"{p.stem}.decoder{p.suffix or '.onnx'}")


def _cross_ops(g: LayerGraph) -> list[Op]:
    return [op for op in g.ops() if op.kind == "attention" and op.attrs.cross]


def _encoder_output(g: LayerGraph) -> str:
    """The encoder value every cross-attention K/V projection reads."""
    sources = {g.op(op.inputs[1]).inputs[0] for op in _cross_ops(g)}
    if len(sources) != 1 or any(g.op(op.inputs[1]).kind != "linear" for op in _cross_ops(g)):
        raise SpecError(f"{g.meta.get('name')}: cross-attention does not read one encoder output through a linear")
    return sources.pop()


def validate(g: LayerGraph) -> None:
    KVCache.plan(g)
    _encoder_output(g)


def _add_inputs(b: GraphBuilder, g: LayerGraph, ops: list[Op], names: Mapping[str, str]) -> None:
    """The IR graph inputs ``ops`` read, under their names in this graph (``names``: IR → ONNX)."""
    read = {i for op in ops for i in op.inputs}
    for inp in g.inputs.values():
        if inp.name not in read or (inp.name == "attention_mask" and not b.opts.padding_mask):
            continue
        name = names.get(inp.name, inp.name)
        elem = TensorProto.INT64 if inp.dtype == "int64" else b.ftype
        dims = symbolic(inp.shape, {1: ENC_SEQ} if inp.name in ("input_ids", "attention_mask") else None)
        b.values[inp.name] = b.add_input(name, elem, dims)


def build_encoder(g: LayerGraph, params: Mapping[str, tuple[int, ...]], opts: ExportOptions) -> LazyModel:
    b = GraphBuilder(f"{g.meta.get('name', 'model')}_encoder", opts, params)
    out = _encoder_output(g)
    ops = [op for op in g.ops() if op.stack == "encoder"]
    _add_inputs(b, g, ops, {})
    emit_ops(b, ops)
    b.add_output("last_hidden_state", b.values[out], b.ftype, ["batch", ENC_SEQ, g.op(out).shape[-1]])
    return b.lazy(doc=f"specc encoder of {g.meta.get('name')}")


def build_decoder(g: LayerGraph, params: Mapping[str, tuple[int, ...]], opts: ExportOptions) -> LazyModel:
    b = GraphBuilder(f"{g.meta.get('name', 'model')}_decoder", opts, params)
    cross = _cross_ops(g)
    projections = {op.inputs[1] for op in cross}
    ops = [op for op in g.ops() if op.stack != "encoder" and op.name not in projections]
    _add_inputs(b, g, ops, {"decoder_input_ids": "input_ids", "attention_mask": ENC_MASK})
    enc = _encoder_output(g)
    b.values[enc] = b.add_input(HIDDEN, b.ftype, ["batch", ENC_SEQ, g.op(enc).shape[-1]])
    cache = KVCache.plan(g)
    cache.tag = ".decoder"
    b.cache = cache
    cache.add_inputs(b)
    kv = _cross_cache(b, g, cross)
    names = {op.name for op in cross}
    for op in ops:
        if op.name in names:
            xs = [b.values.get(i, "") for i in op.inputs]
            b.values[op.name] = _cross_attention(b, op, xs[0], *kv[op.name], xs[-1] if op.attrs.padding else "")
        else:
            emit_ops(b, [op])
    for name, op_name in g.outputs.items():
        b.add_output(name, b.values[op_name], b.ftype, symbolic(g.op(op_name).shape))
    cache.add_outputs(b, "total_sequence")
    for i, op in enumerate(cross):
        shape = ["batch", op.attrs.kv_heads, ENC_SEQ, op.attrs.head_dim]
        for part in ("key", "value"):
            b.outputs.append(helper.make_tensor_value_info(f"present.{i}.encoder.{part}", b.ftype, shape))
    return b.lazy(doc=f"specc decoder of {g.meta.get('name')}")


def _cross_cache(b: GraphBuilder, g: LayerGraph, cross: list[Op]) -> dict[str, tuple[str, str]]:
    """Cross K/V per layer ([B, kv_heads, S_enc, D]): projected from the encoder output when the fed encoder
    pasts are empty, else those pasts. Named ``present.{i}.encoder.key|value`` (graph outputs)."""
    pasts = []
    for i, op in enumerate(cross):
        shape = ["batch", op.attrs.kv_heads, PAST_ENC_SEQ, op.attrs.head_dim]
        pasts.append(tuple(b.add_input(f"past_key_values.{i}.encoder.{p}", b.ftype, shape) for p in ("key", "value")))
    outs = [(f"present.{i}.encoder.key", f"present.{i}.encoder.value") for i in range(len(cross))]
    first = b.op("Equal", [b.scalar_dim(pasts[0][0], 2), b.scalar_i64(0)], scope="cross_cache")
    # weights transposed (and constants made) in the outer graph, so each branch holds only per-call work
    hidden = b.values[_encoder_output(g)]
    lin = [g.op(op.inputs[1]) for op in cross]
    wts = [weight_t(b, lo.attrs.tied_to or f"{lo.name}.weight") for lo in lin]
    biases = [linear_bias(b, lo) if lo.attrs.bias else "" for lo in lin]  # (Whisper's: none on k)
    heads = [b.i64(0, 0, op.attrs.kv_heads, op.attrs.head_dim) for op in cross]
    splits = [b.i64(op.attrs.kv_heads * op.attrs.head_dim, op.attrs.kv_heads * op.attrs.head_dim) for op in cross]

    project = _branch(b, "project", outs, lambda: _project(b, cross, lin, hidden, wts, biases, heads, splits))
    reuse = _branch(b, "reuse", outs, lambda: [b.op("Identity", [p], scope="cross_cache") for kv in pasts for p in kv])
    flat = [n for kv in outs for n in kv]
    b.op("If", [first], scope="cross_cache", outputs=flat, then_branch=project, else_branch=reuse)
    return {op.name: outs[i] for i, op in enumerate(cross)}


def _project(b, cross, lin, hidden, wts, biases, heads, splits) -> list[str]:
    values = []
    for op, lo, w, bias, shape, split in zip(cross, lin, wts, biases, heads, splits, strict=True):
        y = b.op("MatMul", [hidden, w], scope=lo.name)
        if bias:
            y = b.op("Add", [y, bias], scope=lo.name)
        for part in b.op("Split", [y, split], scope=op.name, outputs=2, axis=-1):
            values.append(b.op("Transpose", [b.op("Reshape", [part, shape], scope=op.name)], scope=op.name,
                               perm=[0, 2, 1, 3]))  # fmt: skip
    return values


def _branch(b: GraphBuilder, name: str, outs: list[tuple[str, str]], body) -> onnx.GraphProto:
    """A subgraph of the nodes ``body`` adds (its outer-scope reads: the builder's values and initializers)."""
    start = len(b.nodes)
    values = body()
    nodes = b.nodes[start:]
    del b.nodes[start:]
    outputs = [helper.make_tensor_value_info(v, b.ftype, None) for v in values]
    return helper.make_graph(nodes, f"cross_cache_{name}", [], outputs)


def _cross_attention(b: GraphBuilder, op: Op, q: str, k: str, v: str, pad: str) -> str:
    """Attention of the new decoder tokens over the cached cross K/V ([B, kv_heads, S_enc, D])."""
    a = op.attrs
    h, hd = a.heads, a.head_dim
    keep = combined_keep(b, op, q, pad)
    if b.opts.attention == "contrib":
        y = b.fresh(f"{op.name}/MultiHeadAttention")
        bias = additive(b, keep) if keep else ""
        b.op("MultiHeadAttention", [q, k, v, "", "", bias], scope=op.name, outputs=[y], domain=CONTRIB, num_heads=h,
             scale=float(a.scale))  # fmt: skip
        b.declare(y, b.ftype, symbolic(op.shape))
        return y
    q4 = b.op("Transpose", [b.op("Reshape", [q, b.i64(0, 0, h, hd)], scope=op.name)], scope=op.name, perm=[0, 2, 1, 3])
    y = b.op("Attention", [q4, k, v, keep or ""], scope=op.name, scale=float(a.scale), is_causal=0)
    y = b.op("Transpose", [y], scope=op.name, perm=[0, 2, 1, 3])
    return b.op("Reshape", [y, b.i64(0, 0, h * hd)], scope=op.name)
