"""Rules of the recurrent encoder and decoder: cell FLOPs are O(N); attention adds O(N) per decoder step."""

from __future__ import annotations

from ...ir.ops import CATALOGUE, GATES, RNNAttrs, RNNDecoderAttrs, rnn_decoder_input_size
from .. import constants as C
from .common import Attrs, Ctx, Dims, Flop, Mem, io_bytes, numel


def _cells(cell: str, steps: int, b: int, input_size: int, hidden: int, layers: int, dirs: int) -> tuple[int, int]:
    """(matmul, other) FLOPs of a stacked (bi)directional RNN over ``steps`` steps."""
    g = GATES[cell] * hidden
    matmul = sum(dirs * 2 * b * steps * g * ((input_size if k == 0 else hidden * dirs) + hidden) for k in range(layers))
    return matmul, layers * dirs * b * steps * hidden * C.RNN_CELL[cell]


def _cells_saved(cell: str, steps: int, b: int, input_size: int, hidden: int, layers: int, dirs: int) -> int:
    """Elements kept for the backward pass: each step's input, state and gate activations."""
    g = GATES[cell] * hidden
    return sum(dirs * b * steps * ((input_size if k == 0 else hidden * dirs) + hidden + g) for k in range(layers))


def _weights(kind: str, a: Attrs) -> int:
    return sum(numel(p.shape) for p in CATALOGUE[kind].params(a, []).values())  # type: ignore[misc]


def rnn_flops(a: RNNAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    b, n = ins[0][0], ins[0][1]
    dirs = 2 if a.bidirectional else 1
    matmul, other = _cells(a.cell, n, b, a.input_size, a.hidden, a.layers, dirs)
    return [Flop(matmul=matmul, other=other)]


def rnn_memory(a: RNNAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    b, n = ins[0][0], ins[0][1]
    dirs = 2 if a.bidirectional else 1
    saved = _cells_saved(a.cell, n, b, a.input_size, a.hidden, a.layers, dirs)
    between = 2 * b * n * a.hidden * dirs * (a.layers - 1)  # outputs of inner layers written and read
    return Mem(
        saved=saved * ctx.bytes,
        io=io_bytes(ins[:1], out, ctx) + between * ctx.bytes,
        weights_read=_weights("rnn", a),
    )


def _attention_parts(a: RNNDecoderAttrs, b: int, steps: int, n: int, once: bool) -> tuple[int, int, int]:
    """(matmul, other, softmax) FLOPs of the decoder's attention; ``once`` adds the per-sequence key work."""
    h, e, att = a.hidden, a.enc_dim, a.attention
    if att == "none":
        return 0, 0, 0
    softmax = C.SOFTMAX * b * steps * n
    context = 2 * b * steps * n * e  # Σ_i a_ti · h_i
    if att == "bahdanau":
        ad = a.attention_dim or h
        keys = (2 * b * n * e * ad, C.BIAS * b * n * ad) if once else (0, 0)  # U·h_i, computed once
        matmul = keys[0] + 2 * b * steps * h * ad + 2 * b * steps * n * ad + context  # W·s, vᵀ·tanh(…), context
        return matmul, keys[1] + C.ADDITIVE_SCORE * b * steps * n * ad, softmax
    if att == "luong_general":
        keys = 2 * b * n * e * h if once else 0  # W·h_i, computed once
        return keys + 2 * b * steps * n * h + context, 0, softmax
    return 2 * b * steps * n * e + context, 0, softmax  # luong_dot: s·h_i


def rnn_decoder_flops(a: RNNDecoderAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> list[Flop]:
    b, steps, n = ins[0][0], ins[0][1], ins[1][1]
    h, e, once = a.hidden, a.enc_dim, not ctx.decode
    matmul, other = _cells(a.cell, steps, b, rnn_decoder_input_size(a), h, a.layers, 1)
    if once:  # bridge: s_0 = tanh(W·h_enc + b)
        matmul += 2 * b * e * h
        other += (C.BIAS + C.ACTIVATION["tanh"]) * b * h
    att_mm, att_other, softmax = _attention_parts(a, b, steps, n, once)
    return [
        Flop(matmul=matmul, other=other),
        Flop("rnn_attention", matmul=att_mm, other=att_other),
        Flop("softmax", other=softmax),
    ]


def rnn_decoder_memory(a: RNNDecoderAttrs, ins: list[Dims], out: Dims, ctx: Ctx) -> Mem:
    b, steps, n = ins[0][0], ins[0][1], ins[1][1]
    h, e, att = a.hidden, a.enc_dim, a.attention
    saved = _cells_saved(a.cell, steps, b, rnn_decoder_input_size(a), h, a.layers, 1)
    keys = {"bahdanau": a.attention_dim or h, "luong_general": h}.get(att, 0)
    if att != "none":
        saved += b * steps * n * (1 + ((a.attention_dim or h) if att == "bahdanau" else 0))  # probs, tanh(…)
    state = a.layers * b * h * (2 if a.cell == "lstm" else 1)
    return Mem(
        saved=saved * ctx.bytes,
        io=io_bytes(ins[:2], out, ctx) + 2 * b * n * keys * ctx.bytes,
        weights_read=_weights("rnn_decoder", a),
        kv_cache=(b * n * (e + keys) + state) * ctx.bytes,  # encoder states, projected keys, decoder state
    )


RULES = {"rnn": (rnn_flops, rnn_memory), "rnn_decoder": (rnn_decoder_flops, rnn_decoder_memory)}
