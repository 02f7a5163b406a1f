"""The recurrent encoder (``rnn`` op) as ONNX GRU / LSTM / RNN nodes, one per layer (both directions in one).

Parameters keep PyTorch's names and layouts as initializers (``weight_ih_l0``, ``bias_hh_l0_reverse``, ...);
the gate reordering ONNX needs (torch GRU r,z,n → ONNX z,r,h; LSTM i,f,g,o → i,o,f,c) is a Split/Concat
of those constants that ORT folds at load. ``linear_before_reset=1`` is PyTorch's GRU formulation.
Padding: ``sequence_lens`` from ``attention_mask`` (right padding, as ``pack_padded_sequence``) — outputs
past a row's length are zero and the backward direction starts at its last real token.
"""

from __future__ import annotations

from ...ir.graph import Op
from .builder import GraphBuilder
from .emit import emits

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
