"""Qwen2, Qwen2-MoE, Qwen3 and Qwen3-MoE (``Qwen*ForCausalLM``): config → decoder spec. Their checkpoints use
Llama's tensor names (plus ``q_norm``/``k_norm`` and the MoE's ``shared_expert``), so hf_llama's plan loads them.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def _sliding_rule(cfg: HFConfig, arch: str, n: int) -> tuple[list[str], int | None]:
    """HF's own per-layer rule (transformers 5) when config.json has no ``layer_types``, and the window."""
    use = cfg.flag("use_sliding_window", False)
    cfg.ignore("sliding_window")  # read only when used: Qwen2-MoE saves 0, the others null, when it is off
    window = cfg.optional_int("sliding_window") if use else None
    if arch == "Qwen3MoeForCausalLM":  # the window applies to every layer; max_window_layers is never read
        cfg.ignore("max_window_layers")
        return ["sliding_attention" if window is not None else "full_attention"] * n, window
    first = cfg.get("max_window_layers", 28)
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
        raise cfg.refuse("max_window_layers", f"expected a whole number ≥ 0, got {first!r}")
    if arch == "Qwen2MoeForCausalLM":  # every other layer below max_window_layers
        sliding = [use and i % 2 == 0 and i < first for i in range(n)]
    else:  # Qwen2, Qwen3: the layers from max_window_layers on
        sliding = [window is not None and i >= first for i in range(n)]
    return ["sliding_attention" if s else "full_attention" for s in sliding], window


def _experts(cfg: HFConfig, arch: str) -> int:
    """The routed experts: hub configs say num_experts, transformers 5 saves Qwen3-MoE's as num_local_experts
    (its attribute_map); absent, HF's class default."""
    key = "num_local_experts" if cfg.data.get("num_local_experts") is not None else "num_experts"
    cfg.ignore("num_experts", "num_local_experts")
    value = cfg.get(key, 128 if arch == "Qwen3MoeForCausalLM" else 60)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise cfg.refuse(key, f"expected a whole number ≥ 0, got {value!r}")
    return value


def _sparse(cfg: HFConfig, arch: str, n: int) -> list[bool]:
    """Which layers are MoE: not in ``mlp_only_layers``, and every ``decoder_sparse_step``-th layer."""
    step = cfg.positive_int("decoder_sparse_step", 1)
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in only):
        raise cfg.refuse("mlp_only_layers", "expected a list of layer indices")
    experts = _experts(cfg, arch)
    return [i not in only and experts > 0 and (i + 1) % step == 0 for i in range(n)]


def _moe(cfg: HFConfig, arch: str, act: str) -> dict[str, Any]:
    mlp: dict[str, Any] = {
        "type": "moe",
        "experts": _experts(cfg, arch),
        "active": cfg.positive_int("num_experts_per_tok"),
        "expert": "swiglu",
        "hidden": cfg.positive_int("moe_intermediate_size"),
        "activation": act,
        "router": {
            "normalize": cfg.flag("norm_topk_prob", arch == "Qwen3MoeForCausalLM"),
            "aux_loss_coef": cfg.number("router_aux_loss_coef", 0.001),
        },
    }
    if arch == "Qwen2MoeForCausalLM":
        mlp["shared"] = {"hidden": cfg.positive_int("shared_expert_intermediate_size"), "gate": "sigmoid"}
    return mlp


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    moe = arch.endswith("MoeForCausalLM")
    qwen3 = arch.startswith("Qwen3")
    doc = dec.sizes(cfg)
    n = doc["blocks"]
    act = cfg.activation("hidden_act", "silu")
    cfg.ignore("output_router_logits")
    cfg.expect("use_mrope", False, False, "multimodal RoPE sections (Qwen2-VL)")
    if qwen3:
        bias = cfg.flag("attention_bias", False)
        qkv, out = bias, bias
        doc["attention"]["qk_norm"] = "head"
    else:  # Qwen2 always has q/k/v biases (Qwen2-MoE: qkv_bias) and never an output bias
        qkv, out = cfg.flag("qkv_bias", True) if moe else True, False
    default, window = _sliding_rule(cfg, arch, n)
    # Qwen3-MoE's modeling never reads layer_types (left unread: listed as unknown if a config has one)
    types = default if arch == "Qwen3MoeForCausalLM" else dec.layer_types(cfg, default)
    sparse = _sparse(cfg, arch, n) if moe else [False] * n
    dense_mlp = {"type": "swiglu", "hidden": cfg.positive_int("intermediate_size"), "activation": act}
    mlp = _moe(cfg, arch, act) if any(sparse) else dense_mlp
    mixed_attention = len(set(types)) > 1
    layers: list[dec.Layer] = []
    for t, s in zip(types, sparse, strict=True):
        kind, attention = dec.attention_kind(cfg, t, window)
        settings: dict[str, Any] = {"attention": attention} if attention else {}
        if any(sparse) and not s:
            settings["mlp"] = dense_mlp
        layers.append((dec.name(kind if mixed_attention else "", "dense" if settings.get("mlp") else ""), settings))
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-6)},
        mlp=mlp,
        position=position(cfg),
        bias={"qkv": qkv, "out": out, "mlp": False, "norm": False, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    )
    return dec.per_layer(doc, layers)


FAMILY = Family(
    "Qwen",
    ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
    ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
