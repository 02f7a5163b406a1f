"""The op catalogue: for each op kind, its attributes (a frozen dataclass: field types and defaults), its shape
rule and its parameter rule, written once. An op's ``attrs`` is an instance of its kind's class, checked when
the graph is built (``specc.ir.attrs``).

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
  ``alibi_max_bias`` (when set) adds slope_h · (k - q) to head h's scores, slopes as
  ``specc.backends.torch.layers.attention.alibi_slopes`` computes them (Press 2022, MPT's rule), times ``scale``
  when ``alibi_scaled``; causality and windows still come from ``mask``. ``alibi_bf16``: the bias is
  bf16(bf16(slope_h) · k) at each key's position k (counted over the padding mask), a constant per query row
  away from slope_h · (k - q) but for the rounding, which it reproduces. ``temperature_floor`` (when set) scales q
  by 1 + ``temperature_scale`` · log(1 + floor((p + 1) / temperature_floor)) at position p, the token's index with
  the cache counted (Llama 4's attention temperature tuning on its NoPE layers).
- ``moe`` expert weights are ``[E, out, in]``; gates are softmax over router logits, top-``active``,
  renormalised when ``normalize``. Two attributes act in training only (Switch Transformer, Fedus 2021):
  ``jitter`` multiplies the router input by noise drawn from U(1 - jitter, 1 + jitter) (0: off), and
  ``aux_loss_coef`` weighs the load-balancing loss ``coef · E · Σ_e f_e · P_e``, where ``f_e`` is the fraction
  of the top-``active`` assignments that go to expert ``e`` (assignments to e / (T · active), T tokens) and
  ``P_e`` is the mean router probability of ``e`` over the T tokens. ``clamp_limit`` (when set) makes the
  swiglu experts GPT-OSS's: gate = min(gate, limit), up = clamp(up, ±limit), h = (up + 1) · gate · σ(α · gate).
  DeepSeek routing generalises the gates: scores are ``score`` (softmax | sigmoid) of the logits; the experts
  are chosen from ``scores + score_bias`` (when ``score_bias``) restricted to the ``top_groups`` best of
  ``groups`` equal groups (a group scored by its best expert, or the sum of its best two: ``group_score``);
  the gates are the chosen experts' unbiased scores, renormalised (sum + 1e-20) when ``normalize``, times
  ``routed_scale``. The routing lives in the op (the torch layer's ``select``), so expert dispatch takes
  (indices, weights) alone. ``weigh_input``: a chosen expert's gate multiplies its input instead of its output,
  expert(gate · x) (Llama 4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .attrs import OpAttrs, attrs_dataclass, optional

Dim = int | str
Shape = tuple[Dim, ...]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "quick_gelu", "tanh"]
Init = Literal["normal", "residual"]


@dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    init: str = "normal"  # normal (std) | residual (std / sqrt(2·layers)) | zeros | ones | rnn (U(±1/√H)) | constant
    # (constant: the value the op's attributes give, held by its module as ``constants``) | sinusoids (Whisper's)


@dataclass(frozen=True)
class OpDef:
    kind: str
    doc: str
    attrs: type[OpAttrs]  # the kind's attribute class: field types and defaults, written once
    shape: Callable[[Any, list[Shape]], Shape]
    params: Callable[[Any, list[Shape]], dict[str, ParamSpec]] | None = None


CATALOGUE: dict[str, OpDef] = {}


def _op(
    kind: str, doc: str, attrs: type[OpAttrs], shape: Callable[[Any, list[Shape]], Shape], params: Any = None
) -> None:
    assert not attrs.kind, f"{attrs.__name__} already declares {attrs.kind}: one class per op kind"
    attrs.kind = kind
    CATALOGUE[kind] = OpDef(kind, doc, attrs, shape, params)


def attrs_class(kind: str) -> type[OpAttrs]:
    return CATALOGUE[kind].attrs


def _plus(n: Dim, k: int) -> Dim:
    return n + k if isinstance(n, int) else f"{n}+{k}"


def _same(a: OpAttrs, s: list[Shape]) -> Shape:
    return s[0]


def _bias(bias: bool, shape: tuple[int, ...]) -> dict[str, ParamSpec]:
    return {"bias": ParamSpec(shape, "zeros")} if bias else {}


# -------------------------------------------------------------------------------------------- embeddings


@attrs_dataclass
class EmbeddingAttrs(OpAttrs):
    vocab: int
    dim: int
    scale: float = 1.0
    tied_to: str | None = optional()  # another op's parameter used as the table (the op then owns none)


_op(
    "embedding",
    "token ids [B,N] → vectors [B,N,dim], times `scale`",
    EmbeddingAttrs,
    lambda a, s: (*s[0], a.dim),
    lambda a, s: {} if a.tied_to else {"weight": ParamSpec((a.vocab, a.dim))},
)


@attrs_dataclass
class TypeEmbeddingAttrs(OpAttrs):
    vocab: int
    dim: int


_op(
    "type_embedding",
    "x + table[token_type_ids]; inputs [x, token_type_ids]",
    TypeEmbeddingAttrs,
    _same,
    lambda a, s: {"weight": ParamSpec((a.vocab, a.dim))},
)


@attrs_dataclass
class LearnedPosAttrs(OpAttrs):
    positions: int
    dim: int
    offset: int = 0  # table rows before position 0: position p reads row offset + p, a padded slot row offset - 1


_op(
    "learned_pos",
    "x + table[offset + position] (positions from the cached length, or counted along attention_mask)",
    LearnedPosAttrs,
    _same,
    lambda a, s: {"weight": ParamSpec((a.offset + a.positions, a.dim))},
)


@attrs_dataclass
class SinusoidalPosAttrs(OpAttrs):
    dim: int


_op("sinusoidal_pos", "x + sin/cos table (Vaswani 2017), no parameters", SinusoidalPosAttrs, _same)


@attrs_dataclass
class LearnedPos2dAttrs(OpAttrs):
    grid: int
    dim: int
    cls: bool = False  # the first token is a class token


_op(
    "learned_pos_2d",
    "x + row[i] + col[j] for patch (i, j); the class token (first, if `cls`) gets its own vector",
    LearnedPos2dAttrs,
    _same,
    lambda a, s: {
        "row": ParamSpec((a.grid, a.dim)),
        "col": ParamSpec((a.grid, a.dim)),
        **({"cls": ParamSpec((1, a.dim))} if a.cls else {}),
    },
)


@attrs_dataclass
class SinusoidalPos2dAttrs(OpAttrs):
    grid: int
    dim: int
    cls: bool = False


_op(
    "sinusoidal_pos_2d",
    "x + fixed 2-D sin/cos table (half the dims encode the row, half the column); class token gets zeros",
    SinusoidalPos2dAttrs,
    _same,
)


@attrs_dataclass
class PatchEmbedAttrs(OpAttrs):
    channels: int
    patch: int
    dim: int
    grid: int  # patches per side: image size // patch
    bias: bool = True


_op(
    "patch_embed",
    "pixel_values [B,C,S,S] → conv(kernel = stride = patch) → [B, grid², dim]",
    PatchEmbedAttrs,
    lambda a, s: (s[0][0], a.grid * a.grid, a.dim),
    lambda a, s: {"weight": ParamSpec((a.dim, a.channels, a.patch, a.patch)), **_bias(a.bias, (a.dim,))},
)


@attrs_dataclass
class Conv1dAttrs(OpAttrs):
    in_channels: int
    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0
    bias: bool = True
    tokens_out: bool = False  # the output laid out [B, T_out, C_out] (a sequence of tokens), not [B, C_out, T_out]


def conv_length(a: Conv1dAttrs, t: Dim) -> Dim:
    """T_out = (T + 2·padding − kernel) // stride + 1; symbolic lengths as Whisper's: "2*N" at stride 2 → N."""
    if isinstance(t, int):
        return (t + 2 * a.padding - a.kernel) // a.stride + 1
    if 2 * a.padding == a.kernel - 1 and a.stride == 1:
        return t
    if 2 * a.padding == a.kernel - 1 and t.startswith(f"{a.stride}*"):
        return t[len(f"{a.stride}*") :]
    raise ValueError(f"conv1d: no symbolic rule for length {t} at kernel {a.kernel}, stride {a.stride}")


def _conv1d_shape(a: Conv1dAttrs, s: list[Shape]) -> Shape:
    t = conv_length(a, s[0][2])
    return (s[0][0], t, a.out_channels) if a.tokens_out else (s[0][0], a.out_channels, t)


_op(
    "conv1d",
    "[B, C_in, T] → Conv1d(kernel, stride, padding) → [B, C_out, T_out], or [B, T_out, C_out] with `tokens_out` "
    "(Whisper's audio front-end)",
    Conv1dAttrs,
    _conv1d_shape,
    lambda a, s: {
        "weight": ParamSpec((a.out_channels, a.in_channels, a.kernel)),
        **_bias(a.bias, (a.out_channels,)),
    },
)


@attrs_dataclass
class SinusoidTableAttrs(OpAttrs):
    positions: int
    dim: int


_op(
    "sinusoid_table",
    "x + table[:N]: a parameter of `positions` rows holding Whisper's sinusoids ([sin | cos] halves, timescales "
    "log-spaced from 1 to 10⁴), loaded or computed, never trained (transformers' embed_positions.weight)",
    SinusoidTableAttrs,
    _same,
    lambda a, s: {"weight": ParamSpec((a.positions, a.dim), "sinusoids")},
)


@attrs_dataclass
class ClsTokenAttrs(OpAttrs):
    dim: int


_op(
    "cls_token",
    "prepend a learned class token: [B,N,D] → [B,N+1,D]",
    ClsTokenAttrs,
    lambda a, s: (s[0][0], _plus(s[0][1], 1), s[0][2]),
    lambda a, s: {"token": ParamSpec((1, 1, a.dim))},
)


@attrs_dataclass
class ProbeAttrs(OpAttrs):
    dim: int


_op(
    "probe",
    "a learned query token per example, for attention pooling: [B,N,D] → [B,1,D] (SigLIP's probe)",
    ProbeAttrs,
    lambda a, s: (s[0][0], 1, s[0][2]),
    lambda a, s: {"token": ParamSpec((1, 1, a.dim))},
)

# -------------------------------------------------------------------------------------------- per token


@attrs_dataclass
class LayerNormAttrs(OpAttrs):
    dim: int
    eps: float = 1e-5
    bias: bool = True


_op(
    "layernorm",
    "LayerNorm over the last axis",
    LayerNormAttrs,
    _same,
    lambda a, s: {"weight": ParamSpec((a.dim,), "ones"), **_bias(a.bias, (a.dim,))},
)


@attrs_dataclass
class RMSNormAttrs(OpAttrs):
    dim: int
    eps: float = 1e-5
    unit_offset: bool = False


_op(
    "rmsnorm",
    "RMSNorm over the last axis: x / sqrt(mean(x²) + eps) · weight, or · (1 + weight) with `unit_offset` "
    "(the weight then starts at 0)",
    RMSNormAttrs,
    _same,
    lambda a, s: {"weight": ParamSpec((a.dim,), "zeros" if a.unit_offset else "ones")},
)


@attrs_dataclass
class SliceRMSNormAttrs(OpAttrs):
    dim: int  # group width: head_dim (per head) or width (the whole slice)
    start: int
    width: int
    eps: float = 1e-5
    unit_offset: bool = False
    affine: bool = True  # False: no weight, x · rsqrt(mean(x²) + eps) alone (Llama 4's L2 norm)


_op(
    "slice_rmsnorm",
    "RMSNorm (as `rmsnorm`) of features [start, start + width) of the last axis in groups of `dim` (QK-norm "
    "on a packed projection: per head dim = head_dim, full width dim = width); the other features pass through",
    SliceRMSNormAttrs,
    _same,
    lambda a, s: {"weight": ParamSpec((a.dim,), "zeros" if a.unit_offset else "ones")} if a.affine else {},
)


@attrs_dataclass
class LinearAttrs(OpAttrs):
    in_features: int
    out_features: int
    bias: bool = True
    init: Init | None = optional()  # the weight's init rule; None: normal
    tied_to: str | None = optional()  # another op's parameter used as the weight (the op then owns none)
    # The output features [start, stop) that carry the bias, when not all do (a packed q|k|v whose key has
    # none: Whisper); the bias parameter holds those features only, in order. None: every feature.
    bias_spans: tuple[tuple[int, int], ...] | None = optional()

    @property
    def bias_width(self) -> int:
        """Features of the bias parameter."""
        if not self.bias:
            return 0
        return self.out_features if self.bias_spans is None else sum(b - a for a, b in self.bias_spans)


_op(
    "linear",
    "x @ weightᵀ + bias over the last axis (with `bias_spans`, the bias of the listed output features only, the "
    "others none)",
    LinearAttrs,
    lambda a, s: (*s[0][:-1], a.out_features),
    lambda a, s: {
        **({} if a.tied_to else {"weight": ParamSpec((a.out_features, a.in_features), a.init or "normal")}),
        **_bias(a.bias, (a.bias_width,)),
    },
)


@attrs_dataclass
class ActivationAttrs(OpAttrs):
    fn: Activation


_op("activation", "elementwise fn: relu | gelu | gelu_tanh | silu | quick_gelu | tanh", ActivationAttrs, _same)


@attrs_dataclass
class GluAttrs(OpAttrs):
    fn: Activation


_op("glu", "fn(gate) * up; inputs [gate, up]", GluAttrs, _same)


@attrs_dataclass
class AddAttrs(OpAttrs):
    dropout: float = 0.0  # on the branch, in training


_op("add", "residual: inputs [x, branch] → x + dropout(branch)", AddAttrs, _same)


@attrs_dataclass
class ScaleAttrs(OpAttrs):
    factor: float


_op("scale", "x · factor", ScaleAttrs, _same)


@attrs_dataclass
class SoftcapAttrs(OpAttrs):
    cap: float


_op("softcap", "cap · tanh(x / cap)", SoftcapAttrs, _same)


@attrs_dataclass
class SigmoidGateAttrs(OpAttrs):
    pass


_op("sigmoid_gate", "sigmoid(gate) · x; inputs [x, gate [..., 1]] (a gated shared expert)", SigmoidGateAttrs, _same)


@attrs_dataclass
class DropoutAttrs(OpAttrs):
    p: float


_op("dropout", "dropout(x, p) in training, identity in inference", DropoutAttrs, _same)


@attrs_dataclass
class PoolAttrs(OpAttrs):
    mode: Literal["mean", "cls", "eos", "last"]
    # mode eos (CLIP text): the token at the first position of this id in input_ids (the op's second input);
    # None: at the position of the largest id (CLIP configs before the EOS id was fixed)
    eos_token_id: int | None = optional()


_op(
    "pool",
    "[B,N,D] → [B,D]: mean over tokens (`mode: mean`), the first token (`mode: cls`), the last (`mode: last`) or "
    "the token at the EOS id in input_ids (`mode: eos`, second input)",
    PoolAttrs,
    lambda a, s: (s[0][0], s[0][2]),
)

# -------------------------------------------------------------------------------------------- contrastive


@attrs_dataclass
class L2NormalizeAttrs(OpAttrs):
    dim: int


_op("l2_normalize", "x / ‖x‖₂ over the last axis, no eps (CLIP's and SigLIP's embeddings)", L2NormalizeAttrs, _same)


@attrs_dataclass
class ContrastiveAttrs(OpAttrs):
    dim: int
    logit_scale: float = 2.6592  # the learned log-temperature's initial value
    logit_bias: float | None = None  # the learned logit bias's initial value; None: no bias


_op(
    "contrastive",
    "inputs [text [B_t, dim], image [B_i, dim]] → logits_per_text [B_t, B_i] = exp(logit_scale) · text · imageᵀ "
    "(+ logit_bias); parameters logit_scale [1] and logit_bias [1], starting at their attributes' values",
    ContrastiveAttrs,
    lambda a, s: (s[0][0], s[1][0]),
    lambda a, s: {
        "logit_scale": ParamSpec((1,), "constant"),
        **({"logit_bias": ParamSpec((1,), "constant")} if a.logit_bias is not None else {}),
    },
)


@attrs_dataclass
class TransposeAttrs(OpAttrs):
    pass


_op(
    "transpose",
    "[M, N] → [N, M] (logits_per_image from logits_per_text)",
    TransposeAttrs,
    lambda a, s: (s[0][1], s[0][0]),
)


# -------------------------------------------------------------------------------------------- attention


@attrs_dataclass
class AttentionAttrs(OpAttrs):
    """The defaults are the torch layers' constructor defaults (SelfAttention, Rotary), which the codegen
    leaves out of the source it writes; a test holds them equal."""

    heads: int
    kv_heads: int
    head_dim: int
    mask: Literal["none", "causal", "padding", "sliding_window", "prefix", "chunked", "local"] = "causal"
    window: int | None = None
    prefix: int | None = None
    scale: float | None = None  # None: 1/√head_dim (lowering always resolves it)
    scale_stated: bool = False  # the spec states `scale`: a variant of other head_dim keeps it (Gemma's)
    softcap: float | None = None
    chunk: int | None = None
    rope_dims: int = 0
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rope_interleaved: bool = False
    dropout: float = 0.0
    cross: bool = False
    padding: bool = False  # the last input is the key padding mask
    alibi_max_bias: float | None = None  # ALiBi: slope_h · (k - q) added to head h's scores (None: no ALiBi)
    alibi_scaled: bool = False  # the ALiBi bias is multiplied by `scale` too (Falcon-RW)
    alibi_bf16: bool = False  # slopes and slope · key position rounded to bfloat16 (Falcon-RW's code)
    sinks: bool = False  # parameter `sinks` [heads]: a logit per head in the softmax denominator (GPT-OSS)
    position_bias: bool = False  # input 1 is an additive bias [1, H, N_q, N_k] (a relative_bias op's output)
    temperature_floor: int | None = None  # q × (1 + temperature_scale · log1p(floor((p + 1) / floor))) (Llama 4)
    temperature_scale: float = 0.1


def _attention_shape(a: AttentionAttrs, s: list[Shape]) -> Shape:
    q = s[0]
    return (q[0], q[1], a.heads * a.head_dim)


_op(
    "attention",
    "fused scaled-dot-product attention (QKᵀ, softmax, AV) on packed heads; no parameters but the sinks (`sinks`: "
    "one logit per head, softmax over [scores, sink], the sink's share dropped)",
    AttentionAttrs,
    _attention_shape,
    lambda a, s: {"sinks": ParamSpec((a.heads,))} if a.sinks else {},
)


@attrs_dataclass
class RelativeBiasAttrs(OpAttrs):
    heads: int
    buckets: int
    max_distance: int
    bidirectional: bool  # the encoder's; a causal stack buckets only k ≤ q


_op(
    "relative_bias",
    "T5's relative position bias [1, H, N_q, N_k]: table[bucket(k - q), h], queries the last N_q of N_k positions "
    "(input: the stack's token ids [B, N_q]; bucket as transformers' T5Attention._relative_position_bucket)",
    RelativeBiasAttrs,
    lambda a, s: (1, a.heads, s[0][1], s[0][1]),
    lambda a, s: {"weight": ParamSpec((a.buckets, a.heads))},
)


@attrs_dataclass
class LatentAttentionAttrs(OpAttrs):
    """Multi-head latent attention (DeepSeek-V2/V3). Inputs ``[q, latent, padding mask?]``: q ``[B, N, heads ·
    (nope_head_dim + rope_head_dim)]`` (each head ``[nope | rope]``), latent ``[B, N, kv_rank + rope_head_dim]``
    (the normalised KV latent, then the one rotary key all heads share). The parameter ``kv_b.weight``
    ``[heads · (nope_head_dim + v_head_dim), kv_rank]`` expands the latent into each head's ``[k_nope | v]``;
    k = ``[k_nope | rotary key]``. RoPE (``rope_dims`` > 0) turns the rope parts of q and of the key as
    ``attention`` does. The KV cache holds the latent and the rotated key (kv_rank + rope_head_dim per token
    and layer). The defaults are the torch ``LatentAttention`` layer's."""

    heads: int
    nope_head_dim: int
    rope_head_dim: int
    v_head_dim: int
    kv_rank: int
    mask: Literal["none", "causal", "padding", "sliding_window", "prefix", "chunked", "local"] = "causal"
    window: int | None = None
    prefix: int | None = None
    chunk: int | None = None
    scale: float | None = None  # None: (nope + rope)^-½ (lowering always resolves it)
    scale_stated: bool = False  # the spec states `scale`: a variant of other head dims keeps it
    rope_dims: int = 0
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rope_interleaved: bool = False
    dropout: float = 0.0
    padding: bool = False  # the last input is the key padding mask

    @property
    def head_dim(self) -> int:
        """The q/k head size."""
        return self.nope_head_dim + self.rope_head_dim

    @property
    def cross(self) -> bool:
        """Latent attention is self-attention only (read where any attention core may be)."""
        return False


_op(
    "latent_attention",
    "multi-head latent attention core: the KV latent expanded per head by `kv_b`, then QKᵀ, softmax, AV",
    LatentAttentionAttrs,
    lambda a, s: (s[0][0], s[0][1], a.heads * a.v_head_dim),
    lambda a, s: {"kv_b.weight": ParamSpec((a.heads * (a.nope_head_dim + a.v_head_dim), a.kv_rank))},
)

# The self-attention cores (the kinds that hold a KV cache while decoding).
ATTENTION_KINDS = ("attention", "latent_attention")


@attrs_dataclass
class MoEAttrs(OpAttrs):
    """The defaults are the torch ``MoE`` layer's constructor defaults."""

    experts: int
    active: int
    expert: Literal["classic", "swiglu"] = "swiglu"
    dim: int
    hidden: int
    activation: Activation = "silu"
    normalize: bool = True
    aux_loss_coef: float = 0.0
    jitter: float = 0.0
    bias: bool = False
    # DeepSeek-V2/V3 routing; the defaults are softmax → top-`active` (see the module docstring)
    score: Literal["softmax", "sigmoid"] = "softmax"
    score_bias: bool = False  # parameter `score_bias` [E]: added to the scores to choose, never to weight
    groups: int = 1
    top_groups: int = 1
    group_score: Literal["max", "top2_sum"] = "max"
    routed_scale: float = 1.0
    # GPT-OSS's clamped SwiGLU: (up + 1) · gate · σ(alpha · gate), gate ≤ limit, |up| ≤ limit (None: fn(gate) · up)
    clamp_limit: float | None = None
    clamp_alpha: float = 1.702
    weigh_input: bool = False  # the gate multiplies the expert's input, expert(gate · x) (Llama 4)


def _moe_params(a: MoEAttrs, s: list[Shape]) -> dict[str, ParamSpec]:
    e, h, d = a.experts, a.hidden, a.dim
    if a.expert == "swiglu":
        out = {
            "w_gate": ParamSpec((e, h, d)),
            "w_up": ParamSpec((e, h, d)),
            "w_down": ParamSpec((e, d, h), "residual"),
        }
    else:
        out = {"w_in": ParamSpec((e, h, d)), "w_out": ParamSpec((e, d, h), "residual")}
    if a.bias:
        if a.expert == "swiglu":
            out.update(b_gate=ParamSpec((e, h), "zeros"), b_up=ParamSpec((e, h), "zeros"))
        else:
            out["b_in"] = ParamSpec((e, h), "zeros")
        out["b_out" if a.expert == "classic" else "b_down"] = ParamSpec((e, d), "zeros")
    if a.score_bias:
        out["score_bias"] = ParamSpec((e,), "zeros")
    return out


_op(
    "moe",
    "mixture of experts: inputs [x, router_logits]; each token goes to its top-`active` experts. Training "
    "only: `jitter` multiplies the router input by U(1-jitter, 1+jitter); the load-balancing loss is "
    "`aux_loss_coef` · E · Σ_e f_e · P_e, f_e = fraction of the top-`active` assignments routed to expert e "
    "(assignments to e / (T·active)), P_e = mean router probability of e",
    MoEAttrs,
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


Cell = Literal["gru", "lstm", "rnn"]


@attrs_dataclass
class RNNAttrs(OpAttrs):
    cell: Cell
    input_size: int
    hidden: int
    layers: int = 1
    bidirectional: bool = False


_op(
    "rnn",
    "recurrent encoder: inputs [x, attention_mask?] → all hidden states [B,N,directions·hidden]",
    RNNAttrs,
    lambda a, s: (s[0][0], s[0][1], a.hidden * (2 if a.bidirectional else 1)),
    lambda a, s: rnn_param_specs(a.cell, a.input_size, a.hidden, a.layers, 2 if a.bidirectional else 1),
)


@attrs_dataclass
class RNNDecoderAttrs(OpAttrs):
    """The defaults are the torch ``RNNDecoder`` layer's constructor defaults."""

    cell: Cell
    input_size: int
    hidden: int
    layers: int
    enc_dim: int
    enc_directions: int = 1
    attention: Literal["none", "bahdanau", "luong_dot", "luong_general"] = "bahdanau"
    attention_dim: int | None = None  # None: hidden


def rnn_decoder_input_size(a: RNNDecoderAttrs) -> int:
    # Bahdanau and the fixed-context model feed the context vector into the cell; Luong attends after it.
    return a.input_size + (0 if a.attention.startswith("luong") else a.enc_dim)


def _rnn_decoder_params(a: RNNDecoderAttrs, s: list[Shape]) -> dict[str, ParamSpec]:
    h, e, att = a.hidden, a.enc_dim, a.attention
    out = rnn_param_specs(a.cell, rnn_decoder_input_size(a), h, a.layers, 1)
    out["bridge.weight"] = ParamSpec((h, e))
    out["bridge.bias"] = ParamSpec((h,), "zeros")
    if att == "bahdanau":
        ad = a.attention_dim or h
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
    RNNDecoderAttrs,
    lambda a, s: (s[0][0], s[0][1], a.hidden + a.enc_dim),
    _rnn_decoder_params,
)
