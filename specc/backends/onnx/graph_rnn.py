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

import numpy as np
from onnx import TensorProto

from ...ir.graph import LayerGraph, Op
from .builder import ExportOptions, GraphBuilder, LazyModel
from .emit import emit_ops, emits
from .ops_dense import weight_t
from .ops_rnn import rnn_layer

INT64 = TensorProto.INT64


def build_rnn(g: LayerGraph, params: Mapping[str, tuple[int, ...]], opts: ExportOptions) -> tuple[LazyModel, LazyModel]:
    dec = next(op for op in g.ops() if op.kind == "rnn_decoder")
    return _encoder(g, dec, params, opts), _step(g, dec, params, opts)


def _linear(b: GraphBuilder, x: str, name: str, bias: bool = True) -> str:
    y = b.op("MatMul", [x, weight_t(b, f"{name}.weight")], scope=name)
    return b.op("Add", [y, b.param(f"{name}.bias")], scope=name) if bias else y


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
    init = b.op("Tanh", [_linear(b, h_final, f"{dec.name}.bridge")], scope=dec.name)  # [B, H]
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


@emits("rnn_decoder")
def make_rnn_decoder(b: GraphBuilder, dec: Op, xs: list[str]) -> str:
    """One decoder step [B, 1, hidden + enc_dim] from the previous state; the step graph (``_step``) puts the
    state inputs in ``b.memo["rnn_step"]`` and reads the next state from it (the loop lives in the runtime)."""
    step = b.memo.get("rnn_step")
    if step is None:
        raise NotImplementedError(f"{dec.name}: rnn_decoder exports as one step (the decoder_step graph)")
    att = dec.attrs.attention
    state, cstate, context = step["state"], step["cell_state"], step["context"]
    enc, mask = xs[1], xs[2] if len(xs) > 2 else ""
    y = b.op("Squeeze", [xs[0], b.i64(1)], scope=dec.name)  # [B, emb]
    top = b.op("Gather", [state, b.scalar_i64(dec.attrs.layers - 1)], scope=dec.name, axis=0)  # s_{t-1}, top layer
    weights_out = ""
    if att == "bahdanau":
        context, weights_out = _attend(b, dec, top, enc, mask)
        s_t, nxt_h, nxt_c = _cell(b, dec, b.op("Concat", [y, context], scope=dec.name, axis=-1), state, cstate)
    elif att == "none":
        s_t, nxt_h, nxt_c = _cell(b, dec, b.op("Concat", [y, context], scope=dec.name, axis=-1), state, cstate)
    else:  # Luong: the cell first, then attend with the new state
        s_t, nxt_h, nxt_c = _cell(b, dec, y, state, cstate)
        context, weights_out = _attend(b, dec, s_t, enc, mask)
    step.update(next_state=nxt_h, next_cell_state=nxt_c, weights=weights_out)
    return b.op("Unsqueeze", [b.op("Concat", [s_t, context], scope=dec.name, axis=-1), b.i64(1)], scope=dec.name)


def _cell(b: GraphBuilder, dec: Op, x: str, state: str, cstate: str) -> tuple[str, str, str]:
    """One time step through every layer: returns (top output, new h [L, B, H], new c [L, B, H] or "")."""
    a = dec.attrs
    cell, hidden = a.cell, a.hidden
    inp = b.op("Unsqueeze", [x, b.i64(0)], scope=dec.name)  # [1, B, in]
    hs, cs = [], []
    for k in range(a.layers):
        h0 = b.op("Slice", [state, b.i64(k), b.i64(k + 1), b.i64(0)], scope=dec.name)  # [1, B, H]
        c0 = b.op("Slice", [cstate, b.i64(k), b.i64(k + 1), b.i64(0)], scope=dec.name) if cstate else ""
        outs = rnn_layer(b, dec.name, cell, k, 1, hidden, inp, "", h0, c0)
        hs.append(outs[1])
        if cell == "lstm":
            cs.append(outs[2])
        inp = outs[1]  # [1, B, H]: the next layer's input
    top = b.op("Squeeze", [hs[-1], b.i64(0)], scope=dec.name)
    new_h = hs[0] if len(hs) == 1 else b.op("Concat", hs, scope=dec.name, axis=0)
    new_c = "" if not cs else cs[0] if len(cs) == 1 else b.op("Concat", cs, scope=dec.name, axis=0)
    return top, new_h, new_c


def _attend(b: GraphBuilder, dec: Op, query: str, enc: str, mask: str) -> tuple[str, str]:
    """Attention over encoder states for query [B, H]: (context [B, E], weights [B, 1, N])."""
    a = dec.attrs
    p = dec.name
    if a.attention == "bahdanau":  # e_i = vᵀ tanh(W s + U h_i + b)
        keys = _linear(b, enc, f"{p}.attn_key")  # [B, N, A]
        q = b.op("Unsqueeze", [_linear(b, query, f"{p}.attn_query", bias=False), b.i64(1)], scope=p)  # [B, 1, A]
        e = _linear(b, b.op("Tanh", [b.op("Add", [keys, q], scope=p)], scope=p), f"{p}.attn_v", bias=False)
        scores = b.op("Transpose", [e], scope=p, perm=[0, 2, 1])  # [B, 1, N]
    else:  # Luong: s · h_i (dot) or s · W h_i (general)
        keys = _linear(b, enc, f"{p}.attn_general", bias=False) if a.attention == "luong_general" else enc
        q = b.op("Unsqueeze", [query, b.i64(1)], scope=p)  # [B, 1, H]
        scores = b.op("MatMul", [q, b.op("Transpose", [keys], scope=p, perm=[0, 2, 1])], scope=p)  # [B, 1, N]
    if mask:
        keep = b.op("Unsqueeze", [b.op("Cast", [mask], scope=p, to=TensorProto.BOOL), b.i64(1)], scope=p)
        low = b.const(np.array(-1e9 if b.opts.dtype != "fp16" else -6e4), "rnn_mask_low")
        scores = b.op("Where", [keep, scores, low], scope=p)
    weights = b.op("Softmax", [scores], scope=p, axis=-1)
    context = b.op("Squeeze", [b.op("MatMul", [weights, enc], scope=p), b.i64(1)], scope=p)  # [B, E]
    return context, weights
