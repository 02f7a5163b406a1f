"""Llama, Mistral and Mixtral (``*ForCausalLM``): config → decoder spec (weights: hf_llama_weights)."""

from __future__ import annotations

from typing import Any

from .family import Family
from .hf_config import HFConfig
from .hf_llama_weights import detect, plan

# ------------------------------------------------------------------------------------------------ config


def _rotary(cfg: HFConfig) -> dict[str, Any]:
    """RoPE from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (4.x)."""
    params = cfg.mapping("rope_parameters")
    key = "rope_parameters"
    if params is None:
        params = dict(cfg.mapping("rope_scaling") or {})
        key = "rope_scaling"
        params.setdefault("rope_theta", cfg.number("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise cfg.refuse(f"{key}.rope_type", f"expected a name, got {kind!r}")
    if kind != "default":
        raise cfg.refuse(
            f"{key}.rope_type",
            f"RoPE scaling {kind!r} is not supported (specc's rotary has only base theta and a rotated fraction)",
            "only rope_type 'default' imports exactly",
        )
    extra = set(params) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
    if extra:
        raise cfg.refuse(f"{key}.{sorted(extra)[0]}", "this RoPE parameter has no counterpart in specc")
    fraction = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if fraction != 1.0:  # Llama-family attention rotates whole heads; a partial factor is not checked against HF
        raise cfg.refuse("partial_rotary_factor", f"{fraction!r} is not supported for this family; only 1.0 is")
    theta = params.get("rope_theta", 10000.0)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not 0 < theta < float("inf"):
        raise cfg.refuse(f"{key}.rope_theta", f"expected a positive number, got {theta!r}", "e.g. 10000.0")
    return {"type": "rotary", "theta": float(theta)}


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    moe = arch == "MixtralForCausalLM"
    d, heads = cfg.positive_int("hidden_size"), cfg.positive_int("num_attention_heads")
    hd = cfg.optional_int("head_dim") or d // heads
    context = cfg.positive_int("max_position_embeddings")
    cfg.ignore("pretraining_tp", "output_router_logits")  # tp slicing computes the same product
    attention: dict[str, Any] = {"heads": heads, "kv_heads": cfg.positive_int("num_key_value_heads", heads)}
    if hd * heads != d or d % heads:
        attention["head_dim"] = hd
    window = cfg.optional_int("sliding_window") if cfg.flag("use_sliding_window", True) else None
    cfg.ignore("max_window_layers")
    if window is not None and window < context:
        attention.update(mask="sliding_window", window=int(window))
    bias = cfg.flag("attention_bias", False)
    act = cfg.activation("hidden_act", "silu")
    hidden = cfg.positive_int("intermediate_size")
    mlp: dict[str, Any] = {"type": "swiglu", "hidden": hidden, "activation": act}
    if moe:
        mlp = {
            "type": "moe",
            "experts": cfg.positive_int("num_local_experts"),
            "active": cfg.positive_int("num_experts_per_tok"),
            "expert": "swiglu",
            "hidden": hidden,
            "activation": act,
            "router": {
                "normalize": True,  # Mixtral renormalises the top-k softmax weights
                "aux_loss_coef": cfg.number("router_aux_loss_coef", 0.001),
                "jitter": cfg.number("router_jitter_noise", 0.0),
            },
        }
    return {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": context,
        "d_model": d,
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": attention,
        "norm": {"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-6)},
        "mlp": mlp,
        "position": _rotary(cfg),
        "bias": {"qkv": bias, "out": bias, "mlp": cfg.flag("mlp_bias", False), "norm": False, "head": False},
        "tie_embeddings": cfg.flag("tie_word_embeddings", False),
        "dropout": {"attention": cfg.dropout("attention_dropout")},
        "init": {"std": cfg.number("initializer_range", 0.02), "scaled_residual": False},
    }


FAMILY = Family(
    "Llama",
    ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"),
    ("llama", "mistral", "mixtral"),
    ("decoder",),
    spec,
    detect,
    plan,
)
