"""Cross-field rules of the top-level fields (attention, mlp, position, size) and of each model kind. Each rule has
its own message, the path of the key to blame and a hint; ``check.py`` runs them with the block and layer-kind
rules, and ``rules_kinds`` runs the field rules again on each layer kind's effective spec.
"""

from __future__ import annotations

from typing import Any

from . import resolve
from .schema import (
    MAX_WIDTH,
    DecoderSpec,
    EncoderDecoderSpec,
    EncoderSpec,
    MoEMLP,
    RNNSeq2SeqSpec,
    ViTSpec,
    _Base,
    _TextModel,
    _Transformer,
)
from .violation import Violation

# A spec whose weights alone pass this many parameters is a typo, not a model (GPT-3 is 1.75e11).
MAX_PARAMS = 10**14


def attention_rules(spec: _Transformer) -> Any:
    a = spec.attention
    mask = resolve.mask(spec)
    if a.latent is not None:
        yield from _latent_rules(spec)
    if a.head_dim is None and a.latent is None and spec.d_model % a.heads:
        lo = max(d for d in range(1, a.heads + 1) if spec.d_model % d == 0)
        yield Violation(
            ("attention", "heads"),
            f"d_model {spec.d_model} is not divisible by heads {a.heads}",
            f"use heads: {lo} (a divisor of {spec.d_model}), or set attention.head_dim explicitly",
            also=(("d_model",),),
        )
    kv = resolve.kv_heads(spec)
    if a.heads % kv:
        yield Violation(
            ("attention", "kv_heads"),
            f"heads {a.heads} is not divisible by kv_heads {kv}",
            "each K/V head serves a whole group of query heads: pick kv_heads dividing heads (1 = MQA)",
            also=(("attention", "heads"),),
        )
    if a.mask == "local" and not isinstance(spec, EncoderSpec):
        yield Violation(
            ("attention", "mask"),
            f"mask local (two-sided windows) is for encoders, not kind {kind_name(spec)}",
            "use mask: sliding_window on a decoder",
        )
    if a.mask in ("padding", "none") and isinstance(spec, DecoderSpec):
        yield Violation(
            ("attention", "mask"),
            f"attention.mask {a.mask} is refused on a decoder: it would make the decoder bidirectional",
            "decoders are causal, and padding is applied whenever attention_mask is passed at run time: "
            "use mask: causal",
        )
    yield from _llama4_rules(spec)
    # Each structural mask and the length it needs: (field, mask, hint when missing, hint when too long).
    for field, kind, example, too_long in (
        ("window", "sliding_window", "4096", "a window that covers the whole context is a plain causal mask"),
        ("prefix", "prefix", "<length>", None),
        ("chunk", "chunked", "8192", "a chunk that covers the whole context is a plain causal mask"),
    ):
        value = getattr(a, field)
        if field == "window" and mask == "local":
            kind = "local"  # the window's other use: two-sided
        if mask == kind and value is None:
            yield Violation(("attention", "mask"), f"mask {kind} needs attention.{field}", f"add {field}: {example}")
        if value is not None and mask != kind:
            yield Violation(
                ("attention", field),
                f"attention.{field} is only used with mask {kind} (mask is {mask})",
                f"set mask: {kind} or remove {field}",
            )
        if isinstance(spec, _TextModel) and value is not None and value > spec.context:
            hint = f"{too_long}: use mask: causal" if too_long else None
            yield Violation(("attention", field), f"{field} {value} is longer than context {spec.context}", hint)


def _llama4_rules(spec: _Transformer) -> Any:
    """Temperature tuning scales q in layers without RoPE; the weightless QK-norm commutes with plain rotations."""
    a, p = spec.attention, spec.position
    if a.temperature is not None and not isinstance(spec, DecoderSpec):
        yield Violation(
            ("attention", "temperature"),
            f"attention temperature tuning is supported in decoders, not in kind {kind_name(spec)}",
            "remove temperature",
        )
    elif a.temperature is not None and p.type == "rotary":
        yield Violation(
            ("attention", "temperature"),
            "attention.temperature is for layers without rotary positions (Llama 4's NoPE layers)",
            "give these layers a layer kind with position: none, or remove temperature",
            also=(("position", "type"),),
        )
    sc = p.scaling if p.type == "rotary" else None
    if a.qk_norm == "l2" and sc is not None and sc.type in ("yarn", "longrope"):
        yield Violation(
            ("attention", "qk_norm"),
            f"qk_norm l2 with {sc.type} RoPE is not supported: its cos/sin scale would not survive the norm",
            "use plain, linear, dynamic or llama3 RoPE scaling, or another qk_norm",
            also=(("position", "scaling", "type"),),
        )


def _latent_rules(spec: _Transformer) -> Any:
    """MLA fixes the head sizes and gives every head its own K/V: no field may say otherwise."""
    a, lat = spec.attention, spec.attention.latent
    assert lat is not None
    for key in ("q", "k", "v"):
        if getattr(spec.bias, key) is not None:
            yield Violation(
                ("bias", key),
                f"bias.{key} is a per-projection flag; latent attention has no separate {key} projection",
                "use bias.qkv (the q_a and kv_a projections)",
            )
    qk = lat.nope_head_dim + lat.rope_head_dim
    if not isinstance(spec, DecoderSpec):
        yield Violation(("attention", "latent"), "multi-head latent attention is for decoders", "use kind: decoder")
    if a.head_dim is not None and a.head_dim != qk:
        yield Violation(
            ("attention", "head_dim"),
            f"head_dim {a.head_dim} ≠ latent nope_head_dim + rope_head_dim = {qk}",
            "remove head_dim: MLA's q/k head is its nope and rope parts",
        )
    if a.kv_heads is not None and a.kv_heads != a.heads:
        yield Violation(
            ("attention", "kv_heads"),
            f"kv_heads {a.kv_heads} ≠ heads {a.heads}: latent attention expands K/V for every head",
            "remove kv_heads",
        )
    for key, value, off in (
        ("qk_norm", a.qk_norm, "none"),
        ("softcap", a.softcap, None),
        ("temperature", a.temperature, None),
    ):
        if value != off:
            yield Violation(("attention", key), f"attention.{key} is not supported with latent attention")


def mlp_rules(spec: _Transformer) -> Any:
    m = spec.mlp
    if isinstance(m, MoEMLP) and m.clamp is not None:
        if m.expert != "swiglu":
            yield Violation(("mlp", "clamp"), f"mlp.clamp is a SwiGLU variant; the experts are {m.expert}",
                            "use expert: swiglu or remove clamp")  # fmt: skip
        if m.activation not in (None, "silu"):
            yield Violation(
                ("mlp", "activation"),
                f"mlp.clamp replaces the activation by gate · σ(alpha · gate), so activation {m.activation} would "
                "be ignored",
                "remove activation",
                also=(("mlp", "clamp"),),
            )
    if isinstance(m, MoEMLP) and m.active > m.experts:
        yield Violation(
            ("mlp", "active"),
            f"active experts {m.active} > experts {m.experts}",
            f"each token is routed to at most all experts: use active ≤ {m.experts}",
            also=(("mlp", "experts"),),
        )
    if isinstance(m, MoEMLP):
        yield from _routing_rules(m)


def _routing_rules(m: MoEMLP) -> Any:
    """Group-limited routing: whole groups, enough experts in the groups a token may use."""
    r = m.router
    if m.experts % r.groups:
        yield Violation(
            ("mlp", "router", "groups"),
            f"experts {m.experts} are not divisible into {r.groups} groups",
            "use a number of groups that divides mlp.experts",
            also=(("mlp", "experts"),),
        )
        return
    top = r.top_groups if r.top_groups is not None else r.groups
    if top > r.groups:
        yield Violation(
            ("mlp", "router", "top_groups"),
            f"top_groups {top} > groups {r.groups}",
            f"use top_groups ≤ {r.groups}",
            also=(("mlp", "router", "groups"),),
        )
        return
    if r.groups > 1 and top * (m.experts // r.groups) < m.active <= m.experts:
        yield Violation(
            ("mlp", "router", "top_groups"),
            f"{top} groups of {m.experts // r.groups} experts hold fewer than active {m.active}",
            "raise top_groups or lower mlp.active",
            also=(("mlp", "active"),),
        )
    if r.group_score == "top2_sum" and r.groups > 1 and m.experts // r.groups < 2:
        yield Violation(
            ("mlp", "router", "group_score"),
            f"group_score top2_sum needs 2 experts per group, {m.experts // r.groups} given",
            "use group_score: max or fewer groups",
        )


def position_rules(spec: _Transformer) -> Any:
    p = spec.position
    hd = resolve.head_dim(spec)
    if p.type == "rotary":
        rotated = resolve.rotary_dims(spec)
        if rotated < 2 or rotated != int(rotated) or int(rotated) % 2:
            yield Violation(
                ("position", "fraction") if p.fraction != 1.0 else ("position", "type"),
                f"rotary needs an even number of rotated dims, but head_dim {hd} × fraction {p.fraction} = "
                f"{hd * p.fraction:g}",
                "choose head_dim (d_model / heads) and fraction so that their product is an even integer",
            )
    yield from rope_rules(spec)
    yield from alibi_rules(spec)
    yield from relative_rules(spec)
    is_vit = isinstance(spec, ViTSpec)
    if p.type in ("learned_2d", "sinusoidal_2d") and not is_vit:
        yield Violation(
            ("position", "type"),
            f"position {p.type} is for ViT patch grids, not for kind {kind_name(spec)}",
            "use learned, sinusoidal, rotary or none",
        )
    if p.type == "sinusoidal_2d" and is_vit and spec.d_model % 4:
        yield Violation(("position", "type"), f"sinusoidal_2d needs d_model divisible by 4, got {spec.d_model}")
    if p.type == "sinusoidal" and spec.d_model % 2:
        yield Violation(("position", "type"), f"sinusoidal positions need an even d_model, got {spec.d_model}")
    yield from numbering_rules(spec)


def numbering_rules(spec: _Transformer) -> Any:
    """``position.offset`` and ``position.skip_padding``: where a learned table starts, how tokens are counted."""
    p = spec.position
    if p.offset and (p.type != "learned" or isinstance(spec, ViTSpec)):
        yield Violation(
            ("position", "offset"),
            f"position.offset numbers the rows of a text model's learned table (type is {p.type})",
            "set type: learned or remove offset",
        )
    if p.skip_padding is None:
        return
    if p.type not in ("learned", "sinusoidal", "rotary"):
        yield Violation(("position", "skip_padding"), f"{p.type} positions have no token numbering to change")
    elif isinstance(spec, DecoderSpec) and not p.skip_padding:
        yield Violation(
            ("position", "skip_padding"),
            "a decoder always numbers positions by real tokens (as generate does with left padding)",
            "remove skip_padding",
        )
    elif p.skip_padding and not isinstance(spec, (DecoderSpec, EncoderSpec)):
        yield Violation(
            ("position", "skip_padding"),
            f"skip_padding is for encoders and decoders; kind {kind_name(spec)} numbers positions by index",
            "remove skip_padding",
        )


def alibi_rules(spec: _Transformer) -> Any:
    p = spec.position
    if p.type != "alibi":
        for key, value, default in (
            ("max_bias", p.max_bias, 8.0),
            ("scaled", p.scaled, False),
            ("bias_dtype", p.bias_dtype, "fp32"),
        ):
            if value != default:
                yield Violation(
                    ("position", key),
                    f"position.{key} is only used by alibi positions (type is {p.type})",
                    f"set type: alibi or remove {key}",
                )
        return
    if not isinstance(spec, DecoderSpec):
        yield Violation(
            ("position", "type"),
            f"alibi positions are supported in decoders, not in kind {kind_name(spec)}",
            "use learned, sinusoidal, rotary or none",
        )
    if spec.attention.sinks:
        yield Violation(
            ("attention", "sinks"),
            "attention sinks are not supported with alibi positions",
            "remove sinks, or use rotary positions",
            also=(("position", "type"),),
        )
    if spec.attention.softcap is not None:
        yield Violation(
            ("attention", "softcap"),
            "attention.softcap is not supported with alibi positions",
            "remove softcap, or use rotary positions",
            also=(("position", "type"),),
        )


def relative_rules(spec: _Transformer) -> Any:
    p = spec.position
    if p.type != "relative":
        for key, value, default in (("buckets", p.buckets, 32), ("max_distance", p.max_distance, 128),
                                    ("per_layer", p.per_layer, False)):  # fmt: skip
            if value != default:
                yield Violation(
                    ("position", key),
                    f"position.{key} is only used by relative positions (type is {p.type})",
                    f"set type: relative or remove {key}",
                )
        return
    if not isinstance(spec, EncoderDecoderSpec | EncoderSpec):
        yield Violation(
            ("position", "type"),
            f"relative positions are supported in encoder_decoder and encoder models, not in kind {kind_name(spec)}",
            "use learned, sinusoidal, rotary or none",
        )
    if p.max_distance <= p.buckets // 2:  # the logarithmic buckets need distances past the exact ones
        yield Violation(
            ("position", "max_distance"),
            f"max_distance {p.max_distance} must exceed half the buckets ({p.buckets // 2})",
            f"use max_distance > {p.buckets // 2}",
            also=(("position", "buckets"),),
        )
    for key in ("softcap", "latent"):
        if getattr(spec.attention, key) is not None:
            yield Violation(
                ("attention", key),
                f"attention.{key} is not supported with relative positions",
                f"remove {key}",
                also=(("position", "type"),),
            )
    if spec.attention.sinks:
        yield Violation(("attention", "sinks"), "attention sinks are not supported with relative positions",
                        "remove sinks", also=(("position", "type"),))  # fmt: skip


# Scaling fields each RoPE scaling type reads (as transformers' ROPE_INIT_FUNCTIONS do): required, optional.
SCALING_FIELDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ("original_max_positions",)),
    "llama3": (("factor", "original_max_positions", "low_freq_factor", "high_freq_factor"), ()),
    "yarn": (
        ("factor", "original_max_positions"),
        ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
    ),
    "longrope": (
        ("short_factor", "long_factor", "original_max_positions"),
        ("factor", "attention_factor", "rebuild_cache"),
    ),
}


def rope_rules(spec: _Transformer) -> Any:
    p = spec.position
    if p.type != "rotary":
        for key, value, default in (("rotation", p.rotation, "half"), ("scaling", p.scaling, None)):
            if value != default:
                yield Violation(
                    ("position", key),
                    f"position.{key} is only used by rotary positions (type is {p.type})",
                    f"set type: rotary or remove {key}",
                )
        return
    sc = p.scaling
    if sc is None:
        return
    required, optional = SCALING_FIELDS[sc.type]
    for key in required:
        if getattr(sc, key) is None:
            yield Violation(("position", "scaling", "type"), f"RoPE scaling {sc.type} needs scaling.{key}")
    for key in sorted(sc.model_fields_set - {"type", *required, *optional}):
        if getattr(sc, key) is not None:
            yield Violation(
                ("position", "scaling", key),
                f"scaling.{key} is not used by RoPE scaling {sc.type}",
                f"{sc.type} reads {', '.join((*required, *optional))}",
            )
    half = int(resolve.rotary_dims(spec)) // 2
    for key in ("short_factor", "long_factor"):
        values = getattr(sc, key)
        if sc.type == "longrope" and values is not None and len(values) != half:
            yield Violation(
                ("position", "scaling", key),
                f"scaling.{key} has {len(values)} factors, but RoPE rotates {half} frequency pairs "
                f"(head_dim × fraction / 2)",
            )
        if values is not None and any(not v > 0 for v in values):
            yield Violation(("position", "scaling", key), f"scaling.{key} must be positive numbers")
    lo, hi = sc.low_freq_factor, sc.high_freq_factor
    if sc.type == "llama3" and lo is not None and hi is not None and not hi > lo:
        yield Violation(
            ("position", "scaling", "high_freq_factor"),
            f"high_freq_factor {hi} must be greater than low_freq_factor {lo}",
            "Llama 3.1 uses low_freq_factor: 1.0, high_freq_factor: 4.0",
        )
    if sc.type == "dynamic" and half < 2:
        yield Violation(
            ("position", "scaling", "type"), "dynamic RoPE scaling needs at least 4 rotated dims (base^(d/(d-2)))"
        )


def size_rules(spec: _Transformer) -> Any:
    hd = resolve.head_dim(spec)
    if spec.attention.heads * hd > MAX_WIDTH:
        yield Violation(("attention", "head_dim"), f"heads × head_dim = {spec.attention.heads * hd} is absurdly wide")
    # A cheap upper bound of the weights; refuses specs that no machine could hold.
    layers = spec.blocks.encoder + spec.blocks.decoder if isinstance(spec, EncoderDecoderSpec) else spec.blocks
    width = max(resolve.mlp_hidden(spec), spec.d_model)
    experts = spec.mlp.experts if isinstance(spec.mlp, MoEMLP) else 1
    estimate = layers * (4 * spec.d_model * spec.attention.heads * hd + 3 * experts * spec.d_model * width)
    if estimate > MAX_PARAMS:
        yield Violation(
            ("blocks",),
            f"this spec has about {estimate:.2e} parameters, more than the {MAX_PARAMS:.0e} specc accepts",
            "check d_model, blocks, mlp.hidden and mlp.experts for a typo",
        )


def vit_rules(spec: ViTSpec) -> Any:
    im = spec.image
    if im.patch > im.size:
        yield Violation(("image", "patch"), f"patch {im.patch} is larger than image {im.size}")
    elif im.size % im.patch and not im.drop_remainder:
        near = [p for p in range(1, im.size + 1) if im.size % p == 0]
        best = min(near, key=lambda p: abs(p - im.patch))
        yield Violation(
            ("image", "patch"),
            f"image {im.size} is not divisible by patch {im.patch}",
            f"use patch: {best} or an image size that is a multiple of {im.patch}",
            also=(("image", "size"),),
        )
    if spec.pooling == "none" and spec.head in ("classifier", "pooled", "pooled_norm"):
        yield Violation(
            ("pooling",),
            f"head: {spec.head} pools a token, but pooling is none",
            "use pooling: cls or mean, or head: attention_pool | none",
            also=(("head",),),
        )
    if spec.head == "classifier" and spec.classes is None:
        yield Violation(("classes",), "a ViT classifier needs classes", "add classes: 1000, or set head: pooled | none")
    if spec.head != "classifier" and spec.classes is not None:
        yield Violation(
            ("classes",),
            f"classes is only used by head: classifier (head is {spec.head})",
            "remove classes or set head: classifier",
        )
    if resolve.mask(spec) in ("causal", "sliding_window", "prefix", "chunked"):
        yield Violation(
            ("attention", "mask"),
            f"a {resolve.mask(spec)} mask on a ViT classifier is refused: every patch may attend to every patch",
            "use mask: none",
        )


def encoder_rules(spec: EncoderSpec) -> Any:
    n = spec.norm
    if n.skip_first and (n.placement != "pre" or spec.parallel != "none"):
        yield Violation(
            ("norm", "skip_first"),
            f"norm.skip_first drops the first pre-norm; this model's norms are {n.placement}"
            + (f", {spec.parallel} sublayers" if spec.parallel != "none" else ""),
            "use it with norm.placement: pre and sequential sublayers",
        )
    if spec.eos_token is not None and spec.head != "eos":
        yield Violation(
            ("eos_token",),
            f"eos_token is only used by head: eos (head is {spec.head})",
            "remove eos_token or set head: eos",
        )
    elif spec.eos_token is not None and spec.eos_token >= spec.vocab_size:
        yield Violation(
            ("eos_token",),
            f"eos_token {spec.eos_token} is not below vocab_size {spec.vocab_size}",
            also=(("vocab_size",),),
        )


def encoder_decoder_rules(spec: EncoderDecoderSpec) -> Any:
    if spec.head == "none" and "output" in spec.model_fields_set:
        yield Violation(("output",), "output transforms the head's logits, but head is none", "remove output")
    if spec.audio is not None:
        yield from _audio_rules(spec)
    start, target = spec.decoder_start_token, spec.target_vocab_size or spec.vocab_size
    if start is not None and start >= target:
        yield Violation(
            ("decoder_start_token",),
            f"decoder_start_token {start} is not below the decoder's vocabulary {target}",
            also=(("vocab_size",),),
        )
    if spec.shared_embeddings and spec.target_vocab_size not in (None, spec.vocab_size):
        yield Violation(
            ("target_vocab_size",),
            f"shared_embeddings needs one vocabulary, but target_vocab_size {spec.target_vocab_size} != "
            f"vocab_size {spec.vocab_size}",
            "set shared_embeddings: false or drop target_vocab_size",
        )
    if resolve.mask(spec) not in ("none", "padding"):
        yield Violation(
            ("attention", "mask"),
            f"attention.mask {resolve.mask(spec)} applies to the encoder; the decoder is always causal",
            "use mask: none (or padding) for an encoder-decoder",
        )


def _audio_rules(spec: EncoderDecoderSpec) -> Any:
    """With audio input the encoder has no tokens: nothing may describe a source vocabulary or token padding."""
    given = spec.model_fields_set
    for key, why in (
        ("target_vocab_size", "the decoder's vocabulary is vocab_size"),
        ("shared_embeddings", "there is no source embedding to share"),
    ):
        if key in given:
            yield Violation((key,), f"{key} is not used with audio input: {why}", f"remove {key}")
    if spec.attention.mask == "padding":
        yield Violation(
            ("attention", "mask"),
            "audio input has no padding mask (Whisper's encoder attends to every frame)",
            "use mask: none",
            also=(("audio",),),
        )
    if spec.position.type == "relative":
        yield Violation(
            ("position", "type"),
            "relative positions are not supported with audio input",
            "use learned or sinusoidal positions for the decoder",
            also=(("audio",),),
        )


def rnn_rules(spec: RNNSeq2SeqSpec) -> Any:
    r = spec.rnn
    if r.attention == "luong_dot" and r.bidirectional:
        yield Violation(
            ("rnn", "attention"),
            "luong_dot scores s·h need equal widths, but a bidirectional encoder doubles h",
            "use luong_general or bahdanau, or bidirectional: false",
        )


def kind_name(spec: _Base) -> str:
    return getattr(spec, "kind", type(spec).__name__)
