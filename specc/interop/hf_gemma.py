"""Gemma 1/2/3 text (``Gemma*ForCausalLM``): config → decoder spec. RMSNorm with a (1 + w) weight, GeGLU with
tanh-gelu, embeddings × √d in the model's dtype, head_dim independent of D/H; Gemma 2/3 add sandwich norms,
a score scale from ``query_pre_attn_scalar``, logit softcapping and sliding / full layers (``layer_types``);
Gemma 3 adds QK-norm and a local RoPE base for its sliding layers. Weights: hf_llama_weights.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def _activation(cfg: HFConfig, arch: str) -> str:
    if arch == "GemmaForCausalLM":
        # transformers reads Gemma 1's hidden_act, and takes its legacy "gelu" for the tanh approximation it
        # was trained with; hidden_activation is never read
        cfg.ignore("hidden_activation")
        if cfg.get("hidden_act", "gelu_pytorch_tanh") == "gelu":
            return "gelu_tanh"
        return cfg.activation("hidden_act", "gelu_pytorch_tanh")
    cfg.ignore("hidden_act")  # Gemma 2/3 read hidden_activation only
    return cfg.activation("hidden_activation", "gelu_pytorch_tanh")


def _layer_types(cfg: HFConfig, arch: str, n: int) -> list[str]:
    """Gemma 2 alternates sliding / full; Gemma 3 has ``sliding_window_pattern`` - 1 sliding layers per full one."""
    every = 2 if arch == "Gemma2ForCausalLM" else cfg.positive_int("sliding_window_pattern", 6)
    default = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    return dec.layer_types(cfg, default)


def _gemma3_rope(cfg: HFConfig, layer_type: str) -> dict[str, Any]:
    """Gemma 3's RoPE of one layer type: transformers 5 writes ``rope_parameters`` per layer type; the hub's
    configs give the full layers ``rope_theta`` + ``rope_scaling`` and the sliding ones ``rope_local_base_freq``
    (default 10000) unscaled."""
    if cfg.get("rope_parameters") is not None:
        return position(cfg, layer_type)
    if layer_type == "full_attention":
        return position(cfg)
    return {"type": "rotary", "theta": cfg.number("rope_local_base_freq", 10000.0)}


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    doc["attention"].setdefault("head_dim", cfg.positive_int("head_dim", 256))
    cfg.expect("use_bidirectional_attention", (False, None), None, "bidirectional attention in a causal LM")
    bias = cfg.flag("attention_bias", False)
    norm: dict[str, Any] = {"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-6)}
    norm["unit_offset"] = True
    layers: list[dec.Layer] = [("block", {})] * doc["blocks"]
    if arch != "GemmaForCausalLM":
        norm["placement"] = "sandwich"
        doc["attention"]["scale"] = cfg.positive_int("query_pre_attn_scalar", 256) ** -0.5
        softcap = cfg.get("attn_logit_softcapping", 50.0 if arch == "Gemma2ForCausalLM" else None)
        if softcap is not None:
            doc["attention"]["softcap"] = cfg.number("attn_logit_softcapping", 50.0)
        final = cfg.get("final_logit_softcapping", 30.0 if arch == "Gemma2ForCausalLM" else None)
        if final is not None:
            doc["output"] = {"softcap": cfg.number("final_logit_softcapping", 30.0)}
        cfg.ignore("cache_implementation")  # generation's cache class (hybrid): the function is unchanged
        window = cfg.optional_int("sliding_window")
        layers = []
        for t in _layer_types(cfg, arch, doc["blocks"]):
            kind, attention = dec.attention_kind(cfg, t, window)
            settings: dict[str, Any] = {"attention": attention} if attention else {}
            if arch == "Gemma3ForCausalLM":
                settings["position"] = _gemma3_rope(cfg, t)
            layers.append((kind, settings))
    if arch == "Gemma3ForCausalLM":
        doc["attention"]["qk_norm"] = "head"
    doc.update(
        kind="decoder",
        norm=norm,
        mlp={"type": "swiglu", "hidden": cfg.positive_int("intermediate_size"), "activation": _activation(cfg, arch)},
        position=_gemma3_rope(cfg, "full_attention") if arch == "Gemma3ForCausalLM" else position(cfg),
        bias={"qkv": bias, "out": bias, "mlp": False, "norm": False, "head": False},
        embedding_scale="sqrt_d_model",
        tie_embeddings=cfg.flag("tie_word_embeddings", True),
        **cfg.training(attention="attention_dropout"),
    )
    return dec.per_layer(doc, _without_top(layers, doc["position"]))


def _without_top(layers: list[dec.Layer], top: dict[str, Any]) -> list[dec.Layer]:
    """Per-kind positions as the keys that differ from the top level's (a kind's position is merged onto it;
    a key the kind lacks, such as the full layers' scaling, is reset to null)."""
    out: list[dec.Layer] = []
    for kind, settings in layers:
        if "position" in settings:
            own = settings["position"]
            diff = {k: own.get(k) for k in {**top, **own} if own.get(k) != top.get(k)}
            settings = {k: v for k, v in settings.items() if k != "position"} | ({"position": diff} if diff else {})
        out.append((kind, settings))
    return out


FAMILY = Family(
    "Gemma",
    ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"),
    ("gemma", "gemma2", "gemma3_text"),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
