"""The recurrent encoder (``rnn`` op) as ONNX GRU / LSTM / RNN nodes, one per layer (both directions in one), and
one step of the RNN decoder (``rnn_decoder``: cells and Bahdanau / Luong attention over the encoder states).

Parameters keep PyTorch's names and layouts as initializers (``weight_ih_l0``, ``bias_hh_l0_reverse``, ...);
the gate reordering ONNX needs (torch GRU r,z,n → ONNX z,r,h; LSTM i,f,g,o → i,o,f,c) is a Split/Concat
of those constants that ORT folds at load. ``linear_before_reset=1`` is PyTorch's GRU formulation.
Padding: ``sequence_lens`` from ``attention_mask`` (right padding, as ``pack_padded_sequence``) — outputs
past a row's length are zero and the backward direction starts at its last real token.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ...ir.graph import Op
from .builder import GraphBuilder
from .op_registry import emits
from .ops_dense import weight_t

ONNX_OP = {"gru": "GRU", "lstm": "LSTM", "rnn": "RNN"}
# position of each ONNX gate in PyTorch's gate order
GATE_ORDER = {"gru": (1, 0, 2), "lstm": (0, 3, 1, 2), "rnn": (0,)}


def _gates(b: GraphBuilder, name: str, cell: str) -> str:
    """A PyTorch [gates·H, ...] tensor reordered to ONNX's gate order."""
    order = GATE_ORDER[cell]
    if len(order) == 1:
        return b.param(name)
    parts = b.op("Split", [b.param(name)], scope=name, outputs=len(order), axis=0, num_outputs=len(order))
    return b.op("Concat", [parts[i] for i in order], scope=name, axis=0)


def rnn_weights(b: GraphBuilder, prefix: str, cell: str, layer: int, directions: int) -> tuple[str, str, str]:
    """ONNX W [dirs, G·H, in], R [dirs, G·H, H], B [dirs, 2·G·H] for one layer."""
    w, r, bias = [], [], []
    for sfx in ("", "_reverse")[:directions]:
        w.append(_gates(b, f"{prefix}.weight_ih_l{layer}{sfx}", cell))
        r.append(_gates(b, f"{prefix}.weight_hh_l{layer}{sfx}", cell))
        bi = _gates(b, f"{prefix}.bias_ih_l{layer}{sfx}", cell)
        bh = _gates(b, f"{prefix}.bias_hh_l{layer}{sfx}", cell)
        bias.append(b.op("Concat", [bi, bh], scope=prefix, axis=0))

    def stack(items: list[str]) -> str:
        items = [b.op("Unsqueeze", [t, b.i64(0)], scope=prefix) for t in items]
        return items[0] if len(items) == 1 else b.op("Concat", items, scope=prefix, axis=0)

    return stack(w), stack(r), stack(bias)


def rnn_layer(
    b: GraphBuilder,
    prefix: str,
    cell: str,
    layer: int,
    directions: int,
    hidden: int,
    x_tbd: str,
    lens: str = "",
    h0: str = "",
    c0: str = "",
) -> list[str]:
    """One ONNX recurrent node over time-major x [T, B, in]; returns [Y [T, dirs, B, H], Y_h, (Y_c)]."""
    w, r, bias = rnn_weights(b, prefix, cell, layer, directions)
    ins = [x_tbd, w, r, bias, lens, h0]
    attrs: dict = {"hidden_size": hidden, "direction": "bidirectional" if directions == 2 else "forward"}
    if cell == "gru":
        attrs["linear_before_reset"] = 1
    if cell == "lstm":
        ins += [c0]
    n_out = 3 if cell == "lstm" else 2
    return b.op(ONNX_OP[cell], ins, scope=f"{prefix}.l{layer}", outputs=n_out, **attrs)


def sequence_lengths(b: GraphBuilder, mask: str) -> str:
    """attention_mask [B, N] → int32 lengths [B]."""
    key = ("lens", mask)
    if key not in b.memo:
        total = b.op("ReduceSum", [mask, b.i64(1)], scope="lens", keepdims=0)
        b.memo[key] = b.op("Cast", [total], scope="lens", to=6)  # INT32
    return b.memo[key]


@emits("rnn")
def make_rnn(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    a = op.attrs
    cell, hidden, layers = a.cell, a.hidden, a.layers
    dirs = 2 if a.bidirectional else 1
    lens = sequence_lengths(b, xs[1]) if len(xs) > 1 and xs[1] else ""
    x = b.op("Transpose", [xs[0]], scope=op.name, perm=[1, 0, 2])  # [N, B, in]
    finals = []
    for k in range(layers):
        outs = rnn_layer(b, op.name, cell, k, dirs, hidden, x, lens)
        y = outs[0]  # [N, dirs, B, H]
        finals.append(outs[1])
        y = b.op("Transpose", [y], scope=op.name, perm=[0, 2, 1, 3])  # [N, B, dirs, H]
        x = b.op("Reshape", [y, b.i64(0, 0, dirs * hidden)], scope=op.name)  # [N, B, dirs·H]
    b.memo[("rnn_final", op.name)] = finals[-1]  # [dirs, B, H]: forward h_T, backward h_1 of the top layer
    return b.op("Transpose", [x], scope=op.name, perm=[1, 0, 2])  # [B, N, dirs·H]


def linear(b: GraphBuilder, x: str, name: str, bias: bool = True) -> str:
    """x · W(name)ᵀ (+ bias): the bridge and the attention projections of the RNN decoder."""
    y = b.op("MatMul", [x, weight_t(b, f"{name}.weight")], scope=name)
    return b.op("Add", [y, b.param(f"{name}.bias")], scope=name) if bias else y


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
        keys = linear(b, enc, f"{p}.attn_key")  # [B, N, A]
        q = b.op("Unsqueeze", [linear(b, query, f"{p}.attn_query", bias=False), b.i64(1)], scope=p)  # [B, 1, A]
        e = linear(b, b.op("Tanh", [b.op("Add", [keys, q], scope=p)], scope=p), f"{p}.attn_v", bias=False)
        scores = b.op("Transpose", [e], scope=p, perm=[0, 2, 1])  # [B, 1, N]
    else:  # Luong: s · h_i (dot) or s · W h_i (general)
        keys = linear(b, enc, f"{p}.attn_general", bias=False) if a.attention == "luong_general" else enc
        q = b.op("Unsqueeze", [query, b.i64(1)], scope=p)  # [B, 1, H]
        scores = b.op("MatMul", [q, b.op("Transpose", [keys], scope=p, perm=[0, 2, 1])], scope=p)  # [B, 1, N]
    if mask:
        keep = b.op("Unsqueeze", [b.op("Cast", [mask], scope=p, to=TensorProto.BOOL), b.i64(1)], scope=p)
        low = b.const(np.array(-1e9 if b.opts.dtype != "fp16" else -6e4), "rnn_mask_low")
        scores = b.op("Where", [keep, scores, low], scope=p)
    weights = b.op("Softmax", [scores], scope=p, axis=-1)
    context = b.op("Squeeze", [b.op("MatMul", [weights, enc], scope=p), b.i64(1)], scope=p)  # [B, E]
    return context, weights
