"""The spec language: pydantic v2 models, one per architecture family.

Shortcut forms (``bias: true``, ``position: rotary``, ``blocks: 6`` for both stacks, ``dropout: 0.1``) are
normalised by before-validators so that every consumer sees one canonical shape. Cross-field rules live in
``rules*.py`` and run from each family's after-validator (``check.check``, installed with ``install_check``), so
the Python API and the YAML loader enforce the same rules. The building blocks (limits, strict types,
shortcuts) live in ``schema_base.py`` and positions in ``schema_rope.py``; every name is importable from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StringConstraints,
    TypeAdapter,
    create_model,
    model_validator,
)

from .schema_base import (  # noqa: F401  (re-exported: the spec language's names live in this module)
    DTYPE_BYTES,
    MAX_BLOCKS,
    MAX_CONTEXT,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_VOCAB,
    MAX_WIDTH,
    Activation,
    Dtype,
    SBool,
    SInt,
    _all_flags,
    _dropout_shortcut,
    _Strict,
    _typed_shortcut,
)
from .schema_rope import Position, PositionField, RopeScaling  # noqa: F401  (re-exported)

# The cross-field rules read the classes below, so this module cannot import them: check.py installs its entry
# point here, and importing specc.spec (its __init__) imports check.py before any spec can be validated.
_check: Callable[[Any], None] | None = None


def install_check(check: Callable[[Any], None]) -> None:
    global _check
    _check = check


# ---------------------------------------------------------------------------------------------- parts


class BiasFlags(_Strict):
    """Which layers carry an additive bias."""

    qkv: SBool = Field(True, description="bias on the Q/K/V projections")
    out: SBool = Field(True, description="bias on the attention output projection")
    mlp: SBool = Field(True, description="bias on the MLP / expert projections")
    norm: SBool = Field(True, description="bias (beta) on LayerNorm; RMSNorm never has one")
    head: SBool = Field(False, description="bias on the LM / classifier head")
    # Per projection (self- and cross-attention alike), where one differs from qkv: Whisper's key has none.
    q: SBool | None = Field(None, description="bias on the query projections; default qkv")
    k: SBool | None = Field(None, description="bias on the key projections (Whisper: false); default qkv")
    v: SBool | None = Field(None, description="bias on the value projections; default qkv")


Bias = Annotated[
    BiasFlags,
    BeforeValidator(_all_flags(("qkv", "out", "mlp", "norm", "head")), json_schema_input_type=Union[bool, BiasFlags]),
]


class Dropout(_Strict):
    embedding: float = Field(0.0, ge=0.0, lt=1.0)
    attention: float = Field(0.0, ge=0.0, lt=1.0)
    residual: float = Field(0.0, ge=0.0, lt=1.0)


DropoutField = Annotated[Dropout, BeforeValidator(_dropout_shortcut, json_schema_input_type=Union[float, Dropout])]


class Latent(_Strict):
    """Multi-head latent attention (DeepSeek-V2/V3): K and V of every head are expanded from one compressed latent
    per token (the KV cache holds the latent and the shared rotary key), q optionally from a low-rank one."""

    kv_rank: SInt = Field(..., ge=1, le=MAX_WIDTH, description="width of the compressed KV latent (kv_lora_rank)")
    q_rank: SInt | None = Field(
        None, ge=1, le=MAX_WIDTH, description="width of the low-rank q latent (q_lora_rank); none: a full q projection"
    )
    rope_head_dim: SInt = Field(
        ..., ge=1, le=MAX_WIDTH, description="rotated part of each q/k head; the key's is one for all heads"
    )
    nope_head_dim: SInt = Field(..., ge=1, le=MAX_WIDTH, description="unrotated part of each q/k head")
    v_head_dim: SInt | None = Field(None, ge=1, le=MAX_WIDTH, description="value head size; default nope_head_dim")
    eps: float = Field(1e-6, gt=0, lt=1, description="eps of the RMSNorms on the q and KV latents")


class Temperature(_Strict):
    """Attention temperature tuning (Llama 4's NoPE layers, Nakanishi 2025): q scaled by a factor that grows with
    the position p (the token's index, cache included), 1 + scale · log(1 + floor((p + 1) / floor))."""

    floor: SInt = Field(8192, ge=1, le=MAX_CONTEXT, description="positions per step of the factor (floor_scale)")
    scale: float = Field(0.1, gt=0, le=100, description="the factor's strength (attn_scale)")


class Attention(_Strict):
    heads: SInt = Field(..., ge=1, le=MAX_HEADS, description="query heads H")
    kv_heads: SInt | None = Field(None, ge=1, le=MAX_HEADS, description="K/V heads (GQA/MQA); default H")
    head_dim: SInt | None = Field(None, ge=1, le=MAX_WIDTH, description="D_H; default d_model / heads")
    mask: Literal["causal", "none", "padding", "sliding_window", "prefix", "chunked", "local"] | None = Field(
        None,
        description="self-attention visibility (default: causal for decoders, none otherwise); local: the keys "
        "at most window // 2 positions away on either side (ModernBERT's local layers, encoders only); padding "
        "masks also come from attention_mask at run time",
    )
    window: SInt | None = Field(
        None,
        ge=1,
        le=MAX_CONTEXT,
        description="sliding_window: keys visible behind; local: the window's width (window // 2 each side)",
    )
    prefix: SInt | None = Field(None, ge=1, le=MAX_CONTEXT, description="prefix: bidirectional prefix length")
    chunk: SInt | None = Field(
        None, ge=1, le=MAX_CONTEXT, description="chunked: a query sees the keys of its own chunk of this many positions"
    )
    scale: float | None = Field(None, gt=0, description="score scale; default 1/sqrt(head_dim)")
    qk_norm: Literal["none", "head", "full", "l2"] = Field(
        "none",
        description="RMSNorm of q and k after the projection, before RoPE (norm.eps, norm.unit_offset): head = "
        "per head over head_dim (Qwen3, Gemma 3), full = over the projected width heads·head_dim and "
        "kv_heads·head_dim (OLMo-2); l2 = per head without a weight, x · rsqrt(mean(x²) + norm.eps) (Llama 4's "
        "L2 norm, which transformers applies after RoPE: the same, as a rotation keeps each head's norm)",
    )
    softcap: float | None = Field(
        None, gt=0, description="attention-logit softcapping: scores = softcap · tanh(scores / softcap) (Gemma 2)"
    )
    latent: Latent | None = Field(
        None,
        description="multi-head latent attention (DeepSeek-V2/V3): head_dim = nope_head_dim + rope_head_dim; "
        "default scale head_dim^-½ · mscale(factor, mscale_all_dim)² under YaRN",
    )
    sinks: SBool = Field(
        False,
        description="attention sinks: a learned logit per head in the softmax denominator, softmax over "
        "[scores, sink] with the sink's share dropped (GPT-OSS); one parameter per head",
    )
    temperature: Temperature | None = Field(
        None,
        description="attention temperature tuning: q × (1 + scale · log(1 + floor((p + 1) / floor))) at position p "
        "(Llama 4's attn_temperature_tuning, floor_scale, attn_scale), in layers without rotary positions",
    )


class Norm(_Strict):
    type: Literal["layernorm", "rmsnorm"] = "layernorm"
    placement: Literal["pre", "post", "sandwich", "output"] = Field(
        "pre",
        description="pre: x + f(norm(x)); post (BERT): norm(x + f(x)); sandwich (Gemma 2/3): "
        "x + norm_post(f(norm(x))); output (OLMo-2): x + norm_post(f(x))",
    )
    eps: float = Field(1e-5, gt=0, lt=1)
    unit_offset: SBool = Field(False, description="RMSNorm weight applied as (1 + weight), starting at 0 (Gemma)")
    final: SBool | None = Field(None, description="norm after the last block; default: false for post, else true")
    embedding: SBool = Field(False, description="norm after the embedding sum (BERT)")
    skip_first: SBool = Field(
        False,
        description="pre-norm: no norm before the first block's attention, whose input the embedding norm already "
        "normalised (ModernBERT)",
    )


class ClassicMLP(_Strict):
    type: Literal["classic"] = "classic"
    hidden: SInt | None = Field(None, ge=1, le=16 * MAX_WIDTH, description="default 4·d_model")
    activation: Activation = "gelu"


class SwiGLUMLP(_Strict):
    type: Literal["swiglu"] = "swiglu"
    hidden: SInt | None = Field(None, ge=1, le=16 * MAX_WIDTH, description="default 8·d_model/3 rounded up")
    multiple_of: SInt = Field(256, ge=1, le=1 << 16, description="round the default hidden size up to this")
    activation: Activation = "silu"


class Router(_Strict):
    normalize: SBool = Field(True, description="renormalise the top-A gate weights to sum to 1")
    aux_loss_coef: float = Field(
        0.01,
        ge=0.0,
        description="training only: weight of the Switch Transformer load-balancing loss coef · E · Σ_e f_e · P_e, "
        "f_e = fraction of tokens routed to expert e (top-A assignments to e / (T·A)), P_e = mean router "
        "probability of e; 0: no loss",
    )
    jitter: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="training only: multiply the router input by U(1-jitter, 1+jitter) noise (Switch Transformer); "
        "0: off",
    )
    # DeepSeek-V2/V3 routing (scores, a selection-only bias, group-limited top-k, a scale on the routed sum)
    score: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="expert scores from the router logits: softmax over experts, or sigmoid (DeepSeek-V3)"
    )
    score_bias: SBool = Field(
        False,
        description="a per-expert bias added to the scores only to choose the experts, not to weight them "
        "(DeepSeek-V3's e_score_correction_bias, set by load balancing rather than gradients)",
    )
    groups: SInt = Field(
        1, ge=1, le=MAX_EXPERTS, description="expert groups (n_group): a token picks its experts from top_groups"
    )
    top_groups: SInt | None = Field(
        None, ge=1, le=MAX_EXPERTS, description="groups a token may route to (topk_group); default all groups"
    )
    group_score: Literal["max", "top2_sum"] = Field(
        "max",
        description="a group's score for the group choice: its best expert's (DeepSeek-V2) or the sum of its best "
        "two (DeepSeek-V3), from the biased scores",
    )
    scale: float = Field(1.0, gt=0, description="multiply the routed experts' weights by this (routed_scaling_factor)")
    bias: SBool = Field(False, description="an additive bias on the router logits, one per expert (GPT-OSS)")
    weighs: Literal["output", "input"] = Field(
        "output",
        description="what a chosen expert's weight multiplies: its output, or its input, expert(weight · x) (Llama 4)",
    )


class SharedExpert(_Strict):
    """Expert(s) run on every token next to the routed ones (same expert type and activation)."""

    hidden: SInt = Field(..., ge=1, le=16 * MAX_WIDTH, description="total hidden size (n_shared · per-expert size)")
    gate: Literal["none", "sigmoid"] = Field(
        "none", description="sigmoid: output scaled by sigmoid(Linear(D, 1)(x)) (Qwen2-MoE); none: ungated"
    )


class ClampedSwiGLU(_Strict):
    """GPT-OSS's expert activation, in place of fn(gate) · up."""

    alpha: float = Field(1.702, gt=0, description="σ's slope: gate · σ(alpha · gate)")
    limit: float = Field(7.0, gt=0, description="gate = min(gate, limit), up = clamp(up, -limit, limit)")


class MoEMLP(_Strict):
    type: Literal["moe"] = "moe"
    experts: SInt = Field(..., ge=1, le=MAX_EXPERTS, description="E")
    active: SInt = Field(..., ge=1, le=MAX_EXPERTS, description="A: experts each token is routed to")
    expert: Literal["classic", "swiglu"] = "swiglu"
    hidden: SInt | None = Field(None, ge=1, le=16 * MAX_WIDTH, description="expert hidden size")
    multiple_of: SInt = Field(256, ge=1, le=1 << 16)
    activation: Activation | None = Field(None, description="default: silu for swiglu, gelu for classic")
    router: Router = Field(default_factory=Router)
    shared: SharedExpert | None = Field(None, description="shared expert(s) next to the routed ones")
    clamp: ClampedSwiGLU | None = Field(
        None,
        description="swiglu experts: (up + 1) · gate · σ(alpha · gate), gate = min(gate, limit), up = clamp(up, "
        "±limit) (GPT-OSS's swiglu_alpha, swiglu_limit); absent: silu(gate) · up",
    )


MLP = Annotated[
    Annotated[ClassicMLP | SwiGLUMLP | MoEMLP, Field(discriminator="type")],
    BeforeValidator(_typed_shortcut, json_schema_input_type=Union[str, ClassicMLP, SwiGLUMLP, MoEMLP]),
]


class Output(_Strict):
    """Transforms of the head's logits: logits = softcap(scale · head(x))."""

    softcap: float | None = Field(
        None, gt=0, description="final-logit softcapping: logits = softcap · tanh(logits / softcap) (Gemma 2)"
    )
    scale: float = Field(1.0, gt=0, description="multiply the logits by this (logit scale)")


def _patch(model: type[BaseModel], doc: str) -> Any:
    """``model`` with every field optional and no defaults: the keys a layer kind overrides (the given ones are
    ``model_fields_set``). Derived from ``model`` so that new fields are overridable without another edit."""
    fields: dict[str, Any] = {}
    for key, f in model.model_fields.items():
        typ = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
        fields[key] = (Optional[typ], Field(None, description=f.description))  # noqa: UP045 (typ is a value)
    return create_model(f"{model.__name__}Override", __base__=_Strict, __doc__=doc, **fields)


AttentionOverride = _patch(Attention, "attention keys of one layer kind, merged onto the top-level attention")
PositionOverride = _patch(Position, "position keys of one layer kind, merged onto the top-level position")
KindName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=64)]


class LayerKind(_Strict):
    """A named variant of the block: each part given overrides the top-level one for the layers of this kind."""

    attention: AttentionOverride | None = Field(None, description="merged onto the top-level attention (keys given)")
    position: Annotated[
        PositionOverride | None,
        BeforeValidator(_typed_shortcut, json_schema_input_type=Union[str, PositionOverride, None]),
    ] = Field(None, description="merged onto the top-level position ({type: none}: no RoPE in these layers)")
    mlp: MLP | None = Field(None, description="replaces the top-level mlp in these layers")


class Init(_Strict):
    std: float = Field(0.02, gt=0, le=10)
    scaled_residual: SBool = Field(True, description="scale residual output projections by 1/sqrt(2·layers)")
    seed: SInt = Field(0, ge=0)


class Image(_Strict):
    size: SInt = Field(..., ge=1, le=1 << 15)
    patch: SInt = Field(..., ge=1, le=1 << 15)
    channels: SInt = Field(3, ge=1, le=1 << 12)
    patch_bias: SBool = Field(True, description="bias on the patch convolution (CLIP's has none)")
    drop_remainder: SBool = Field(
        False,
        description="the patch convolution ignores the last size mod patch rows and columns, as a strided conv "
        "does (SigLIP so400m: 384 at patch 14 → 27 × 27 patches); false: size must be a multiple of patch",
    )


class Projection(_Strict):
    """A linear map of a tower's pooled output into the embedding space two towers share (CLIP's
    visual_projection / text_projection, SigLIP text's head)."""

    dim: SInt = Field(..., ge=1, le=MAX_WIDTH, description="embedding width (projection_dim)")
    bias: SBool = Field(False, description="an additive bias (SigLIP text's head has one, CLIP's have none)")


def _projection_shortcut(v: Any) -> Any:
    """``projection: 768`` → ``{dim: 768}``."""
    return {"dim": v} if isinstance(v, int) and not isinstance(v, bool) else v


ProjectionField = Annotated[
    Projection | None,
    BeforeValidator(_projection_shortcut, json_schema_input_type=Union[int, Projection, None]),
]


class Contrastive(_Strict):
    """How a dual encoder scores an image against a text: logits = exp(logit_scale) · cos(image, text) + logit_bias,
    both learned scalars (Radford 2021; Zhai 2023 adds the bias for the sigmoid loss)."""

    logit_scale: float = Field(
        2.6592, description="initial value of the learned log-temperature (logit_scale_init_value; CLIP: log 1/0.07)"
    )
    logit_bias: float | None = Field(
        None, description="initial value of a learned additive logit bias (SigLIP: -10); null: no bias"
    )


class Audio(_Strict):
    """Whisper's audio front-end in place of the encoder's token embedding: input_features [B, mel_bins, 2 ·
    positions] → Conv1d(k 3, pad 1) + GELU → Conv1d(k 3, stride 2, pad 1) + GELU → [B, positions, d_model] + a
    fixed sinusoidal table ([sin | cos] halves over log-spaced timescales up to 10⁴), held as a parameter of
    ``positions`` rows as transformers holds it (embed_positions.weight, never trained)."""

    mel_bins: SInt = Field(..., ge=1, le=1 << 12, description="input_features channels (num_mel_bins)")
    positions: SInt = Field(
        ...,
        ge=1,
        le=MAX_CONTEXT,
        description="encoder frames after the stride-2 convolution and rows of the sinusoidal table "
        "(max_source_positions); input_features hold at most 2 · positions frames",
    )


class StackBlocks(_Strict):
    encoder: SInt = Field(..., ge=1, le=MAX_BLOCKS)
    decoder: SInt = Field(..., ge=1, le=MAX_BLOCKS)


def _both_stacks(v: Any) -> Any:
    return {"encoder": v, "decoder": v} if isinstance(v, int) and not isinstance(v, bool) else v


Blocks = Annotated[StackBlocks, BeforeValidator(_both_stacks, json_schema_input_type=Union[int, StackBlocks])]


class RNN(_Strict):
    cell: Literal["gru", "lstm", "rnn"] = "gru"
    hidden: SInt = Field(..., ge=1, le=MAX_WIDTH)
    embed: SInt | None = Field(None, ge=1, le=MAX_WIDTH, description="embedding size; default hidden")
    layers: SInt = Field(1, ge=1, le=64)
    bidirectional: SBool = Field(False, description="bidirectional encoder")
    attention: Literal["none", "bahdanau", "luong_dot", "luong_general"] = "bahdanau"
    attention_dim: SInt | None = Field(None, ge=1, le=MAX_WIDTH, description="Bahdanau score width; default hidden")


# ---------------------------------------------------------------------------------------------- families


class _Base(_Strict):
    extends: str | None = Field(
        None, exclude=True, description="preset name or path of a spec to inherit; resolved on load"
    )
    name: str = Field(..., min_length=1, max_length=200)
    description: str | None = None
    source: str | None = Field(None, description="where the numbers come from")
    dtype: Dtype = "fp32"
    init: Init = Field(default_factory=Init)
    dropout: DropoutField = Field(default_factory=Dropout)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Any:
        if _check is None:  # specc.spec's __init__ imports check.py, which installs it
            raise RuntimeError("the cross-field rules are not installed: import specc.spec.check")
        _check(self)
        return self


class _Transformer(_Base):
    d_model: SInt = Field(..., ge=1, le=MAX_WIDTH, description="model width D")
    attention: Attention
    norm: Norm = Field(default_factory=Norm)
    mlp: MLP = Field(default_factory=ClassicMLP)
    position: PositionField = Field(default_factory=Position)
    bias: Bias = Field(default_factory=BiasFlags)
    embedding_scale: float | Literal["sqrt_d_model"] | None = Field(
        None,
        description="multiply token embeddings by this, rounded to the model's dtype (original Transformer, "
        "Gemma: sqrt_d_model)",
    )
    residual_scale: float = Field(
        1.0,
        gt=0,
        le=1e4,
        description="each sublayer's output joins the residual stream multiplied by this: x + scale · f(x) (Granite's "
        "residual_multiplier)",
    )
    parallel: Literal["none", "shared_norm", "separate_norms"] = Field(
        "none",
        description="none: sequential sublayers; shared_norm (GPT-J, Phi-2, Falcon-7B): h = norm1(x), "
        "x + attn(h) + mlp(h); separate_norms (GPT-NeoX, Falcon-40B): x + attn(norm1(x)) + mlp(norm2(x))",
    )
    output: Output = Field(default_factory=Output)
    layer_kinds: dict[KindName, LayerKind] | None = Field(
        None, description="named variants of the block (attention / position / mlp overrides), used by layer_pattern"
    )
    layer_pattern: list[KindName] | None = Field(
        None,
        min_length=1,
        max_length=MAX_BLOCKS,
        description="kind of each block, repeated cyclically over the blocks (a list of length blocks: per layer)",
    )


class _TextModel(_Transformer):
    vocab_size: SInt = Field(..., ge=1, le=MAX_VOCAB)
    context: SInt = Field(..., ge=1, le=MAX_CONTEXT, description="maximum sequence length N")
    tie_embeddings: SBool = True


class DecoderSpec(_TextModel):
    """Decoder-only language model (GPT-2/3, LLaMA, Mixtral)."""

    kind: Literal["decoder"]
    blocks: SInt = Field(..., ge=1, le=MAX_BLOCKS)


class EncoderSpec(_TextModel):
    """Encoder-only model (BERT): bidirectional, token types, MLM or pooled head."""

    kind: Literal["encoder"]
    blocks: SInt = Field(..., ge=1, le=MAX_BLOCKS)
    type_vocab_size: SInt = Field(0, ge=0, le=1 << 16, description="token-type embeddings (0: none)")
    head: Literal["mlm", "pooled", "eos", "last", "none"] = Field(
        "mlm",
        description="mlm: logits; pooled: a dense+tanh pooler_output of the first token (BERT); eos: "
        "last_hidden_state at the EOS token as pooler_output (CLIP text); last: last_hidden_state at the last "
        "position as pooler_output (SigLIP text); none: last_hidden_state only",
    )
    projection: ProjectionField = Field(
        None,
        description="a linear map of pooler_output, returned as text_embeds in its place (CLIPTextModelWithProjection"
        ", SigLIP text's head)",
    )
    eos_token: SInt | None = Field(
        None,
        ge=0,
        le=MAX_VOCAB,
        description="head eos: the pooled token is the first holding this id; null: the one with the largest id "
        "(CLIP configs from before the EOS id was fixed)",
    )
    head_activation: Activation = Field("gelu", description="activation of the MLM transform")


class EncoderDecoderSpec(_TextModel):
    """Encoder-decoder (original Transformer): cross-attention from decoder to encoder."""

    kind: Literal["encoder_decoder"]
    blocks: Blocks
    target_vocab_size: SInt | None = Field(None, ge=1, le=MAX_VOCAB, description="default vocab_size")
    shared_embeddings: SBool = Field(True, description="one embedding table for source and target")
    head: Literal["lm", "none"] = Field(
        "lm",
        description="lm: logits over the target vocabulary (generation); none: the decoder's last_hidden_state "
        "(T5Model)",
    )
    audio: Audio | None = Field(
        None,
        description="the encoder reads input_features through Whisper's audio front-end instead of token ids "
        "(vocab_size and position are then the decoder's; no source padding mask)",
    )
    decoder_start_token: SInt | None = Field(
        None,
        ge=0,
        le=MAX_VOCAB,
        description="the token generation starts the decoder with (decoder_start_token_id); default 1",
    )


class ViTSpec(_Transformer):
    """Vision Transformer: patch embedding, 2-D positions, mean-pool or class token."""

    kind: Literal["vit"]
    blocks: SInt = Field(..., ge=1, le=MAX_BLOCKS)
    image: Image
    pooling: Literal["mean", "cls", "none"] = Field(
        "cls", description="mean: the tokens' mean; cls: a class token, prepended; none: patch tokens only (SigLIP)"
    )
    head: Literal["classifier", "pooled", "pooled_norm", "attention_pool", "none"] = Field(
        "classifier",
        description="classifier: logits [B, classes]; pooled: last_hidden_state and a dense+tanh pooler_output "
        "(HF ViTModel); pooled_norm: last_hidden_state and the pooled token through its own norm as "
        "pooler_output (CLIP vision's post_layernorm); attention_pool: last_hidden_state and, as pooler_output, "
        "a learned probe token's cross-attention over the tokens followed by a norm and a residual MLP of the "
        "model's own shape (SigLIP's attention-pooling head); none: last_hidden_state only",
    )
    classes: SInt | None = Field(None, ge=1, le=MAX_VOCAB, description="classifier head: number of classes")
    projection: ProjectionField = Field(
        None,
        description="a linear map of pooler_output, returned as image_embeds in its place "
        "(CLIPVisionModelWithProjection)",
    )


class RNNSeq2SeqSpec(_Base):
    """RNN encoder-decoder, fixed context or Bahdanau / Luong attention."""

    kind: Literal["rnn_seq2seq"]
    vocab_size: SInt = Field(..., ge=1, le=MAX_VOCAB)
    target_vocab_size: SInt | None = Field(None, ge=1, le=MAX_VOCAB)
    context: SInt = Field(512, ge=1, le=MAX_CONTEXT, description="longest sequence used for analysis")
    rnn: RNN


_MODELS = "the model's (a rule refuses it in a tower); never written back"


class VisionTower(ViTSpec):
    """A dual encoder's image tower: a vit spec without name and kind (dtype and init are the model's)."""

    kind: Literal["vit"] = "vit"
    name: str = Field("vision", min_length=1, max_length=200)
    dtype: Dtype = Field("fp32", exclude=True, description=_MODELS)
    init: Init = Field(default_factory=Init, exclude=True, description=_MODELS)


class TextTower(EncoderSpec):
    """A dual encoder's text tower: an encoder spec without name and kind (dtype and init are the model's)."""

    kind: Literal["encoder"] = "encoder"
    name: str = Field("text", min_length=1, max_length=200)
    dtype: Dtype = Field("fp32", exclude=True, description=_MODELS)
    init: Init = Field(default_factory=Init, exclude=True, description=_MODELS)


class DualEncoderSpec(_Base):
    """Two towers embedding images and texts into one space, scored against each other (CLIP, SigLIP): each
    tower's pooled output (projected when it has a projection) is L2-normalised into image_embeds / text_embeds,
    and logits_per_image [B_image, B_text] = exp(logit_scale) · image_embeds · text_embedsᵀ (+ logit_bias)."""

    kind: Literal["dual_encoder"]
    vision: VisionTower = Field(..., description="the image tower, in the vit language (head: pooled_norm, ...)")
    text: TextTower = Field(..., description="the text tower, in the encoder language (head: eos, last, ...)")
    contrastive: Contrastive = Field(default_factory=Contrastive)


Spec = Annotated[
    DecoderSpec | EncoderSpec | EncoderDecoderSpec | ViTSpec | RNNSeq2SeqSpec | DualEncoderSpec,
    Field(discriminator="kind"),
]
SpecModel = Union[DecoderSpec, EncoderSpec, EncoderDecoderSpec, ViTSpec, RNNSeq2SeqSpec, DualEncoderSpec]
SPEC_ADAPTER: TypeAdapter[SpecModel] = TypeAdapter(Spec)
FAMILIES: dict[str, type[BaseModel]] = {
    "decoder": DecoderSpec,
    "encoder": EncoderSpec,
    "encoder_decoder": EncoderDecoderSpec,
    "vit": ViTSpec,
    "rnn_seq2seq": RNNSeq2SeqSpec,
    "dual_encoder": DualEncoderSpec,
}


def json_schema() -> dict[str, Any]:
    schema = SPEC_ADAPTER.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "specc architecture spec"
    return schema
