"""Llama, Mistral and Mixtral (``*ForCausalLM``): config → decoder spec; split or fused q/k/v, per-expert
``w1/w2/w3`` (or fused ``gate_up_proj``) → specc's packed qkv and ``[E, out, in]`` expert tensors.
"""

from __future__ import annotations

import re
from typing import Any

from ..ir.graph import LayerGraph
from .family import BLOCK, Family, attention_sizes, prefix, rules_for
from .hf_config import HFConfig
from .plan import Plan, Rule, ShapeT, concat, copy, part, stacked
from .rope import rope_position

_NORMS = {"norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
_DENSE = {"mlp.gate": "gate_proj", "mlp.up": "up_proj", "mlp.down": "down_proj"}


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
        "dropout": {"attention": cfg.dropout("attention_dropout")},
        "init": {"std": cfg.number("initializer_range", 0.02), "scaled_residual": False},
    }


# ------------------------------------------------------------------------------------------------ weights


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.self_attn\.(q_proj|qkv_proj)\.weight", n) for n in names)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    p = prefix(names, "model.")

    def make(target: str, shape: ShapeT) -> Rule | list[Rule] | None:
        local, kind = target.rsplit(".", 1)
        if target == "lm_head.weight":
            return copy("lm_head.weight", shape)
        if local in ("embed", "norm_f"):
            return copy(f"{p}{'embed_tokens' if local == 'embed' else 'norm'}.{kind}", shape)
        m = BLOCK.fullmatch(local)
        if not m:
            return None
        hf, part_name = f"{p}layers.{m.group(2)}", m.group(3)
        if part_name in _NORMS:
            return copy(f"{hf}.{_NORMS[part_name]}.{kind}", shape)
        if part_name == "attn.qkv":
            sizes = attention_sizes(g, target)
            split = [f"{hf}.self_attn.{x}_proj.{kind}" for x in "qkv"]
            return [concat(split, shape, sizes), copy(f"{hf}.self_attn.qkv_proj.{kind}", shape)]
        if part_name == "attn.out":
            return copy(f"{hf}.self_attn.o_proj.{kind}", shape)
        if part_name in _DENSE:
            rules = [copy(f"{hf}.mlp.{_DENSE[part_name]}.{kind}", shape)]
            if part_name != "mlp.down":  # Phi-3 style fused [gate | up]
                fused = (2 * shape[0], *shape[1:])
                rules.append(part(f"{hf}.mlp.gate_up_proj.{kind}", shape, fused, 0, shape[0] * (part_name == "mlp.up")))
            return rules
        if part_name == "mlp.router":
            return [copy(f"{hf}.block_sparse_moe.gate.weight", shape), copy(f"{hf}.mlp.gate.weight", shape)]
        if part_name == "mlp.experts":
            return _experts(hf, kind, shape)
        return None

    tied = g.op("lm_head").attrs.get("tied_to")
    return Plan(
        "Llama" if not any("experts" in t for t in g.params()) else "Mixtral",
        rules_for(g, "Llama/Mixtral", make),
        tied=[(f"{p}embed_tokens.weight", "lm_head.weight")] if tied else [],
        ignore=lambda n: n.endswith("rotary_emb.inv_freq"),
    )


def _experts(hf: str, kind: str, shape: ShapeT) -> list[Rule] | None:
    """``w_gate``/``w_up``/``w_down`` [E, out, in] from per-expert w1/w3/w2 or transformers-5 fused tensors."""
    e = shape[0]
    legacy = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}.get(kind)
    if legacy is None:
        return None
    rules = [stacked([f"{hf}.block_sparse_moe.experts.{j}.{legacy}.weight" for j in range(e)], shape)]
    if kind == "w_down":
        rules.append(copy(f"{hf}.mlp.experts.down_proj", shape))
    else:
        fused = (e, 2 * shape[1], shape[2])
        rules.append(part(f"{hf}.mlp.experts.gate_up_proj", shape, fused, 1, shape[1] * (kind == "w_up")))
    return rules


FAMILY = Family(
    "Llama",
    ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"),
    ("llama", "mistral", "mixtral"),
    ("decoder",),
    spec,
    detect,
    plan,
)
