"""A spec → a Hugging Face ``config.json`` (the inverse of each family's ``spec(cfg)``), for ``export-hf``.

Each writer states the spec in one HF class's config fields, and refuses (``Inexpressible``, naming the spec key)
what that class has no field for. What a writer misses, the caller's round trip catches: the written config is
imported again and must lower to the same graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..spec import kinds, resolve
from ..spec.schema import BiasFlags, EncoderDecoderSpec
from .rope_config import _FIELDS as ROPE_FIELDS

# specc activation → the HF name every family's ACT2FN knows (import maps each back)
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_tanh": "gelu_pytorch_tanh",
    "relu": "relu",
    "silu": "silu",
    "quick_gelu": "quick_gelu",
}


class Inexpressible(Exception):
    """The spec key ``path`` holds something the HF class has no config field for."""

    def __init__(self, path: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def need(ok: bool, path: tuple[str | int, ...], message: str) -> None:
    if not ok:
        raise Inexpressible(path, message)


def _bias(s: Any, key: str) -> bool:
    b = s.bias
    return bool(getattr(b, key)) if isinstance(b, BiasFlags) else bool(b)


def _act(name: str, path: tuple[str | int, ...]) -> str:
    need(name in ACTIVATIONS, path, f"activation {name!r} has no Hugging Face name")
    return ACTIVATIONS[name]


def _layers(s: Any) -> list[Any]:
    """The effective spec of every block (its layer kind merged onto the top level)."""
    names = kinds.pattern(s)
    return [s] * s.blocks if names is None else [kinds.effective(s, n) for n in names]


def _window(layer: Any) -> int | None:
    a = layer.attention
    return a.window if a.mask == "sliding_window" else None


def _plain_attention(s: Any, *allowed: str) -> None:
    """Refuse attention features outside ``allowed`` (of mask, scale, softcap, qk_norm, logit_scale)."""
    for layer in _layers(s):
        a = layer.attention
        need(a.prefix is None and a.chunk is None, ("attention",), "prefix / chunked attention")
        need(a.latent is None, ("attention", "latent"), "multi-head latent attention (DeepSeek's)")
        need(a.temperature is None, ("attention", "temperature"), "attention temperature tuning (Llama 4's)")
        if "mask" not in allowed:
            need(a.mask in (None, "causal", "none", "padding"), ("attention", "mask"), f"a {a.mask} mask")
        need("scale" in allowed or a.scale is None, ("attention", "scale"), "a custom attention scale")
        need("softcap" in allowed or a.softcap is None, ("attention", "softcap"), "attention logit softcapping")
        need("qk_norm" in allowed or a.qk_norm == "none", ("attention", "qk_norm"), "QK-norm")
    need(s.output.softcap is None or "softcap" in allowed, ("output", "softcap"), "final logit softcapping")
    need(s.output.scale == 1.0 or "logit_scale" in allowed, ("output", "scale"), "a logit scale")


def rope_parameters(
    pos: Any, path: tuple[str | int, ...] = ("position",), partial: bool = False, interleaved: bool = False
) -> dict[str, Any]:
    """specc's rotary ``position:`` as transformers 5's ``rope_parameters`` (``interleaved``: the class rotates
    adjacent pairs, as Cohere's does)."""
    need(pos.type == "rotary", (*path, "type"), f"{pos.type} positions (the class uses RoPE)")
    need(pos.rotation == "half" or interleaved, (*path, "rotation"), "interleaved RoPE pairs")
    need(partial or pos.fraction == 1.0, (*path, "fraction"), "partial RoPE (the class rotates whole heads)")
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": pos.theta}
    if pos.fraction != 1.0:
        out["partial_rotary_factor"] = pos.fraction
    sc = pos.scaling
    if sc is not None:
        out["rope_type"] = sc.type
        back = {ours: hf for hf, ours in ROPE_FIELDS[sc.type].items()}
        for key, value in sc.model_dump(exclude_none=True).items():
            if key in ("type", "rebuild_cache") or (sc.type == "dynamic" and key == "original_max_positions"):
                continue
            need(key in back, (*path, "scaling", key), f"RoPE {sc.type} has no parameter {key}")
            out[back[key]] = value
    return out


def _sizes(s: Any) -> dict[str, Any]:
    a = s.attention
    out = {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "hidden_size": s.d_model,
        "num_hidden_layers": s.blocks,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads or a.heads,
        "head_dim": a.head_dim or s.d_model // a.heads,
    }
    return out


def _pre_rms(s: Any, placement: str = "pre", offset: bool = False) -> None:
    need(s.norm.type == "rmsnorm", ("norm", "type"), f"{s.norm.type} (the class has RMSNorm)")
    need(s.norm.placement == placement, ("norm", "placement"), f"{s.norm.placement} norms (the class: {placement})")
    need(bool(s.norm.unit_offset) == offset, ("norm", "unit_offset"), "RMSNorm weights with(out) the 1 + w offset")
    need(s.embedding_scale is None or offset, ("embedding_scale",), "scaled embeddings")
    need(s.parallel == "none", ("parallel",), "parallel attention and MLP")


def _swiglu(mlp: Any, path: tuple[str | int, ...] = ("mlp",)) -> dict[str, Any]:
    need(mlp.type == "swiglu", (*path, "type"), f"a {mlp.type} MLP (the class has a gated MLP)")
    return {"intermediate_size": mlp.hidden, "hidden_act": _act(mlp.activation, (*path, "activation"))}


def _moe_activation(mlp: Any) -> str:
    return mlp.activation or ("silu" if mlp.expert == "swiglu" else "gelu")  # the schema's defaults


def _layer_types(s: Any) -> list[str]:
    return ["sliding_attention" if _window(layer) else "full_attention" for layer in _layers(s)]


def _one_window(s: Any) -> int | None:
    windows = {_window(layer) for layer in _layers(s)} - {None}
    need(len(windows) <= 1, ("layer_kinds",), "sliding windows of different sizes")
    return next(iter(windows), None)


# ---------------------------------------------------------------------------------------------- families


def gpt2(s: Any) -> dict[str, Any]:
    need(s.norm.type == "layernorm" and s.norm.placement == "pre", ("norm",), "norms other than pre-LayerNorm")
    need(s.position.type == "learned", ("position", "type"), f"{s.position.type} positions (GPT-2 learns them)")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    a = s.attention
    need(a.kv_heads in (None, a.heads), ("attention", "kv_heads"), "grouped-query attention")
    need(a.head_dim in (None, s.d_model // a.heads), ("attention", "head_dim"), "a head_dim other than D / heads")
    need(a.scale in (None, 1.0), ("attention", "scale"), "attention scales other than 1/√d and 1")
    return {
        "vocab_size": s.vocab_size,
        "n_positions": s.context,
        "n_embd": s.d_model,
        "n_layer": s.blocks,
        "n_head": a.heads,
        "n_inner": s.mlp.hidden,
        "activation_function": _act(s.mlp.activation, ("mlp", "activation")),
        "layer_norm_epsilon": s.norm.eps,
        "scale_attn_weights": a.scale is None,
        "tie_word_embeddings": s.tie_embeddings,
        **_no_outside_ids(s.vocab_size),
    }


def _no_outside_ids(vocab: int) -> dict[str, Any]:
    """GPT-2 and GPT-J configs default their bos / eos ids to 50256: none where the vocabulary is smaller."""
    return {"bos_token_id": None, "eos_token_id": None} if vocab <= 50256 else {}


def llama(s: Any, arch: str) -> dict[str, Any]:
    """Llama, Mistral (a sliding window on every layer) and Mixtral (MoE)."""
    _pre_rms(s)
    _plain_attention(s, "mask")
    window = _one_window(s)
    need(arch != "LlamaForCausalLM" or window is None, ("attention", "mask"), "sliding windows")
    need(window is None or set(_layer_types(s)) == {"sliding_attention"}, ("layer_kinds",), "per-layer windows")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings}
    cfg.update(attention_bias=_bias(s, "qkv"), rope_parameters=rope_parameters(s.position))
    if arch == "MixtralForCausalLM":
        m = s.mlp
        need(m.type == "moe" and m.expert == "swiglu", ("mlp", "type"), "a dense MLP (Mixtral's is MoE)")
        need(m.router.normalize and m.shared is None, ("mlp", "router"), "Mixtral's router (normalised, unshared)")
        cfg.update(intermediate_size=m.hidden, hidden_act=_act(_moe_activation(m), ("mlp", "activation")))
        cfg.update(num_local_experts=m.experts, num_experts_per_tok=m.active, router_jitter_noise=m.router.jitter)
        cfg["router_aux_loss_coef"] = m.router.aux_loss_coef
    else:
        cfg.update(_swiglu(s.mlp))
        if arch == "LlamaForCausalLM":
            cfg["mlp_bias"] = _bias(s, "mlp")
    if arch != "LlamaForCausalLM":
        cfg["sliding_window"] = window
    return cfg


def qwen(s: Any, arch: str) -> dict[str, Any]:
    _pre_rms(s)
    qwen3 = arch.startswith("Qwen3")
    _plain_attention(s, "mask", *(("qk_norm",) if qwen3 else ()))
    need(not qwen3 or s.attention.qk_norm == "head", ("attention", "qk_norm"), "Qwen3 without per-head QK-norm")
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings}
    cfg["rope_parameters"] = rope_parameters(s.position)
    if qwen3:
        need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
        cfg["attention_bias"] = _bias(s, "qkv")
    window = _one_window(s)
    types = _layer_types(s)
    cfg.update(use_sliding_window=window is not None, sliding_window=window)
    if arch != "Qwen3MoeForCausalLM":
        cfg.update(layer_types=types, max_window_layers=0)
    layers = _layers(s)
    if not arch.endswith("MoeForCausalLM"):
        cfg.update(_swiglu(s.mlp))
        return cfg
    moe = [i for i, layer in enumerate(layers) if layer.mlp.type == "moe"]
    need(bool(moe), ("mlp", "type"), "a dense model (the class is MoE)")
    m = layers[moe[0]].mlp
    dense = [layer.mlp for layer in layers if layer.mlp.type != "moe"]
    cfg.update(_swiglu(dense[0]) if dense else {"hidden_act": _act(_moe_activation(m), ("mlp", "activation"))})
    cfg.setdefault("intermediate_size", m.hidden)
    cfg.update(num_experts=m.experts, num_experts_per_tok=m.active, moe_intermediate_size=m.hidden)
    cfg.update(norm_topk_prob=m.router.normalize, router_aux_loss_coef=m.router.aux_loss_coef)
    cfg.update(decoder_sparse_step=1, mlp_only_layers=[i for i in range(len(layers)) if i not in moe])
    if arch == "Qwen2MoeForCausalLM":
        need(m.shared is not None, ("mlp", "shared"), "Qwen2-MoE without a shared expert")
        cfg.update(shared_expert_intermediate_size=m.shared.hidden, qkv_bias=_bias(s, "qkv"))
    else:
        need(m.shared is None, ("mlp", "shared"), "a shared expert")
    return cfg


def gemma(s: Any, arch: str) -> dict[str, Any]:
    first = arch == "GemmaForCausalLM"
    _pre_rms(s, "pre" if first else "sandwich", offset=True)
    need(s.embedding_scale == "sqrt_d_model", ("embedding_scale",), "unscaled embeddings (Gemma scales by √D)")
    a = s.attention
    _plain_attention(s, *(() if first else ("mask", "scale", "softcap")), *(("qk_norm",) if "3" in arch else ()))
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings}
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    cfg["attention_bias"] = _bias(s, "qkv")
    mlp = _swiglu(s.mlp)
    cfg["intermediate_size"] = mlp["intermediate_size"]
    cfg["hidden_act" if first else "hidden_activation"] = mlp["hidden_act"]
    if first:
        cfg["rope_parameters"] = rope_parameters(s.position)
        return cfg
    scalar = (a.scale or cfg["head_dim"] ** -0.5) ** -2
    need(abs(scalar - round(scalar)) < 1e-6, ("attention", "scale"), "a scale other than 1/√n for a whole n")
    cfg.update(query_pre_attn_scalar=round(scalar), attn_logit_softcapping=a.softcap)
    cfg["final_logit_softcapping"] = s.output.softcap
    cfg.update(sliding_window=_one_window(s) or s.context, layer_types=_layer_types(s))
    if arch == "Gemma2ForCausalLM":
        cfg["rope_parameters"] = rope_parameters(s.position)
        return cfg
    per: dict[str, Any] = {}
    for t, layer in zip(cfg["layer_types"], _layers(s), strict=True):
        rope = rope_parameters(layer.position)
        need(per.setdefault(t, rope) == rope, ("layer_kinds",), "different RoPE in layers of one attention type")
    cfg["rope_parameters"] = per
    return cfg


def olmo2(s: Any) -> dict[str, Any]:
    _pre_rms(s, "output")
    _plain_attention(s, "qk_norm")
    need(s.attention.qk_norm == "full", ("attention", "qk_norm"), "OLMo-2 without full-width QK-norm")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, **_swiglu(s.mlp)}
    cfg.update(attention_bias=_bias(s, "qkv"), rope_parameters=rope_parameters(s.position))
    return cfg


def phi3(s: Any) -> dict[str, Any]:
    _pre_rms(s)
    _plain_attention(s, "mask")
    window = _one_window(s)
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, **_swiglu(s.mlp)}
    cfg.update(sliding_window=window, rope_parameters=rope_parameters(s.position, partial=True))
    cfg["pad_token_id"] = None  # Phi3Config's default (32000) is outside small vocabularies
    original = cfg["rope_parameters"].get("original_max_position_embeddings")
    if original is not None:  # Phi-3 reads the top-level field (its default is 4096)
        cfg["original_max_position_embeddings"] = original
    return cfg


def _layernorm(s: Any, parallel: tuple[str, ...]) -> None:
    need(s.norm.type == "layernorm" and s.norm.placement == "pre", ("norm",), "norms other than pre-LayerNorm")
    need(s.parallel in parallel, ("parallel",), f"{s.parallel} residual layout")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.embedding_scale is None, ("embedding_scale",), "scaled embeddings")
    _plain_attention(s)


def phi(s: Any) -> dict[str, Any]:
    _layernorm(s, ("shared_norm",))
    cfg = {**_sizes(s), "layer_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings}
    cfg.update(intermediate_size=s.mlp.hidden, hidden_act=_act(s.mlp.activation, ("mlp", "activation")))
    cfg.update(rope_parameters=rope_parameters(s.position, partial=True))
    return cfg


def neox(s: Any) -> dict[str, Any]:
    _layernorm(s, ("separate_norms", "none"))
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    cfg = {**_sizes(s), "layer_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings}
    del cfg["num_key_value_heads"], cfg["head_dim"]
    cfg.update(intermediate_size=s.mlp.hidden, hidden_act=_act(s.mlp.activation, ("mlp", "activation")))
    cfg.update(attention_bias=_bias(s, "qkv"), use_parallel_residual=s.parallel == "separate_norms")
    cfg.update(rope_parameters=rope_parameters(s.position, partial=True))
    return cfg


def gptj(s: Any) -> dict[str, Any]:
    _layernorm(s, ("shared_norm",))
    p, hd = s.position, s.d_model // s.attention.heads
    need(p.type == "rotary" and p.rotation == "interleaved", ("position",), "RoPE other than interleaved pairs")
    need(p.theta == 10000.0 and p.scaling is None, ("position", "theta"), "a RoPE base other than 10000")
    return {
        "vocab_size": s.vocab_size,
        "n_positions": s.context,
        "n_embd": s.d_model,
        "n_layer": s.blocks,
        "n_head": s.attention.heads,
        "rotary_dim": round(p.fraction * hd),
        "n_inner": s.mlp.hidden,
        "activation_function": _act(s.mlp.activation, ("mlp", "activation")),
        "layer_norm_epsilon": s.norm.eps,
        "tie_word_embeddings": s.tie_embeddings,
        **_no_outside_ids(s.vocab_size),
    }


def falcon(s: Any) -> dict[str, Any]:
    _layernorm(s, ("shared_norm", "separate_norms", "none"))
    a = s.attention
    kv = a.kv_heads or a.heads
    cfg = {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "hidden_size": s.d_model,
        "num_hidden_layers": s.blocks,
        "num_attention_heads": a.heads,
        "ffn_hidden_size": s.mlp.hidden,
        "activation": _act(s.mlp.activation, ("mlp", "activation")),
        "layer_norm_epsilon": s.norm.eps,
        "tie_word_embeddings": s.tie_embeddings,
        "bias": _bias(s, "qkv"),
        "alibi": s.position.type == "alibi",
    }
    if s.position.type == "alibi":
        p = s.position
        need(p.scaled and p.max_bias == 8.0 and p.bias_dtype == "bf16", ("position",), "ALiBi other than "
             "Falcon-RW's (max_bias 8, scaled, bf16)")  # fmt: skip
    else:
        cfg["rope_parameters"] = rope_parameters(s.position)
    if s.parallel == "separate_norms":
        cfg.update(new_decoder_architecture=True, num_kv_heads=kv)
    else:
        need(kv in (1, a.heads), ("attention", "kv_heads"), "grouped-query attention without two norms per block")
        cfg.update(multi_query=kv == 1, parallel_attn=s.parallel == "shared_norm")
    return cfg


def _alibi(s: Any, scaled: bool = False) -> None:
    p = s.position
    need(p.type == "alibi", ("position", "type"), f"{p.type} positions (the class uses ALiBi)")
    need(
        p.max_bias == 8.0 and p.scaled == scaled and p.bias_dtype == "fp32",
        ("position",),
        "ALiBi slopes, scaling or rounding other than the class's",
    )


def bloom(s: Any) -> dict[str, Any]:
    _layernorm(s, ("none",))
    _alibi(s)
    need(s.norm.embedding, ("norm", "embedding"), "no LayerNorm on the embeddings (BLOOM has one)")
    need(s.mlp.hidden == 4 * s.d_model, ("mlp", "hidden"), "an MLP other than 4·d_model")
    need(s.mlp.activation == "gelu_tanh", ("mlp", "activation"), "an activation other than tanh-GELU")
    b = s.bias
    need(all((b.qkv, b.out, b.mlp, b.norm)) and not b.head, ("bias",), "biases other than BLOOM's")
    need((s.attention.kv_heads or s.attention.heads) == s.attention.heads, ("attention", "kv_heads"), "GQA")
    return {
        "vocab_size": s.vocab_size,
        "hidden_size": s.d_model,
        "n_layer": s.blocks,
        "n_head": s.attention.heads,
        "layer_norm_epsilon": s.norm.eps,
        "tie_word_embeddings": s.tie_embeddings,
        "seq_length": s.context,
    }


def mpt(s: Any) -> dict[str, Any]:
    _layernorm(s, ("none",))
    _alibi(s)
    need(not s.norm.embedding, ("norm", "embedding"), "a LayerNorm on the embeddings")
    need(s.mlp.hidden == 4 * s.d_model, ("mlp", "hidden"), "an MLP other than 4·d_model")
    need(s.mlp.activation == "gelu", ("mlp", "activation"), "an activation other than GELU")
    b = s.bias
    need(not any((b.qkv, b.out, b.mlp, b.norm, b.head)), ("bias",), "biases (MPT has none)")
    need(s.tie_embeddings, ("tie_embeddings",), "an untied head")
    need((s.attention.kv_heads or s.attention.heads) == s.attention.heads, ("attention", "kv_heads"), "GQA")
    return {
        "vocab_size": s.vocab_size,
        "max_seq_len": s.context,
        "d_model": s.d_model,
        "n_layers": s.blocks,
        "n_heads": s.attention.heads,
        "layer_norm_epsilon": s.norm.eps,
    }


def bert(s: Any) -> dict[str, Any]:
    need(s.norm.type == "layernorm" and s.norm.placement == "post", ("norm",), "norms other than post-LayerNorm")
    need(s.position.type == "learned", ("position", "type"), f"{s.position.type} positions")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.head_activation == s.mlp.activation, ("head_activation",), "a head activation unlike the MLP's")
    return {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "type_vocab_size": s.type_vocab_size,
        **_bert_sizes(s),
        "tie_word_embeddings": s.tie_embeddings,
    }


def modernbert(s: Any) -> dict[str, Any]:
    """Global and two-sided local layers by ``layer_types``, each type's RoPE base by ``rope_parameters``."""
    n = s.norm
    need(n.type == "layernorm" and n.placement == "pre" and n.embedding and n.skip_first, ("norm",), "these norms")
    need(resolve.final_norm(s), ("norm", "final"), "no final norm")
    need(s.mlp.type == "swiglu", ("mlp", "type"), f"a {s.mlp.type} MLP (ModernBERT's is gated)")
    need(s.position.type == "rotary" and s.position.scaling is None, ("position",), "positions other than RoPE")
    need(s.type_vocab_size == 0, ("type_vocab_size",), "token types")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v and output biases that differ")
    types, thetas, windows = [], {}, set()
    for layer in _layers(s):
        a, local = layer.attention, layer.attention.mask == "local"
        need(a.mask in ("local", "padding", "none"), ("attention", "mask"), f"mask {a.mask}")
        t = "sliding_attention" if local else "full_attention"
        types.append(t)
        need(thetas.setdefault(t, layer.position.theta) == layer.position.theta, ("position",), "per-layer thetas")
        if local:
            windows.add(a.window)
    need(len(windows) <= 1, ("layer_kinds",), "local windows of several widths")
    return {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "hidden_size": s.d_model,
        "num_hidden_layers": s.blocks,
        "num_attention_heads": s.attention.heads,
        "intermediate_size": s.mlp.hidden,
        "hidden_activation": _act(s.mlp.activation, ("mlp", "activation")),
        "classifier_activation": _act(s.head_activation, ("head_activation",)),
        "norm_eps": s.norm.eps,
        "norm_bias": _bias(s, "norm"),
        "attention_bias": _bias(s, "qkv"),
        "mlp_bias": _bias(s, "mlp"),
        "classifier_bias": _bias(s, "mlp"),
        "decoder_bias": _bias(s, "head"),
        "layer_types": types,
        "local_attention": windows.pop() if windows else 128,
        "rope_parameters": {t: {"rope_type": "default", "rope_theta": theta} for t, theta in thetas.items()},
        "tie_word_embeddings": s.tie_embeddings,
        "pad_token_id": 0,
    }


def roberta(s: Any) -> dict[str, Any]:
    """BERT's config with positions after the padding id: offset = pad_token_id + 1, counted by real tokens."""
    p = s.position
    need(p.offset >= 1 and bool(p.skip_padding), ("position",), "positions not after a padding row (RoBERTa's)")
    need(s.head_activation == "gelu", ("head_activation",), "an MLM head activation other than gelu")
    need(s.norm.type == "layernorm" and s.norm.placement == "post", ("norm",), "norms other than post-LayerNorm")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.type_vocab_size >= 1, ("type_vocab_size",), "no token-type table")
    return {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context + p.offset,
        "pad_token_id": p.offset - 1,
        "type_vocab_size": s.type_vocab_size,
        **_bert_sizes(s),
        "tie_word_embeddings": s.tie_embeddings,
    }


def distilbert(s: Any) -> dict[str, Any]:
    need(s.norm.type == "layernorm" and s.norm.placement == "post", ("norm",), "norms other than post-LayerNorm")
    need(s.norm.eps == 1e-12, ("norm", "eps"), "a LayerNorm eps other than 1e-12")
    need(s.position.type == "learned", ("position", "type"), f"{s.position.type} positions")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.type_vocab_size == 0, ("type_vocab_size",), "token types (DistilBERT has none)")
    act = _act(s.mlp.activation, ("mlp", "activation"))
    need(
        s.head != "mlm" or s.head_activation == s.mlp.activation,
        ("head_activation",),
        "a head activation unlike the MLP's",
    )
    return {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "dim": s.d_model,
        "n_layers": s.blocks,
        "n_heads": s.attention.heads,
        "hidden_dim": s.mlp.hidden,
        "activation": act,
        "tie_word_embeddings": s.tie_embeddings,
        "pad_token_id": 0,
    }


def opt(s: Any) -> dict[str, Any]:
    pre = s.norm.placement == "pre"
    need(s.norm.type == "layernorm" and s.norm.placement in ("pre", "post"), ("norm",), "norms other than LayerNorm")
    need(_bias(s, "norm"), ("bias", "norm"), "LayerNorms without bias")
    need(s.norm.eps == 1e-5, ("norm", "eps"), "a LayerNorm eps other than 1e-5")
    need(s.position.type == "learned" and s.position.offset == 2, ("position",), "positions without OPT's 2 rows")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.parallel == "none" and s.embedding_scale is None, ("parallel",), "a parallel or scaled block")
    _plain_attention(s)
    a = s.attention
    need(a.kv_heads in (None, a.heads), ("attention", "kv_heads"), "grouped-query attention")
    need(a.head_dim in (None, s.d_model // a.heads), ("attention", "head_dim"), "a head_dim other than D / heads")
    bias = _bias(s, "qkv")
    need(_bias(s, "out") == bias == _bias(s, "mlp"), ("bias",), "biases on some projections only")
    return {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "hidden_size": s.d_model,
        "word_embed_proj_dim": s.d_model,
        "num_hidden_layers": s.blocks,
        "num_attention_heads": a.heads,
        "ffn_dim": s.mlp.hidden,
        "activation_function": _act(s.mlp.activation, ("mlp", "activation")),
        "do_layer_norm_before": pre,
        "_remove_final_layer_norm": pre and not s.norm.final,
        "enable_bias": bias,
        "tie_word_embeddings": s.tie_embeddings,
    }


def _bert_sizes(s: Any) -> dict[str, Any]:
    """The sizes BERT and ViT configs name alike."""
    return {
        "hidden_size": s.d_model,
        "num_hidden_layers": s.blocks,
        "num_attention_heads": s.attention.heads,
        "intermediate_size": s.mlp.hidden,
        "hidden_act": _act(s.mlp.activation, ("mlp", "activation")),
        "layer_norm_eps": s.norm.eps,
    }


def _whole_patches(s: Any) -> None:
    need(not s.image.drop_remainder, ("image", "drop_remainder"), "an image that is not a multiple of its patch")


def vit(s: Any) -> dict[str, Any]:
    _whole_patches(s)
    need(s.norm.type == "layernorm" and s.norm.placement == "pre", ("norm",), "norms other than pre-LayerNorm")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.pooling == "cls", ("pooling",), "mean pooling")
    need(s.image.patch_bias, ("image", "patch_bias"), "a patch convolution without bias")
    need(not s.norm.embedding, ("norm", "embedding"), "a norm before the blocks")
    cfg = {
        "image_size": s.image.size,
        "patch_size": s.image.patch,
        "num_channels": s.image.channels,
        **_bert_sizes(s),
        "qkv_bias": _bias(s, "qkv"),
    }
    if s.head == "classifier":
        cfg["id2label"] = {str(i): f"LABEL_{i}" for i in range(s.classes)}
    return cfg


def _clip_tower(s: Any) -> dict[str, Any]:
    """What CLIP's two tower configs share: pre-LayerNorm blocks with biases everywhere, a classic MLP."""
    need(s.norm.type == "layernorm" and s.norm.placement == "pre", ("norm",), "norms other than pre-LayerNorm")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.position.type == "learned", ("position", "type"), f"{s.position.type} positions")
    need(all(_bias(s, k) for k in ("qkv", "out", "mlp", "norm")), ("bias",), "layers without bias")
    return _bert_sizes(s)


def clip_vision(s: Any) -> dict[str, Any]:
    need(
        not s.image.drop_remainder or s.image.size % s.image.patch,
        ("image", "drop_remainder"),
        "drop_remainder with no remainder to drop",
    )
    need(s.pooling == "cls", ("pooling",), "mean pooling")
    need(not s.image.patch_bias, ("image", "patch_bias"), "a patch convolution with bias")
    need(s.norm.embedding and s.norm.final is False, ("norm",), "norms other than pre_layrnorm and post_layernorm")
    need(resolve.mask(s) == "none", ("attention", "mask"), "a masked vision tower")
    return {"image_size": s.image.size, "patch_size": s.image.patch, "num_channels": s.image.channels, **_clip_tower(s)}


def siglip_vision(s: Any) -> dict[str, Any]:
    need(s.pooling == "none", ("pooling",), "a class token or mean pooling")
    need(
        not s.image.drop_remainder or s.image.size % s.image.patch,
        ("image", "drop_remainder"),
        "drop_remainder with no remainder to drop",
    )
    need(s.image.patch_bias and not s.norm.embedding, ("norm", "embedding"), "a norm before the blocks")
    need(resolve.final_norm(s), ("norm", "final"), "no final norm (post_layernorm)")
    need(resolve.mask(s) == "none", ("attention", "mask"), "a masked vision tower")
    return {
        "image_size": s.image.size,
        "patch_size": s.image.patch,
        "num_channels": s.image.channels,
        "vision_use_head": s.head == "attention_pool",
        **_clip_tower(s),
    }


def clip_text(s: Any) -> dict[str, Any]:
    need(resolve.mask(s) == "causal", ("attention", "mask"), "a text tower that is not causal")
    need(not s.norm.embedding and resolve.final_norm(s), ("norm",), "norms other than final_layer_norm")
    need(s.type_vocab_size == 0 and not s.position.offset, ("type_vocab_size",), "token types or position offsets")
    # eos_token_id 2 means "pool at the largest id" to transformers; null is that rule
    need(s.eos_token != 2, ("eos_token",), "pooling at id 2 (transformers reads eos_token_id 2 as the largest id)")
    return {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "eos_token_id": 2 if s.eos_token is None else s.eos_token,
        **_clip_tower(s),
    }


def _projected(tower: Any, write: Callable[[Any], dict[str, Any]], projection: bool) -> dict[str, Any]:
    """A CLIP tower's config, with (the *WithProjection classes) or without its bias-free projection."""
    if not projection:
        need(tower.projection is None, ("projection",), "a projection (the *WithProjection class has one)")
        return write(tower)
    need(tower.projection is not None, ("projection",), "no projection (the *WithProjection class has one)")
    need(not tower.projection.bias, ("projection", "bias"), "a projection with bias")
    return {**write(tower), "projection_dim": tower.projection.dim}


def siglip_text(s: Any) -> dict[str, Any]:
    """SigLIP's text tower: bidirectional, final-normed, pooled at the last position through its head (with bias)."""
    need(resolve.mask(s) in ("none", "padding"), ("attention", "mask"), "a masked text tower")
    need(s.head == "last", ("head",), f"a {s.head} head (SigLIP's text tower pools the last position)")
    need(s.projection is not None and s.projection.bias, ("projection",), "no head with bias")
    need(not s.norm.embedding and resolve.final_norm(s), ("norm",), "norms other than final_layer_norm")
    need(s.type_vocab_size == 0 and not s.position.offset, ("type_vocab_size",), "token types or position offsets")
    return {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "projection_size": s.projection.dim,
        **_clip_tower(s),
    }


def _tower(part: str, tower: Any, write: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """A dual encoder's tower config; what it cannot state is blamed on the tower's own key."""
    try:
        return write(tower)
    except Inexpressible as e:
        raise Inexpressible((part, *e.path), e.message) from None


def clip(s: Any) -> dict[str, Any]:
    """CLIPModel: both towers with bias-free projections of one width, a learned logit scale, no bias."""
    need(s.contrastive.logit_bias is None, ("contrastive", "logit_bias"), "a logit bias")
    need(s.vision.projection is not None, ("vision", "projection"), "no image projection")
    return {
        "vision_config": _tower("vision", s.vision, lambda t: _projected(t, clip_vision, True)),
        "text_config": _tower("text", s.text, lambda t: _projected(t, clip_text, True)),
        "projection_dim": s.vision.projection.dim,
        "logit_scale_init_value": s.contrastive.logit_scale,
    }


def siglip(s: Any) -> dict[str, Any]:
    """SiglipModel: the attention-pooled image tower unprojected, the text tower's head, a logit scale and bias."""
    need(s.contrastive.logit_bias is not None, ("contrastive", "logit_bias"), "no logit bias")
    need(s.vision.projection is None, ("vision", "projection"), "an image projection")
    need(s.vision.head == "attention_pool", ("vision", "head"), f"a {s.vision.head} image head")
    return {
        "vision_config": _tower("vision", s.vision, siglip_vision),
        "text_config": _tower("text", s.text, siglip_text),
    }


def bart(s: Any, arch: str) -> dict[str, Any]:
    marian = arch == "MarianMTModel"
    need(s.norm.type == "layernorm" and s.norm.placement == "post", ("norm",), "norms other than post-LayerNorm")
    need(s.norm.eps == 1e-5, ("norm", "eps"), "a LayerNorm eps other than 1e-5")
    need(s.position.type == ("sinusoidal" if marian else "learned"), ("position", "type"), "these positions")
    # BART's table has 2 rows before position 0: a spec's own (offset 2) or, without them, written as zeros
    need(s.position.offset in (0, 2) and not s.position.skip_padding, ("position",), "other position numbering")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.embedding_scale in (None, "sqrt_d_model"), ("embedding_scale",), "an embedding scale other than √D")
    cfg = {
        "vocab_size": s.vocab_size,
        "max_position_embeddings": s.context,
        "d_model": s.d_model,
        "encoder_layers": s.blocks.encoder,
        "decoder_layers": s.blocks.decoder,
        "encoder_attention_heads": s.attention.heads,
        "decoder_attention_heads": s.attention.heads,
        "encoder_ffn_dim": s.mlp.hidden,
        "decoder_ffn_dim": s.mlp.hidden,
        "activation_function": _act(s.mlp.activation, ("mlp", "activation")),
        "scale_embedding": s.embedding_scale == "sqrt_d_model",
        "tie_word_embeddings": s.tie_embeddings,
    }
    if marian:
        cfg.update(share_encoder_decoder_embeddings=s.shared_embeddings)
        cfg["decoder_vocab_size"] = s.target_vocab_size or s.vocab_size
        # HF's Marian pads with the last id and starts decoding with it (its only special rows)
        pad = min(cfg["vocab_size"], cfg["decoder_vocab_size"]) - 1
        cfg.update(pad_token_id=pad, decoder_start_token_id=pad)
    else:
        need(s.shared_embeddings == s.tie_embeddings, ("shared_embeddings",), "sharing without tying (or back)")
    return cfg


def t5(s: Any, arch: str) -> dict[str, Any]:
    """T5, mT5 and UMT5 (the inverse of ``hf_t5.spec``): pre-RMSNorm, no biases, unscaled scores, bucketed relative
    positions (one table per stack, UMT5 one per layer), one shared embedding, relu / gated MLPs."""
    mt5, umt5 = arch.startswith("MT5"), arch.startswith("UMT5")
    _pre_rms(s)
    need(not any(_bias(s, k) for k in ("qkv", "out", "mlp", "norm", "head")), ("bias",), "biases (T5 has none)")
    a = s.attention  # (no layer kinds in an encoder-decoder: the top level is every block)
    need(a.prefix is None and a.chunk is None and a.latent is None, ("attention",), "prefix / chunked / latent")
    need(a.softcap is None and a.qk_norm == "none", ("attention",), "softcapping or QK-norm")
    need(s.output.softcap is None, ("output", "softcap"), "final logit softcapping")
    need(a.scale == 1.0, ("attention", "scale"), "scaled scores (T5 folds 1/√d_kv into the weights: scale 1)")
    need(a.mask in (None, "padding"), ("attention", "mask"), f"a {a.mask} mask")
    need(a.kv_heads in (None, a.heads), ("attention", "kv_heads"), "grouped-query attention")
    p = s.position
    need(p.type == "relative", ("position", "type"), f"{p.type} positions (T5's are bucketed relative ones)")
    need(p.per_layer == umt5, ("position", "per_layer"), "per-layer tables" if p.per_layer else "tables per stack")
    need(s.shared_embeddings, ("shared_embeddings",), "separate source and target embeddings")
    need(s.target_vocab_size in (None, s.vocab_size), ("target_vocab_size",), "a target vocabulary of its own")
    need(s.vocab_size > 1, ("vocab_size",), "fewer than 2 ids (T5 pads with 0, ends with 1)")
    m = s.mlp
    need(m.type in ("classic", "swiglu"), ("mlp", "type"), f"a {m.type} MLP")
    act = _act(m.activation, ("mlp", "activation"))
    proj = act if m.type == "classic" else "gated-gelu" if m.activation == "gelu_tanh" else f"gated-{act}"
    d = s.d_model
    scaled = s.output.scale != 1.0
    need(not mt5 or not scaled, ("output", "scale"), "a scaled decoder output (mT5 never scales)")
    need(not scaled or abs(s.output.scale - d**-0.5) < 1e-12, ("output", "scale"), "output scales other than D^-½")
    cfg: dict[str, Any] = {
        "vocab_size": s.vocab_size,
        "n_positions": s.context,
        "d_model": d,
        "d_kv": a.head_dim or d // a.heads,
        "d_ff": m.hidden,
        "num_layers": s.blocks.encoder,
        "num_decoder_layers": s.blocks.decoder,
        "num_heads": a.heads,
        "relative_attention_num_buckets": p.buckets,
        "relative_attention_max_distance": p.max_distance,
        "layer_norm_epsilon": s.norm.eps,
        "feed_forward_proj": proj,
        "tie_word_embeddings": s.tie_embeddings,
        "is_encoder_decoder": True,
        "pad_token_id": 0,  # T5's convention: decoding starts with the pad id
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    }
    if not mt5:  # transformers 5 ties T5's head always and reads whether to scale from this field
        cfg["scale_decoder_outputs"] = scaled
    return cfg


def t5_encoder(s: Any, arch: str) -> dict[str, Any]:
    """T5EncoderModel, mT5's and UMT5's (the inverse of ``hf_t5.encoder_spec``): T5's config of the encoder stack
    alone, checked as ``t5`` checks an encoder-decoder whose encoder this is."""
    need(s.type_vocab_size == 0, ("type_vocab_size",), "token types")
    blocks = {"encoder": s.blocks, "decoder": 1}  # the decoder's fields are T5Config's, unread by the encoder
    keep = set(EncoderDecoderSpec.model_fields) - {"kind", "blocks", "tie_embeddings", "output"}
    whole = EncoderDecoderSpec.model_validate(
        {**s.model_dump(include=keep), "kind": "encoder_decoder", "blocks": blocks, "tie_embeddings": True}
    )
    cfg = t5(whole, arch.replace("EncoderModel", "ForConditionalGeneration"))
    drop = ("num_decoder_layers", "is_encoder_decoder", "decoder_start_token_id", "scale_decoder_outputs")
    return {k: v for k, v in cfg.items() if k not in drop}


def whisper(s: Any) -> dict[str, Any]:
    """WhisperForConditionalGeneration (the inverse of ``hf_whisper.spec``): the audio front-end, pre-LayerNorm
    blocks with a final norm per stack, biases everywhere but the key projections and the head, learned decoder
    positions, one attention and MLP shape for both stacks."""
    need(s.audio is not None, ("audio",), "token input (Whisper's encoder reads input_features)")
    n = s.norm
    need(n.type == "layernorm" and n.placement == "pre" and n.eps == 1e-5, ("norm",), "norms other than pre-LN 1e-5")
    need(not n.embedding and resolve.final_norm(s), ("norm",), "an embedding norm, or no final norm")
    flags = {"qkv": True, "out": True, "mlp": True, "norm": True, "head": False}
    for key, want in flags.items():
        need(_bias(s, key) == want, ("bias", key), f"bias.{key} {_bias(s, key)} (Whisper's is {want})")
    need(
        resolve.qkv_bias(s) == (True, False, True), ("bias", "k"), "a bias on the key projections (Whisper's has none)"
    )
    a, d = s.attention, s.d_model
    need(a.kv_heads in (None, a.heads) and a.head_dim in (None, d // a.heads), ("attention",), "GQA or a head size")
    need(a.scale is None or a.scale == resolve.head_dim(s) ** -0.5, ("attention", "scale"), "another score scale")
    need(a.mask in (None, "none") and a.softcap is None and a.qk_norm == "none", ("attention",), "masks or caps")
    p = s.position
    need(p.type == "learned" and not p.offset and not p.skip_padding, ("position",), "positions other than a table")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP")
    need(s.embedding_scale is None, ("embedding_scale",), "an embedding scale (transformers' Whisper applies none)")
    need(s.output.scale == 1.0 and s.output.softcap is None, ("output",), "logit transforms")
    need(s.residual_scale == 1.0 and s.parallel == "none", ("residual_scale",), "scaled or parallel sublayers")
    start = s.decoder_start_token if s.decoder_start_token is not None else 1  # specc's default
    return {
        "vocab_size": s.vocab_size,
        "num_mel_bins": s.audio.mel_bins,
        "max_source_positions": s.audio.positions,
        "max_target_positions": s.context,
        "d_model": d,
        "encoder_layers": s.blocks.encoder,
        "decoder_layers": s.blocks.decoder,
        "encoder_attention_heads": a.heads,
        "decoder_attention_heads": a.heads,
        "encoder_ffn_dim": s.mlp.hidden,
        "decoder_ffn_dim": s.mlp.hidden,
        "activation_function": _act(s.mlp.activation, ("mlp", "activation")),
        "tie_word_embeddings": s.tie_embeddings,
        "decoder_start_token_id": start,
        "is_encoder_decoder": True,
        # ids and token suppression the spec does not hold: none, rather than transformers' defaults (ids of the
        # 51865-token vocabulary), so that generate runs the model as specc's does
        **dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id", "suppress_tokens", "begin_suppress_tokens")),
    }


def granite(s: Any) -> dict[str, Any]:
    """Llama with multipliers on the embeddings, the scores, each residual branch and (divided) the logits."""
    need(s.norm.type == "rmsnorm" and s.norm.placement == "pre", ("norm",), "norms other than pre-RMSNorm")
    need(not s.norm.unit_offset and s.parallel == "none", ("norm",), "(1 + w) norms or a parallel block")
    need(s.embedding_scale != "sqrt_d_model", ("embedding_scale",), "an embedding scale of √D (Granite's is a number)")
    _plain_attention(s, "scale", "logit_scale")
    need(_one_window(s) is None, ("attention", "mask"), "sliding windows")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, **_swiglu(s.mlp)}
    cfg.update(attention_bias=_bias(s, "qkv"), mlp_bias=_bias(s, "mlp"), rope_parameters=rope_parameters(s.position))
    cfg.update(attention_multiplier=s.attention.scale or cfg["head_dim"] ** -0.5, residual_multiplier=s.residual_scale)
    cfg.update(embedding_multiplier=s.embedding_scale or 1.0, logits_scaling=1.0 / s.output.scale)
    return cfg


def starcoder2(s: Any) -> dict[str, Any]:
    need(s.norm.type == "layernorm" and s.norm.placement == "pre", ("norm",), "norms other than pre-LayerNorm")
    need(_bias(s, "norm"), ("bias", "norm"), "LayerNorms without bias")
    need(s.mlp.type == "classic", ("mlp", "type"), f"a {s.mlp.type} MLP (StarCoder2's is c_fc → c_proj)")
    need(s.parallel == "none" and s.embedding_scale is None, ("parallel",), "a parallel or scaled block")
    _plain_attention(s, "mask")
    window = _one_window(s)
    need(window is None or set(_layer_types(s)) == {"sliding_attention"}, ("layer_kinds",), "per-layer windows")
    use_bias = _bias(s, "qkv")
    need(_bias(s, "out") == use_bias == _bias(s, "mlp"), ("bias",), "biases on some projections only")
    cfg = {**_sizes(s), "norm_epsilon": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, "use_bias": use_bias}
    cfg.update(intermediate_size=s.mlp.hidden, hidden_act=_act(s.mlp.activation, ("mlp", "activation")))
    cfg.update(sliding_window=window, rope_parameters=rope_parameters(s.position))
    return cfg


def olmoe(s: Any) -> dict[str, Any]:
    _pre_rms(s)
    _plain_attention(s, "qk_norm")
    need(s.attention.qk_norm == "full", ("attention", "qk_norm"), "OLMoE without full-width QK-norm")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    m = s.mlp
    need(m.type == "moe" and m.expert == "swiglu" and m.shared is None, ("mlp",), "an MLP other than OLMoE's MoE")
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings}
    cfg.update(attention_bias=_bias(s, "qkv"), rope_parameters=rope_parameters(s.position))
    cfg.update(intermediate_size=m.hidden, hidden_act=_act(_moe_activation(m), ("mlp", "activation")))
    cfg.update(num_experts=m.experts, num_experts_per_tok=m.active, norm_topk_prob=m.router.normalize)
    cfg["router_aux_loss_coef"] = m.router.aux_loss_coef
    return cfg


def gpt_oss(s: Any) -> dict[str, Any]:
    _pre_rms(s)
    _plain_attention(s, "mask")
    need(all(layer.attention.sinks for layer in _layers(s)), ("attention", "sinks"), "attention without sinks")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    m = s.mlp
    need(m.type == "moe" and m.expert == "swiglu" and m.shared is None, ("mlp",), "an MLP other than GPT-OSS's MoE")
    need(m.clamp is not None, ("mlp", "clamp"), "experts without the clamped SwiGLU")
    need(_bias(s, "mlp") and m.router.bias, ("bias", "mlp"), "experts or a router without biases")
    need(m.router.normalize and m.router.score == "softmax", ("mlp", "router"), "routing other than top-k softmax")
    window = _one_window(s)
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings}
    cfg.update(attention_bias=_bias(s, "qkv"), rope_parameters=rope_parameters(s.position))
    cfg.update(intermediate_size=m.hidden, num_local_experts=m.experts, num_experts_per_tok=m.active)
    cfg.update(swiglu_alpha=m.clamp.alpha, swiglu_limit=m.clamp.limit, router_aux_loss_coef=m.router.aux_loss_coef)
    cfg.update(layer_types=_layer_types(s), sliding_window=window)
    return cfg


def _nope_rope(s: Any, interleaved: bool = False) -> tuple[list[bool], dict[str, Any]]:
    """Which layers rotate q/k, and the one RoPE they share."""
    layers = _layers(s)
    rotary = [layer.position.type == "rotary" for layer in layers]
    need(any(rotary), ("position", "type"), "no RoPE in any layer")
    ropes = [
        rope_parameters(layer.position, ("position",), False, interleaved)
        for layer in layers
        if layer.position.type == "rotary"
    ]
    need(all(r == ropes[0] for r in ropes), ("layer_kinds",), "different RoPE in different layers")
    for layer, r in zip(layers, rotary, strict=True):
        need(r or layer.position.type == "none", ("layer_kinds",), f"{layer.position.type} positions in a layer")
    return rotary, ropes[0]


def smollm3(s: Any) -> dict[str, Any]:
    _pre_rms(s)
    _plain_attention(s, "mask")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    rotary, rope = _nope_rope(s)
    window = _one_window(s)
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, **_swiglu(s.mlp)}
    cfg.update(attention_bias=_bias(s, "qkv"), mlp_bias=_bias(s, "mlp"), rope_parameters=rope)
    cfg.update(no_rope_layers=[int(r) for r in rotary], layer_types=_layer_types(s))
    cfg.update(use_sliding_window=window is not None, sliding_window=window)
    cfg["pad_token_id"] = None  # SmolLM3Config's default (128004) is outside small vocabularies
    return cfg


def _rope_on_sliding_layers(s: Any, interleaved: bool = False) -> tuple[list[str], dict[str, Any], int | None]:
    """EXAONE 4 and Cohere2: RoPE in the sliding layers only (EXAONE 4: everywhere when nothing slides)."""
    rotary, rope = _nope_rope(s, interleaved)
    types, window = _layer_types(s), _one_window(s)
    want = [t == "sliding_attention" or window is None for t in types]
    need(rotary == want, ("layer_kinds",), "RoPE in other layers than the sliding ones")
    return types, rope, window


def exaone4(s: Any) -> dict[str, Any]:
    _pre_rms(s, "output")
    _plain_attention(s, "mask", "qk_norm")
    need(all(layer.attention.qk_norm == "head" for layer in _layers(s)), ("attention", "qk_norm"), "no QK-norm")
    need(not any(_bias(s, k) for k in ("qkv", "out", "mlp")), ("bias",), "biases (EXAONE 4 has none)")
    types, rope, window = _rope_on_sliding_layers(s)
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, **_swiglu(s.mlp)}
    cfg.update(rope_parameters=rope, layer_types=types, sliding_window=window)
    return cfg


def cohere(s: Any, arch: str) -> dict[str, Any]:
    need(s.norm.type == "layernorm" and s.norm.placement == "pre", ("norm",), "norms other than pre-LayerNorm")
    need(not _bias(s, "norm") and not _bias(s, "mlp"), ("bias",), "biases on the norms or the MLP")
    need(s.parallel == "shared_norm" and s.embedding_scale is None, ("parallel",), "Cohere's parallel block")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    first = arch == "CohereForCausalLM"
    _plain_attention(s, "logit_scale", *(() if first else ("mask",)))
    rotary, rope = _nope_rope(s, interleaved=True)
    halves = any(layer.position.rotation == "half" for layer in _layers(s) if layer.position.type == "rotary")
    need(not halves, ("position", "rotation"), "RoPE on halves (Cohere rotates adjacent pairs)")
    cfg = {**_sizes(s), "layer_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, **_swiglu(s.mlp)}
    cfg.update(attention_bias=_bias(s, "qkv"), logit_scale=s.output.scale)
    if first:
        need(all(rotary), ("layer_kinds",), "layers without RoPE")
        need(_one_window(s) is None, ("attention", "mask"), "sliding windows")
    else:
        types, rope, window = _rope_on_sliding_layers(s, interleaved=True)
        need(window is not None, ("attention", "mask"), "no sliding layers (Cohere2 alternates them)")
        cfg.update(layer_types=types, sliding_window=window)
    cfg["rope_parameters"] = rope
    return cfg


def _one(values: list[Any], path: tuple[str | int, ...], message: str) -> Any:
    """The value every layer (of some group) shares; None when there is no such layer."""
    need(all(v == values[0] for v in values), path, message)
    return values[0] if values else None


def llama4(s: Any) -> dict[str, Any]:
    """Llama 4 text: RoPE layers (pairs, chunked or full, weightless QK-norm) and NoPE layers (full, temperature
    tuning); MoE layers (sigmoid top-k gates on the experts' inputs, a shared expert) and dense ones."""
    _pre_rms(s)
    need(_bias(s, "qkv") == _bias(s, "out") and not _bias(s, "mlp"), ("bias",), "biases other than Llama 4's")
    rotary, rope = _nope_rope(s, interleaved=True)
    layers = _layers(s)
    rope_layers = [layer for layer, r in zip(layers, rotary, strict=True) if r]
    nope_layers = [layer for layer, r in zip(layers, rotary, strict=True) if not r]
    need(all(x.position.rotation == "interleaved" for x in rope_layers), ("position", "rotation"), "RoPE on halves")
    for layer in layers:
        a = layer.attention
        need(a.mask in (None, "causal", "chunked"), ("attention", "mask"), f"a {a.mask} mask")
        need(a.scale is None and a.softcap is None and not a.sinks, ("attention",), "a scale, softcap or sinks")
        need(a.latent is None and a.prefix is None, ("attention",), "latent or prefix attention")
    chunked = [layer.attention.mask == "chunked" for layer in layers]
    chunk = _one([x.attention.chunk for x in layers if x.attention.mask == "chunked"], ("attention", "chunk"),
                 "chunks of different sizes")  # fmt: skip
    l2 = _one([x.attention.qk_norm for x in rope_layers], ("attention", "qk_norm"), "QK-norm in some RoPE layers")
    need(l2 in ("l2", "none") and all(x.attention.qk_norm == "none" for x in nope_layers), ("attention", "qk_norm"),
         "a QK-norm other than the weightless one of the RoPE layers")  # fmt: skip
    t = _one([x.attention.temperature for x in nope_layers], ("attention", "temperature"), "temperature in some layers")
    need(all(x.attention.temperature is None for x in rope_layers), ("attention", "temperature"), "tuned RoPE layers")
    moe = [layer.mlp for layer in layers if layer.mlp.type == "moe"]
    dense = [layer.mlp for layer in layers if layer.mlp.type != "moe"]
    m = _one(moe, ("mlp",), "MoE layers that differ")
    d = _one(dense, ("mlp",), "dense layers that differ")
    cfg = {**_sizes(s), "rms_norm_eps": s.norm.eps, "tie_word_embeddings": s.tie_embeddings, "rope_parameters": rope}
    if m is not None:
        r = m.router
        need(m.expert == "swiglu" and m.clamp is None, ("mlp", "expert"), "experts other than plain SwiGLU")
        need(r.score == "sigmoid" and r.weighs == "input" and not r.normalize, ("mlp", "router"),
             "a router other than Llama 4's (sigmoid gates on the experts' inputs, not renormalised)")  # fmt: skip
        need(not r.score_bias and r.groups == 1 and r.scale == 1.0 and not r.bias, ("mlp", "router"),
             "DeepSeek or GPT-OSS routing")  # fmt: skip
        need(r.aux_loss_coef == 0 and r.jitter == 0, ("mlp", "router"), "a load-balancing loss or router jitter")
        need(m.shared is not None and m.shared.hidden == m.hidden and m.shared.gate == "none", ("mlp", "shared"),
             "MoE without an ungated shared expert of the experts' size")  # fmt: skip
        cfg.update(num_local_experts=m.experts, num_experts_per_tok=m.active, intermediate_size=m.hidden)
    act = _one([_moe_activation(x) for x in moe] + [x.activation for x in dense], ("mlp", "activation"),
               "different activations")  # fmt: skip
    if d is not None:
        need(d.type == "swiglu", ("mlp", "type"), f"a {d.type} MLP (Llama 4's dense layers are gated)")
        cfg["intermediate_size_mlp"] = d.hidden
        cfg.setdefault("intermediate_size", d.hidden)  # read by the shared expert alone: MoE layers set it
    else:
        cfg["intermediate_size_mlp"] = m.hidden
    cfg.update(hidden_act=_act(act, ("mlp", "activation")), attention_bias=_bias(s, "qkv"))
    cfg.update(moe_layers=[i for i, x in enumerate(layers) if x.mlp.type == "moe"])
    cfg.update(no_rope_layers=[int(r) for r in rotary], use_qk_norm=l2 == "l2", attention_chunk_size=chunk)
    cfg["layer_types"] = ["chunked_attention" if c else "full_attention" for c in chunked]
    cfg["attn_temperature_tuning"] = t is not None
    if t is not None:
        cfg.update(floor_scale=t.floor, attn_scale=t.scale)
    return cfg


def deepseek(s: Any, arch: str) -> dict[str, Any]:
    """DeepSeek-V2 / V3: latent attention, DeepSeek routing, shared experts, dense-first layers."""
    v3 = arch == "DeepseekV3ForCausalLM"
    _pre_rms(s)
    a, lat = s.attention, s.attention.latent
    need(lat is not None, ("attention", "latent"), "attention without a latent (DeepSeek's is MLA)")
    need(a.mask in (None, "causal"), ("attention", "mask"), f"a {a.mask} mask")
    need(lat.eps == 1e-6, ("attention", "latent", "eps"), "latent norms of eps other than 1e-6")
    need(_bias(s, "qkv") == _bias(s, "out"), ("bias",), "q/k/v biases without an output bias")
    need(s.position.rotation == "interleaved" or v3, ("position", "rotation"), "RoPE halves (V2 pairs them)")
    layers = _layers(s)
    moe = [i for i, layer in enumerate(layers) if layer.mlp.type == "moe"]
    need(bool(moe) and moe == list(range(moe[0], len(layers))), ("layer_kinds",), "MoE layers other than the last")
    m = layers[moe[0]].mlp
    dense = [layer.mlp for layer in layers if layer.mlp.type != "moe"]
    r = m.router
    need(r.aux_loss_coef == 0 and r.jitter == 0, ("mlp", "router"), "a load-balancing loss or router jitter")
    if v3:
        need(r.score == "sigmoid" and r.score_bias, ("mlp", "router"), "V3's router (sigmoid scores, a score bias)")
        need(r.group_score == "top2_sum", ("mlp", "router", "group_score"), "group scores other than the top-2 sum")
    else:
        need(r.score == "softmax" and not r.score_bias, ("mlp", "router"), "V2's router (softmax, no score bias)")
        need(not r.normalize, ("mlp", "router", "normalize"), "renormalised gates (V2 never renormalises)")
        need(r.group_score == "max", ("mlp", "router", "group_score"), "group scores other than the best expert's")
    shared = m.shared.hidden // m.hidden if m.shared is not None else 0
    need(m.shared is None or shared * m.hidden == m.shared.hidden, ("mlp", "shared"), "a partial shared expert")
    need(m.shared is None or m.shared.gate == "none", ("mlp", "shared", "gate"), "a gated shared expert")
    cfg = {k: v for k, v in _sizes(s).items() if k != "head_dim"}
    cfg.update(num_key_value_heads=a.heads, rms_norm_eps=s.norm.eps, tie_word_embeddings=s.tie_embeddings)
    cfg.update(attention_bias=_bias(s, "qkv"), rope_parameters=rope_parameters(s.position, interleaved=True))
    cfg.update(kv_lora_rank=lat.kv_rank, q_lora_rank=lat.q_rank, qk_rope_head_dim=lat.rope_head_dim)
    cfg.update(qk_nope_head_dim=lat.nope_head_dim, v_head_dim=lat.v_head_dim or lat.nope_head_dim)
    if v3:
        cfg["rope_interleave"] = s.position.rotation == "interleaved"
    need(a.scale is None, ("attention", "scale"), "a custom attention scale")
    cfg.update(_swiglu(dense[0]) if dense else {"intermediate_size": m.hidden})
    cfg["hidden_act"] = _act(_moe_activation(m), ("mlp", "activation"))
    cfg.update(n_routed_experts=m.experts, num_experts_per_tok=m.active, moe_intermediate_size=m.hidden)
    cfg.update(n_shared_experts=shared, first_k_dense_replace=moe[0], routed_scaling_factor=r.scale)
    cfg.update(n_group=r.groups, topk_group=r.top_groups or r.groups, norm_topk_prob=r.normalize)
    if not v3:
        cfg.update(topk_method="group_limited_greedy" if r.groups > 1 else "greedy", mlp_bias=_bias(s, "mlp"))
    return cfg


# HF class → (model_type, writer)
WRITERS: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "GPT2LMHeadModel": ("gpt2", gpt2),
    "LlamaForCausalLM": ("llama", lambda s: llama(s, "LlamaForCausalLM")),
    "MistralForCausalLM": ("mistral", lambda s: llama(s, "MistralForCausalLM")),
    "MixtralForCausalLM": ("mixtral", lambda s: llama(s, "MixtralForCausalLM")),
    "Qwen2ForCausalLM": ("qwen2", lambda s: qwen(s, "Qwen2ForCausalLM")),
    "Qwen2MoeForCausalLM": ("qwen2_moe", lambda s: qwen(s, "Qwen2MoeForCausalLM")),
    "Qwen3ForCausalLM": ("qwen3", lambda s: qwen(s, "Qwen3ForCausalLM")),
    "Qwen3MoeForCausalLM": ("qwen3_moe", lambda s: qwen(s, "Qwen3MoeForCausalLM")),
    "GemmaForCausalLM": ("gemma", lambda s: gemma(s, "GemmaForCausalLM")),
    "Gemma2ForCausalLM": ("gemma2", lambda s: gemma(s, "Gemma2ForCausalLM")),
    "Gemma3ForCausalLM": ("gemma3_text", lambda s: gemma(s, "Gemma3ForCausalLM")),
    "Olmo2ForCausalLM": ("olmo2", olmo2),
    "OlmoeForCausalLM": ("olmoe", olmoe),
    "SmolLM3ForCausalLM": ("smollm3", smollm3),
    "Exaone4ForCausalLM": ("exaone4", exaone4),
    "CohereForCausalLM": ("cohere", lambda s: cohere(s, "CohereForCausalLM")),
    "Cohere2ForCausalLM": ("cohere2", lambda s: cohere(s, "Cohere2ForCausalLM")),
    "Starcoder2ForCausalLM": ("starcoder2", starcoder2),
    "GraniteForCausalLM": ("granite", granite),
    "Phi3ForCausalLM": ("phi3", phi3),
    "PhiForCausalLM": ("phi", phi),
    "GPTNeoXForCausalLM": ("gpt_neox", neox),
    "GPTJForCausalLM": ("gptj", gptj),
    "FalconForCausalLM": ("falcon", falcon),
    "BloomForCausalLM": ("bloom", bloom),
    "MptForCausalLM": ("mpt", mpt),
    "GptOssForCausalLM": ("gpt_oss", gpt_oss),
    "Llama4ForCausalLM": ("llama4_text", llama4),
    "BertForMaskedLM": ("bert", bert),
    "BertModel": ("bert", bert),
    "ModernBertForMaskedLM": ("modernbert", modernbert),
    "ModernBertModel": ("modernbert", modernbert),
    "RobertaForMaskedLM": ("roberta", roberta),
    "RobertaModel": ("roberta", roberta),
    "DistilBertForMaskedLM": ("distilbert", distilbert),
    "DistilBertModel": ("distilbert", distilbert),
    "OPTForCausalLM": ("opt", opt),
    "ViTForImageClassification": ("vit", vit),
    "ViTModel": ("vit", vit),
    "CLIPVisionModel": ("clip_vision_model", lambda s: _projected(s, clip_vision, False)),
    "CLIPVisionModelWithProjection": ("clip_vision_model", lambda s: _projected(s, clip_vision, True)),
    "CLIPTextModel": ("clip_text_model", lambda s: _projected(s, clip_text, False)),
    "CLIPTextModelWithProjection": ("clip_text_model", lambda s: _projected(s, clip_text, True)),
    "SiglipVisionModel": ("siglip_vision_model", siglip_vision),
    "CLIPModel": ("clip", clip),
    "SiglipModel": ("siglip", siglip),
    "BartForConditionalGeneration": ("bart", lambda s: bart(s, "BartForConditionalGeneration")),
    "MarianMTModel": ("marian", lambda s: bart(s, "MarianMTModel")),
    "T5ForConditionalGeneration": ("t5", lambda s: t5(s, "T5ForConditionalGeneration")),
    "MT5ForConditionalGeneration": ("mt5", lambda s: t5(s, "MT5ForConditionalGeneration")),
    "UMT5ForConditionalGeneration": ("umt5", lambda s: t5(s, "UMT5ForConditionalGeneration")),
    "T5Model": ("t5", lambda s: t5(s, "T5Model")),
    "MT5Model": ("mt5", lambda s: t5(s, "MT5Model")),
    "UMT5Model": ("umt5", lambda s: t5(s, "UMT5Model")),
    "T5EncoderModel": ("t5", lambda s: t5_encoder(s, "T5EncoderModel")),
    "MT5EncoderModel": ("mt5", lambda s: t5_encoder(s, "MT5EncoderModel")),
    "UMT5EncoderModel": ("umt5", lambda s: t5_encoder(s, "UMT5EncoderModel")),
    "WhisperForConditionalGeneration": ("whisper", whisper),
    "WhisperModel": ("whisper", whisper),
    "DeepseekV2ForCausalLM": ("deepseek_v2", lambda s: deepseek(s, "DeepseekV2ForCausalLM")),
    "DeepseekV3ForCausalLM": ("deepseek_v3", lambda s: deepseek(s, "DeepseekV3ForCausalLM")),
}

# The classes to try for a spec of each kind, most common first (a spec imported from HF names its own).
CANDIDATES: dict[str, tuple[str, ...]] = {
    "decoder": (
        "LlamaForCausalLM",
        "GPT2LMHeadModel",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Olmo2ForCausalLM",
        "OlmoeForCausalLM",
        "SmolLM3ForCausalLM",
        "Exaone4ForCausalLM",
        "CohereForCausalLM",
        "Cohere2ForCausalLM",
        "Starcoder2ForCausalLM",
        "GraniteForCausalLM",
        "Phi3ForCausalLM",
        "PhiForCausalLM",
        "GPTNeoXForCausalLM",
        "GPTJForCausalLM",
        "FalconForCausalLM",
        "BloomForCausalLM",
        "MptForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV2ForCausalLM",
        "OPTForCausalLM",
        "GptOssForCausalLM",
        "Llama4ForCausalLM",
    ),
    "encoder": (
        "BertForMaskedLM",
        "BertModel",
        "RobertaForMaskedLM",
        "RobertaModel",
        "DistilBertForMaskedLM",
        "DistilBertModel",
        "ModernBertForMaskedLM",
        "ModernBertModel",
        "CLIPTextModel",
        "CLIPTextModelWithProjection",
        "T5EncoderModel",
        "UMT5EncoderModel",
        "MT5EncoderModel",
    ),
    "vit": (
        "ViTForImageClassification",
        "ViTModel",
        "CLIPVisionModel",
        "CLIPVisionModelWithProjection",
        "SiglipVisionModel",
    ),
    "dual_encoder": ("CLIPModel", "SiglipModel"),
    "encoder_decoder": (
        "BartForConditionalGeneration",
        "MarianMTModel",
        "T5ForConditionalGeneration",
        "UMT5ForConditionalGeneration",
        "MT5ForConditionalGeneration",
        "T5Model",
        "UMT5Model",
        "MT5Model",
        "WhisperForConditionalGeneration",
        "WhisperModel",
    ),
}


def config(s: Any, arch: str) -> dict[str, Any]:
    """The config.json of ``s`` as HF class ``arch`` (raises ``Inexpressible``)."""
    model_type, write = WRITERS[arch]
    if s.kind == "encoder":
        head = "mlm" if arch.endswith("ForMaskedLM") else "none" if arch == "DistilBertModel" else "pooled"
        head = "eos" if arch.startswith("CLIPTextModel") else head
        head = "none" if arch == "ModernBertModel" or arch.endswith("T5EncoderModel") else head
        need(s.head == head, ("head",), f"a {s.head} head ({arch} has {head})")
    if s.kind == "vit":
        heads = {"ViTForImageClassification": "classifier", "ViTModel": "pooled", "CLIPVisionModel": "pooled_norm"}
        heads["CLIPVisionModelWithProjection"] = "pooled_norm"
        head = heads.get(arch, "attention_pool or none")  # SiglipVisionModel: vision_use_head
        need(s.head in head.split(" or "), ("head",), f"a {s.head} head ({arch} has {head})")
    if s.kind == "encoder_decoder":  # *Model: the decoder's states; *ForConditionalGeneration and the rest: logits
        head = "none" if arch in ("T5Model", "MT5Model", "UMT5Model", "WhisperModel") else "lm"
        need(s.head == head, ("head",), f"a {s.head} head ({arch} has {head})")
    if not arch.startswith("Whisper"):  # the one family with per-projection biases and audio input
        need(getattr(s, "audio", None) is None, ("audio",), "audio input (WhisperForConditionalGeneration reads it)")
        for key in ("q", "k", "v") if hasattr(s, "bias") else ():
            flag = getattr(s.bias, key, None)
            need(flag is None or flag == s.bias.qkv, ("bias", key), f"a {key} projection bias other than bias.qkv")
    body = write(s)
    dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[s.dtype]
    return {"architectures": [arch], "model_type": model_type, **body, "dtype": dtype}
