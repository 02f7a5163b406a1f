"""Llama, Mistral and Mixtral (``*ForCausalLM``): config → decoder spec (weights: hf_llama_weights)."""

from __future__ import annotations

from typing import Any

from .family import Family
from .hf_config import HFConfig
from .hf_llama_weights import detect, plan
from .rope_config import rope_position

# ------------------------------------------------------------------------------------------------ config


def _rotary(cfg: HFConfig) -> dict[str, Any]:
    """RoPE (any scaling type, both config dialects) from ``rope_position``; Llama rotates whole heads."""
    position = rope_position(cfg)
    if position.get("fraction", 1.0) != 1.0:  # Llama-family attention rotates whole heads; not checked against HF
        raise cfg.refuse("partial_rotary_factor", f"{position['fraction']!r} is not supported for this family")
    return position


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
        **cfg.training(attention="attention_dropout"),
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
