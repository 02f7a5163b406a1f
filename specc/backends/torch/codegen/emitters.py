"""One emitter per op kind: the module an op becomes (constructor source) and the expression that calls it.

Constructor attributes go through ``attr(key)``, which gives a literal, or the name of a constructor
parameter when blocks sharing one class differ in that attribute. Attributes the call expression (or the
parameter set) depends on are ``structural``: ops that differ in them never share a class.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ....ir.graph import Op
from ....spec.resolve import latent_yarn_factor

Attr = Callable[[str], str]


@dataclass(frozen=True)
class Call:
    """What the writer hands an emitter's call: the module expression and the argument expressions."""

    module: str  # "self.qkv"
    args: list[str]  # one per op input, in order
    state: str = "state"
    sized: dict[str, str] = field(default_factory=dict)  # model.py: attribute → its Config-derived expression


@dataclass(frozen=True)
class Emitter:
    call: Callable[[Op, Call], str]
    ctor: Callable[[Op, Attr], str] | None = None  # None: inline, no module
    structural: tuple[str, ...] = ()
    state: Callable[[Op], bool] = lambda op: False  # the call reads the per-call State
    depth: int = 1  # calls the expression nests (0 for inline arithmetic)
    variant: Callable[[Op], Any] = lambda op: None  # a further structural fact (e.g. rotary on or off)


EMITTERS: dict[str, Emitter] = {}


def _emits(kind: str, **kw: Any) -> None:
    EMITTERS[kind] = Emitter(**kw)


def lit(value: Any) -> str:
    """A Python literal, strings in double quotes (as ruff formats them)."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        return f"({', '.join(map(lit, value))}{',' if len(value) == 1 else ''})"
    if isinstance(value, list):
        return f"[{', '.join(map(lit, value))}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{lit(k)}: {lit(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _kwargs(a: Attr, op: Op, keys: tuple[str, ...], **defaults: Any) -> str:
    """``, key=value`` for each attribute that is a parameter or differs from the constructor's default: the
    op kind's declared default (the catalogue's attribute class), or the one given here."""
    out = []
    for key in keys:
        text = a(key)
        if text != lit(defaults[key] if key in defaults else type(op.attrs).default(key)):
            out.append(f", {key}={text}")
    return "".join(out)


def _module_call(op: Op, c: Call) -> str:
    return f"{c.module}({', '.join(c.args)})"


ACTIVATION_MODULES = {
    "relu": "nn.ReLU()",
    "gelu": "nn.GELU()",
    "gelu_tanh": 'nn.GELU(approximate="tanh")',
    "silu": "nn.SiLU()",
    "quick_gelu": "QuickGELU()",
    "tanh": "nn.Tanh()",
}


def _linear_ctor(op: Op, a: Attr) -> str:
    if op.attrs.bias_spans is not None:  # a bias on some output features only (Whisper's q|k|v)
        return f"SpanBiasLinear({a('in_features')}, {a('out_features')}, {a('bias_spans')})"
    bias = "" if op.attrs.bias else ", bias=False"
    return f"nn.Linear({a('in_features')}, {a('out_features')}{bias})"  # tied: its weight is the owner's (TIED)


_emits(
    "linear",
    call=_module_call,
    ctor=_linear_ctor,
    structural=("bias", "init"),
    variant=lambda op: op.attrs.bias_spans is not None,
)


def _conv1d_ctor(op: Op, a: Attr) -> str:
    extra = _kwargs(a, op, ("stride", "padding", "bias", "tokens_out"))
    return f"FrameConv1d({a('in_channels')}, {a('out_channels')}, {a('kernel')}{extra})"


_emits("conv1d", call=_module_call, ctor=_conv1d_ctor, structural=("tokens_out", "bias"))
_emits("sinusoid_table", call=_module_call, ctor=lambda op, a: f"SinusoidTable({a('positions')}, {a('dim')})")


def _embedding_call(op: Op, c: Call) -> str:
    scale = float(op.attrs.scale)
    x = _module_call(op, c)
    return x if scale == 1.0 else f"scaled({x}, {c.sized.get('scale', repr(scale))})"  # rounded to the dtype


def embedding_scale_of_width(op: Op) -> bool:
    """Whether an embedding's scale is sqrt(its width) (``embedding_scale: sqrt_d_model``): model.py's variants
    scale by their own width."""
    return op.kind == "embedding" and float(op.attrs.scale) != 1.0 and float(op.attrs.scale) == op.attrs.dim**0.5


_emits(
    "embedding",
    call=_embedding_call,
    ctor=lambda op, a: f"nn.Embedding({a('vocab')}, {a('dim')})",  # tied: its weight is the owner's (TIED)
    structural=("scale",),
)
_emits(
    "type_embedding",
    call=_module_call,
    ctor=lambda op, a: f"TypeEmbedding({a('vocab')}, {a('dim')})",
)


def _with_state(op: Op, c: Call) -> str:
    return f"{c.module}({', '.join([*c.args, c.state])})"


_emits(
    "learned_pos",
    call=_with_state,
    # a table with rows before position 0 (OPT, RoBERTa) is its own class, so GPT-2's model.py stays plain
    ctor=lambda op, a: (
        f"OffsetPositions({a('positions')}, {a('dim')}, {a('offset')})"
        if op.attrs.offset
        else f"LearnedPositions({a('positions')}, {a('dim')})"
    ),
    state=lambda op: True,
)
_emits(
    "sinusoidal_pos",
    call=_with_state,
    ctor=lambda op, a: f"SinusoidalPositions({a('dim')})",
    state=lambda op: True,
)
_emits(
    "relative_bias",
    call=_with_state,
    ctor=lambda op, a: f"RelativeBias({a('heads')}, {a('buckets')}, {a('max_distance')}, {a('bidirectional')})",
    structural=("bidirectional",),
    state=lambda op: True,
)
_emits(
    "learned_pos_2d",
    call=_module_call,
    ctor=lambda op, a: f"LearnedPositions2d({a('grid')}, {a('dim')}{_kwargs(a, op, ('cls',))})",
)
_emits(
    "sinusoidal_pos_2d",
    call=_module_call,
    ctor=lambda op, a: f"SinusoidalPositions2d({a('grid')}, {a('dim')}{_kwargs(a, op, ('cls',))})",
)
_emits(
    "patch_embed",
    call=_module_call,
    structural=("bias",),
    ctor=lambda op, a: (
        f"PatchEmbed({a('channels')}, {a('dim')}, {a('patch')}{'' if op.attrs.bias else ', bias=False'})"
    ),
)
_emits("cls_token", call=_module_call, ctor=lambda op, a: f"ClsToken({a('dim')})")
_emits("probe", call=_module_call, ctor=lambda op, a: f"Probe({a('dim')})")
_emits(
    "layernorm",
    call=_module_call,
    structural=("bias",),
    ctor=lambda op, a: f"nn.LayerNorm({a('dim')}, eps={a('eps')}{'' if op.attrs.bias else ', bias=False'})",
)
_emits(
    "rmsnorm",
    call=_module_call,
    structural=("unit_offset",),
    ctor=lambda op, a: f"{'OffsetRMSNorm' if op.attrs.unit_offset else 'RMSNorm'}({a('dim')}, eps={a('eps')})",
)
_emits(
    "slice_rmsnorm",
    call=_module_call,
    structural=("unit_offset", "affine"),
    ctor=lambda op, a: (
        f"SliceRMSNorm({a('dim')}, {a('start')}, {a('width')}, eps={a('eps')}"
        f"{', unit_offset=True' if op.attrs.unit_offset else ''}{'' if op.attrs.affine else ', affine=False'})"
    ),
)
_emits("activation", call=_module_call, ctor=lambda op, a: ACTIVATION_MODULES[op.attrs.fn], structural=("fn",))
_emits(
    "glu",
    call=lambda op, c: f"{c.module}({c.args[0]}) * {c.args[1]}",
    ctor=lambda op, a: ACTIVATION_MODULES[op.attrs.fn],
    structural=("fn",),
)
_emits("dropout", call=_module_call, ctor=lambda op, a: f"nn.Dropout({a('p')})")


def _add_call(op: Op, c: Call) -> str:
    p = op.attrs.dropout
    branch = f"F.dropout({c.args[1]}, {p!r}, self.training)" if p else c.args[1]
    return f"{c.args[0]} + {branch}"


_emits("add", call=_add_call, structural=("dropout",), depth=0)
_emits("scale", call=lambda op, c: f"{c.args[0]} * {float(op.attrs.factor)!r}", structural=("factor",), depth=0)
_emits(
    "softcap",
    call=lambda op, c: f"torch.tanh({c.args[0]} / {float(op.attrs.cap)!r}) * {float(op.attrs.cap)!r}",
    structural=("cap",),
    depth=1,
)
_emits("sigmoid_gate", call=lambda op, c: f"torch.sigmoid({c.args[1]}) * {c.args[0]}", depth=1)


def _pool_call(op: Op, c: Call) -> str:
    x = c.args[0]
    if op.attrs.mode == "mean":
        return f"{x}.mean(1)"
    if op.attrs.mode == "eos":  # the first position of the EOS id (or of the largest id) in each row
        ids = c.args[1]  # the input_ids (x, maybe an expression, appears once)
        hit = ids if op.attrs.eos_token_id is None else f"({ids} == {op.attrs.eos_token_id})"
        return f"{x}[torch.arange({ids}.shape[0], device={ids}.device), {hit}.int().argmax(-1)]"
    return f"{x}[:, -1]" if op.attrs.mode == "last" else f"{x}[:, 0]"


_emits("pool", call=_pool_call, structural=("mode", "eos_token_id"), depth=1)
# x / max(‖x‖, 1e-12): HF's x / ‖x‖ for every embedding that is not zero
_emits("l2_normalize", call=lambda op, c: f"F.normalize({c.args[0]}, dim=-1)", depth=1)
_emits("transpose", call=lambda op, c: f"{c.args[0]}.t()", depth=1)
_emits(
    "contrastive",
    call=_module_call,
    ctor=lambda op, a: f"Contrastive({a('logit_scale')}{_kwargs(a, op, ('logit_bias',))})",
)

# Keyword arguments of the layers, their defaults declared once with the op's attributes (a test holds the
# layer constructors' defaults equal to them).
SELF_ATTENTION_KWARGS = ("mask", "scale", "window", "prefix", "dropout", "chunk")
ROTARY_KWARGS = ("rope_scaling", "rope_interleaved")


def _unwritten_scale(op: Op) -> float | None:
    """The scale a core's constructor is not given: 1/√head_dim, its default, unless the spec states the scale
    (then written whatever its value, so a variant of other head dims keeps it)."""
    return None if op.attrs.scale_stated else 1.0 / op.attrs.head_dim**0.5


def _attention_ctor(op: Op, a: Attr) -> str:
    head = f"{a('heads')}, {a('kv_heads')}, {a('head_dim')}"
    scale = _unwritten_scale(op)
    if op.attrs.cross:
        return f"CrossAttention({head}{_kwargs(a, op, ('scale', 'dropout'), scale=scale)})"
    kwargs = _kwargs(a, op, SELF_ATTENTION_KWARGS, scale=scale)
    rope = _rotary(op, a)
    if op.attrs.position_bias:  # T5: the given relative position bias is the mask
        return f"BiasedAttention({head}{kwargs}{rope})"
    if op.attrs.sinks:  # a logit per head in the denominator: the explicit-softmax layer with its parameter
        softcap = f", softcap={a('softcap')}" if op.attrs.softcap else ""
        return f"SinkAttention({head}{kwargs}{rope}{softcap})"
    if op.attrs.softcap:  # SDPA cannot cap scores: the explicit-softmax layer
        return f"SoftcapAttention({head}{kwargs}{rope}, softcap={a('softcap')})"
    if op.attrs.alibi_max_bias is not None:  # the scores' additive bias is the mask: its own layer
        scaled = f", scaled={a('alibi_scaled')}" if op.attrs.alibi_scaled else ""
        scaled += f", bf16={a('alibi_bf16')}" if op.attrs.alibi_bf16 else ""
        return f"AlibiAttention({head}{kwargs}{rope}, max_bias={a('alibi_max_bias')}{scaled})"
    windowed = op.attrs.mask in ("sliding_window", "chunked")  # decoding reads the window only
    return f"{'Windowed' if windowed else 'Self'}Attention({head}{kwargs}{rope})"


def _attention_call(op: Op, c: Call) -> str:
    if op.attrs.cross:
        return _module_call(op, c)
    if op.attrs.padding:
        return _with_state(op, c)
    if op.attrs.position_bias:
        return f"{c.module}({c.args[0]}, {c.args[1]}, state={c.state})"
    return f"{c.module}({c.args[0]}, state={c.state})"


_emits(
    "attention",
    call=_attention_call,
    ctor=_attention_ctor,
    structural=("cross", "padding", "mask", "sinks", "position_bias"),  # differing masks (layer kinds): own classes
    variant=lambda op: (
        bool(op.attrs.rope_dims),
        bool(op.attrs.rope_scaling),
        bool(op.attrs.softcap),
        op.attrs.alibi_max_bias is not None,
        op.attrs.sinks,
        op.attrs.temperature_floor is not None,
    ),
    state=lambda op: not op.attrs.cross,
)


def _rotary(op: Op, a: Attr) -> str:
    """``, rope=Rotary(...)`` for a core that rotates (ScaledRotary with frequency scaling), else ""."""
    if getattr(op.attrs, "temperature_floor", None) is not None:  # in RoPE's place (a rule keeps them apart)
        return f", rope=Temperature({a('temperature_floor')}, {a('temperature_scale')})"
    if not op.attrs.rope_dims:
        return ""
    extra = _kwargs(a, op, ROTARY_KWARGS).replace(", rope_scaling=", ", scaling=")
    extra = extra.replace(", rope_interleaved=", ", interleaved=")
    rotary = "ScaledRotary" if op.attrs.rope_scaling else "Rotary"  # plain RoPE reads no scaling
    return f", rope={rotary}({a('rope_dims')}, {a('rope_theta')}{extra})"


def _latent_scale(op: Op, a: Attr) -> str:
    """The core's scale; under YaRN with mscale_all_dim, head_dim^-½ · mscale² as that expression of the head
    dims (where it gives the same float), so a variant's scale follows its own head dims."""
    sc = op.attrs.rope_scaling or {}
    f = latent_yarn_factor(sc.get("type"), sc.get("factor"), sc.get("mscale_all_dim"))
    if f != 1.0 and not op.attrs.scale_stated and 1.0 / float(op.attrs.head_dim) ** 0.5 * f == op.attrs.scale:
        return f"1.0 / ({a('nope_head_dim')} + {a('rope_head_dim')}) ** 0.5 * {f!r}"
    return a("scale")


def _latent_attention_ctor(op: Op, a: Attr) -> str:
    head = f"{a('heads')}, {a('nope_head_dim')}, {a('rope_head_dim')}, {a('v_head_dim')}, {a('kv_rank')}"
    scaled = lambda key: _latent_scale(op, a) if key == "scale" else a(key)
    kwargs = _kwargs(scaled, op, SELF_ATTENTION_KWARGS, scale=_unwritten_scale(op))
    return f"LatentAttention({head}{kwargs}{_rotary(op, a)})"


def _latent_attention_call(op: Op, c: Call) -> str:
    if op.attrs.padding:
        return _with_state(op, c)
    return f"{c.module}({c.args[0]}, {c.args[1]}, state={c.state})"


_emits(
    "latent_attention",
    call=_latent_attention_call,
    ctor=_latent_attention_ctor,
    structural=("padding", "mask"),
    variant=lambda op: (bool(op.attrs.rope_dims), bool(op.attrs.rope_scaling)),
    state=lambda op: True,
)

MOE_KWARGS = (
    "expert",
    "activation",
    "normalize",
    "bias",
    "aux_loss_coef",
    "jitter",
    *("score", "score_bias", "groups", "top_groups", "group_score", "routed_scale"),  # DeepSeek routing
    *("clamp_limit", "clamp_alpha"),  # GPT-OSS's clamped SwiGLU
    "weigh_input",  # Llama 4: the gate scales the expert's input
)  # defaults: MoEAttrs


def _moe_ctor(op: Op, a: Attr) -> str:
    return f"MoE({a('experts')}, {a('active')}, {a('dim')}, {a('hidden')}{_kwargs(a, op, MOE_KWARGS)})"


_emits(
    "moe",
    call=_module_call,
    ctor=_moe_ctor,
    structural=("expert", "bias", "score_bias"),
    variant=lambda op: bool(op.attrs.jitter),
)  # jitter > 0: the router's input goes through route()

RNN_MODULES = {"gru": "nn.GRU", "lstm": "nn.LSTM", "rnn": "nn.RNN"}


def _rnn_ctor(op: Op, a: Attr) -> str:
    cls = RNN_MODULES[op.attrs.cell]
    return (
        f"{cls}({a('input_size')}, {a('hidden')}, {a('layers')}, batch_first=True, bidirectional={a('bidirectional')})"
    )


_emits(
    "rnn",
    call=lambda op, c: f"rnn_states({c.module}, {', '.join(c.args)})",
    ctor=_rnn_ctor,
    structural=("cell",),
)


def _rnn_decoder_ctor(op: Op, a: Attr) -> str:
    head = f"{a('cell')}, {a('input_size')}, {a('hidden')}, {a('layers')}, {a('enc_dim')}"
    return f"RNNDecoder({head}{_kwargs(a, op, ('enc_directions', 'attention', 'attention_dim'))})"


_emits("rnn_decoder", call=_with_state, ctor=_rnn_decoder_ctor, state=lambda op: True)


def ctor_attrs(op: Op) -> dict[str, Any]:
    """The attributes that may differ between ops sharing a class (constructor arguments)."""
    e = EMITTERS[op.kind]
    return {k: v for k, v in op.attrs.to_dict().items() if k not in e.structural} if e.ctor else {}
