"""The op catalogue: for each op kind, its shape rule and parameter rule, written once.

The other tables keyed by op kind live with their users and never write here: the FLOP and memory rules
(``specc.analysis.rules.RULES``), the torch layers and the ONNX emitters (``specc.backends.*``); one test
(tests/test_registries.py) asserts that all of them cover the same kinds. Shapes are symbolic tuples: ints, or
symbols ``B`` (batch), ``N`` (source / sequence length), ``N_dec`` (decoder length).

Conventions every backend follows:
- ``linear`` weights are ``[out, in]`` (PyTorch ``nn.Linear``); ``tied_to`` names another op's parameter
  used as this op's weight (the op then owns no weight).
- ``attention`` takes a packed self-attention input ``qkv`` with the last axis laid out as
  ``[q heads | k heads | v heads]`` each ``head_dim`` wide, or (cross) ``q`` and a packed ``kv = [k | v]``.
  An optional last input is the key padding mask ``[B, N_k]`` (1 = keep, 0 = pad). ``mask`` is the
  structural mask: none | causal | sliding_window (``window`` keys back, self included) | prefix (the first
  ``prefix`` positions see each other, the rest are causal) | chunked (causal inside each chunk of ``chunk``
  positions: k // chunk == q // chunk). ``scale`` multiplies the scores; ``softcap`` (when set) caps them
  as softcap · tanh(scores / softcap) before the mask. ``rope_dims`` > 0 rotates the first ``rope_dims``
  dims of each q/k head with base ``rope_theta``: the two halves together (GPT-NeoX), or adjacent pairs when
  ``rope_interleaved`` (GPT-J); ``rope_scaling`` (None or a dict with ``type`` and its parameters, defaults
  resolved) scales the frequencies and cos/sin as ``specc.backends.torch.layers.rope`` computes them.
- ``moe`` expert weights are ``[E, out, in]``; gates are softmax over router logits, top-``active``,
  renormalised when ``normalize``. Two attributes act in training only (Switch Transformer, Fedus 2021):
  ``jitter`` multiplies the router input by noise drawn from U(1 - jitter, 1 + jitter) (0: off), and
  ``aux_loss_coef`` weighs the load-balancing loss ``coef · E · Σ_e f_e · P_e``, where ``f_e`` is the fraction
  of the top-``active`` assignments that go to expert ``e`` (assignments to e / (T · active), T tokens) and
  ``P_e`` is the mean router probability of ``e`` over the T tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Dim = int | str
Shape = tuple[Dim, ...]
Attrs = dict[str, Any]


@dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    init: str = "normal"  # normal (std) | residual (std / sqrt(2·layers)) | zeros | ones | rnn (U(±1/√H))


@dataclass(frozen=True)
class OpDef:
    kind: str
    doc: str
    shape: Callable[[Attrs, list[Shape]], Shape]
    params: Callable[[Attrs, list[Shape]], dict[str, ParamSpec]] | None = None


CATALOGUE: dict[str, OpDef] = {}


def _op(kind: str, doc: str, shape: Callable[[Attrs, list[Shape]], Shape], params: Any = None) -> None:
    CATALOGUE[kind] = OpDef(kind, doc, shape, params)


def _plus(n: Dim, k: int) -> Dim:
    return n + k if isinstance(n, int) else f"{n}+{k}"


def _same(a: Attrs, s: list[Shape]) -> Shape:
    return s[0]


def _bias(a: Attrs, shape: tuple[int, ...]) -> dict[str, ParamSpec]:
    return {"bias": ParamSpec(shape, "zeros")} if a.get("bias") else {}


# -------------------------------------------------------------------------------------------- embeddings

_op(
    "embedding",
    "token ids [B,N] → vectors [B,N,dim], times `scale`",
    lambda a, s: (*s[0], a["dim"]),
    lambda a, s: {} if a.get("tied_to") else {"weight": ParamSpec((a["vocab"], a["dim"]))},
)
_op(
    "type_embedding",
    "x + table[token_type_ids]; inputs [x, token_type_ids]",
    _same,
    lambda a, s: {"weight": ParamSpec((a["vocab"], a["dim"]))},
)
_op(
    "learned_pos",
    "x + table[offset : offset+N] (offset = cached length during generation)",
    _same,
    lambda a, s: {"weight": ParamSpec((a["positions"], a["dim"]))},
)
_op("sinusoidal_pos", "x + sin/cos table (Vaswani 2017), no parameters", _same)
_op(
    "learned_pos_2d",
    "x + row[i] + col[j] for patch (i, j); the class token (first, if `cls`) gets its own vector",
    _same,
    lambda a, s: {
        "row": ParamSpec((a["grid"], a["dim"])),
        "col": ParamSpec((a["grid"], a["dim"])),
        **({"cls": ParamSpec((1, a["dim"]))} if a.get("cls") else {}),
    },
)
_op(
    "sinusoidal_pos_2d",
    "x + fixed 2-D sin/cos table (half the dims encode the row, half the column); class token gets zeros",
    _same,
)
_op(
    "patch_embed",
    "pixel_values [B,C,S,S] → conv(kernel = stride = patch) → [B, grid², dim]",
    lambda a, s: (s[0][0], a["grid"] * a["grid"], a["dim"]),
    lambda a, s: {"weight": ParamSpec((a["dim"], a["channels"], a["patch"], a["patch"])), **_bias(a, (a["dim"],))},
)
_op(
    "cls_token",
    "prepend a learned class token: [B,N,D] → [B,N+1,D]",
    lambda a, s: (s[0][0], _plus(s[0][1], 1), s[0][2]),
    lambda a, s: {"token": ParamSpec((1, 1, a["dim"]))},
)

# -------------------------------------------------------------------------------------------- per token

_op(
    "layernorm",
    "LayerNorm over the last axis",
    _same,
    lambda a, s: {"weight": ParamSpec((a["dim"],), "ones"), **_bias(a, (a["dim"],))},
)
_op(
    "rmsnorm",
    "RMSNorm over the last axis: x / sqrt(mean(x²) + eps) · weight, or · (1 + weight) with `unit_offset` "
    "(the weight then starts at 0)",
    _same,
    lambda a, s: {"weight": ParamSpec((a["dim"],), "zeros" if a.get("unit_offset") else "ones")},
)
_op(
    "slice_rmsnorm",
    "RMSNorm (as `rmsnorm`) of features [start, start + width) of the last axis in groups of `dim` (QK-norm "
    "on a packed projection: per head dim = head_dim, full width dim = width); the other features pass through",
    _same,
    lambda a, s: {"weight": ParamSpec((a["dim"],), "zeros" if a.get("unit_offset") else "ones")},
)
_op(
    "linear",
    "x @ weightᵀ + bias over the last axis",
    lambda a, s: (*s[0][:-1], a["out_features"]),
    lambda a, s: {
        **(
            {}
            if a.get("tied_to")
            else {"weight": ParamSpec((a["out_features"], a["in_features"]), a.get("init", "normal"))}
        ),
        **_bias(a, (a["out_features"],)),
    },
)
_op("activation", "elementwise fn: relu | gelu | gelu_tanh | silu | tanh", _same)
_op("glu", "fn(gate) * up; inputs [gate, up]", _same)
_op("add", "residual: inputs [x, branch] → x + dropout(branch)", _same)
_op("scale", "x · factor", _same)
_op("softcap", "cap · tanh(x / cap)", _same)
_op("sigmoid_gate", "sigmoid(gate) · x; inputs [x, gate [..., 1]] (a gated shared expert)", _same)
_op("dropout", "dropout(x, p) in training, identity in inference", _same)
_op(
    "pool",
    "[B,N,D] → [B,D]: mean over tokens (`mode: mean`) or the first token (`mode: cls`)",
    lambda a, s: (s[0][0], s[0][2]),
)

# -------------------------------------------------------------------------------------------- attention


def _attention_shape(a: Attrs, s: list[Shape]) -> Shape:
    q = s[0]
    return (q[0], q[1], a["heads"] * a["head_dim"])


_op(
    "attention",
    "fused scaled-dot-product attention (QKᵀ, softmax, AV) on packed heads; no parameters",
    _attention_shape,
)


def _moe_params(a: Attrs, s: list[Shape]) -> dict[str, ParamSpec]:
    e, h, d = a["experts"], a["hidden"], a["dim"]
    if a["expert"] == "swiglu":
        out = {
            "w_gate": ParamSpec((e, h, d)),
            "w_up": ParamSpec((e, h, d)),
            "w_down": ParamSpec((e, d, h), "residual"),
        }
    else:
        out = {"w_in": ParamSpec((e, h, d)), "w_out": ParamSpec((e, d, h), "residual")}
    if a.get("bias"):
        if a["expert"] == "swiglu":
            out.update(b_gate=ParamSpec((e, h), "zeros"), b_up=ParamSpec((e, h), "zeros"))
        else:
            out["b_in"] = ParamSpec((e, h), "zeros")
        out["b_out" if a["expert"] == "classic" else "b_down"] = ParamSpec((e, d), "zeros")
    return out


_op(
    "moe",
    "mixture of experts: inputs [x, router_logits]; each token goes to its top-`active` experts. Training "
    "only: `jitter` multiplies the router input by U(1-jitter, 1+jitter); the load-balancing loss is "
    "`aux_loss_coef` · E · Σ_e f_e · P_e, f_e = fraction of the top-`active` assignments routed to expert e "
    "(assignments to e / (T·active)), P_e = mean router probability of e",
    _same,
    _moe_params,
)

# -------------------------------------------------------------------------------------------- recurrent

GATES = {"gru": 3, "lstm": 4, "rnn": 1}


def rnn_param_specs(cell: str, input_size: int, hidden: int, layers: int, directions: int) -> dict[str, ParamSpec]:
    """nn.GRU / nn.LSTM / nn.RNN parameter names and shapes."""
    g = GATES[cell] * hidden
    out: dict[str, ParamSpec] = {}
    for k in range(layers):
        in_k = input_size if k == 0 else hidden * directions
        for sfx in ("", "_reverse")[:directions]:
            out[f"weight_ih_l{k}{sfx}"] = ParamSpec((g, in_k), "rnn")
            out[f"weight_hh_l{k}{sfx}"] = ParamSpec((g, hidden), "rnn")
            out[f"bias_ih_l{k}{sfx}"] = ParamSpec((g,), "rnn")
            out[f"bias_hh_l{k}{sfx}"] = ParamSpec((g,), "rnn")
    return out


_op(
    "rnn",
    "recurrent encoder: inputs [x, attention_mask?] → all hidden states [B,N,directions·hidden]",
    lambda a, s: (s[0][0], s[0][1], a["hidden"] * (2 if a["bidirectional"] else 1)),
    lambda a, s: rnn_param_specs(a["cell"], a["input_size"], a["hidden"], a["layers"], 2 if a["bidirectional"] else 1),
)


def rnn_decoder_input_size(a: Attrs) -> int:
    # Bahdanau and the fixed-context model feed the context vector into the cell; Luong attends after it.
    return a["input_size"] + (0 if a["attention"].startswith("luong") else a["enc_dim"])


def _rnn_decoder_params(a: Attrs, s: list[Shape]) -> dict[str, ParamSpec]:
    h, e, att = a["hidden"], a["enc_dim"], a["attention"]
    out = rnn_param_specs(a["cell"], rnn_decoder_input_size(a), h, a["layers"], 1)
    out["bridge.weight"] = ParamSpec((h, e))
    out["bridge.bias"] = ParamSpec((h,), "zeros")
    if att == "bahdanau":
        ad = a["attention_dim"]
        out["attn_query.weight"] = ParamSpec((ad, h))
        out["attn_key.weight"] = ParamSpec((ad, e))
        out["attn_key.bias"] = ParamSpec((ad,), "zeros")
        out["attn_v.weight"] = ParamSpec((1, ad))
    elif att == "luong_general":
        out["attn_general.weight"] = ParamSpec((h, e))
    return out


_op(
    "rnn_decoder",
    "recurrent decoder with fixed context or Bahdanau / Luong attention; inputs [y_embedded, encoder_states, "
    "attention_mask?] → [B, N_dec, hidden + enc_dim] (state and context of every step). The initial state of "
    "every layer is tanh(bridge(h_final)), h_final = the encoder's last state ([forward h_T | backward h_1] "
    "for `enc_directions` 2), which is also the fixed context when `attention` is none",
    lambda a, s: (s[0][0], s[0][1], a["hidden"] + a["enc_dim"]),
    _rnn_decoder_params,
)
