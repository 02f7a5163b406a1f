"""RNN seq2seq as two graphs: the encoder, and one decoder step (``specc run --generate`` drives the loop).

Encoder graph (``model.onnx``):
    inputs   input_ids [batch, sequence] int64, attention_mask [batch, sequence] int64 (1 = token, right padding)
    outputs  encoder_hidden_states [batch, sequence, enc_dim]
             state [layers, batch, hidden]        tanh(bridge(h_final)) for every decoder layer
             cell_state [layers, batch, hidden]   LSTM only
             context [batch, enc_dim]             fixed-context models only (attention: none): h_final
One-step decoder (``model.decoder_step.onnx``):
    inputs   decoder_input_ids [batch, 1] (the previous token), state (, cell_state),
             encoder_hidden_states and attention_mask (attention models) or context (fixed-context models)
    outputs  logits [batch, 1, target_vocab], next_state (, next_cell_state),
             attention_weights [batch, 1, sequence] (attention models)
A loop feeds ``next_X`` back as ``X``; encoder outputs go to the step inputs of the same name.
"""

from __future__ import annotations

from collections.abc import Mapping

from onnx import TensorProto

from ...ir.graph import LayerGraph, Op
from .builder import ExportOptions, GraphBuilder, LazyModel
from .emit import emit_ops
from .ops_rnn import linear

INT64 = TensorProto.INT64


def build_rnn(g: LayerGraph, params: Mapping[str, tuple[int, ...]], opts: ExportOptions) -> tuple[LazyModel, LazyModel]:
    dec = next(op for op in g.ops() if op.kind == "rnn_decoder")
    return _encoder(g, dec, params, opts), _step(g, dec, params, opts)


def _encoder(g: LayerGraph, dec: Op, params: Mapping[str, tuple[int, ...]], opts: ExportOptions) -> LazyModel:
    a = dec.attrs
    b = GraphBuilder(f"{g.meta.get('name', 'model')}_encoder", opts, params)
    for name in ("input_ids", "attention_mask"):
        if name == "attention_mask" and not opts.padding_mask:
            continue
        b.values[name] = b.add_input(name, INT64, ["batch", "sequence"])
    enc_ops = [op for op in g.ops() if op.stack == "encoder"]
    emit_ops(b, enc_ops)
    rnn = next(op for op in enc_ops if op.kind == "rnn")
    states = b.values[rnn.name]
    final = b.memo[("rnn_final", rnn.name)]  # [dirs, B, H]
    h_final = b.op("Reshape", [b.op("Transpose", [final], perm=[1, 0, 2]), b.i64(0, a.enc_dim)], scope="h_final")
    init = b.op("Tanh", [linear(b, h_final, f"{dec.name}.bridge")], scope=dec.name)  # [B, H]
    layers = b.op("Concat", [b.i64(a.layers), b.dim(init, 0), b.i64(a.hidden)], scope=dec.name, axis=0)
    state = b.op("Expand", [b.op("Unsqueeze", [init, b.i64(0)], scope=dec.name), layers], scope=dec.name)
    b.add_output("encoder_hidden_states", states, b.ftype, ["batch", "sequence", a.enc_dim])
    b.add_output("state", state, b.ftype, [a.layers, "batch", a.hidden])
    if a.cell == "lstm":
        zeros = b.op("Mul", [state, b.const(0.0, "zero")], scope=dec.name)
        b.add_output("cell_state", zeros, b.ftype, [a.layers, "batch", a.hidden])
    if a.attention == "none":
        b.add_output("context", h_final, b.ftype, ["batch", a.enc_dim])
    return b.lazy(doc=f"specc rnn_seq2seq {g.meta.get('name')}: encoder")


def _step(g: LayerGraph, dec: Op, params: Mapping[str, tuple[int, ...]], opts: ExportOptions) -> LazyModel:
    a = dec.attrs
    cell, hidden, n_layers, att = a.cell, a.hidden, a.layers, a.attention
    b = GraphBuilder(f"{g.meta.get('name', 'model')}_decoder_step", opts, params)
    b.values["decoder_input_ids"] = b.add_input("decoder_input_ids", INT64, ["batch", 1])
    state = b.add_input("state", b.ftype, [n_layers, "batch", hidden])
    cstate = b.add_input("cell_state", b.ftype, [n_layers, "batch", hidden]) if cell == "lstm" else ""
    if att == "none":
        enc = mask = ""
        context = b.add_input("context", b.ftype, ["batch", a.enc_dim])
    else:
        context = ""
        enc = b.add_input("encoder_hidden_states", b.ftype, ["batch", "sequence", a.enc_dim])
        mask = b.add_input("attention_mask", INT64, ["batch", "sequence"]) if opts.padding_mask else ""

    b.memo["rnn_step"] = {"state": state, "cell_state": cstate, "context": context}
    b.values[dec.inputs[1]], b.values["attention_mask"] = enc, mask
    emit_ops(b, [g.op(dec.inputs[0]), dec, *(op for op in g.ops() if dec.name in op.inputs)])
    nxt_h, nxt_c, weights_out = (b.memo["rnn_step"][k] for k in ("next_state", "next_cell_state", "weights"))
    head = g.outputs["logits"]
    vocab = g.op(head).shape[-1]
    b.add_output("logits", b.values[head], b.ftype, ["batch", 1, vocab])
    b.add_output("next_state", nxt_h, b.ftype, [n_layers, "batch", hidden])
    if cell == "lstm":
        b.add_output("next_cell_state", nxt_c, b.ftype, [n_layers, "batch", hidden])
    if weights_out:
        b.add_output("attention_weights", weights_out, b.ftype, ["batch", 1, "sequence"])
    return b.lazy(doc=f"specc rnn_seq2seq {g.meta.get('name')}: one decoder step")
