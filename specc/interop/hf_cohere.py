"""Cohere Command-R (``CohereForCausalLM``) and Command-R7B (``Cohere2ForCausalLM``): attention and SwiGLU MLP in
parallel on one bias-free LayerNorm, RoPE on adjacent pairs (interleaved), logits scaled by ``logit_scale``, tied
embeddings. Cohere2 alternates sliding layers (with RoPE) and full layers (with none). Weights: hf_llama_weights.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def _cohere2_layers(cfg: HFConfig, n: int) -> list[dec.Layer]:
    window = cfg.optional_int("sliding_window") if "sliding_window" in cfg.data else 4096
    if cfg.data.get("layer_types") is not None:
        cfg.ignore("sliding_window_pattern")  # HF reads it only to build layer_types
        types = dec.layer_types(cfg, [])
    else:  # the hub's dialect: every sliding_window_pattern-th layer is full
        every = cfg.positive_int("sliding_window_pattern", 4)
        types = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    cfg.ignore("cache_implementation")  # how generate stores the cache, not what it holds
    layers: list[dec.Layer] = []
    for t in types:
        kind, attention = dec.attention_kind(cfg, t, window)
        if kind == "sliding":  # HF rotates q/k only in the sliding layers
            layers.append(("sliding", {"attention": attention, "position": {"type": "rotary"}}))
        else:
            layers.append(("full_nope", {"position": {"type": "none"}}))
    return layers


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    if arch == "CohereForCausalLM" and cfg.flag("use_qk_norm", False):
        raise cfg.refuse("use_qk_norm", "per-head LayerNorm on q and k with weights per head is not supported")
    bias = cfg.flag("attention_bias", False)
    rope = position(cfg, theta=500000.0 if arch == "CohereForCausalLM" else 10000.0)
    doc.update(
        kind="decoder",
        norm={"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_eps", 1e-5)},
        parallel="shared_norm",
        mlp=dec.swiglu(cfg),
        position={**rope, "rotation": "interleaved"},
        bias={"qkv": bias, "out": bias, "mlp": False, "norm": False, "head": False},
        output={"scale": cfg.number("logit_scale", 0.0625)},
        tie_embeddings=cfg.flag("tie_word_embeddings", True),
        **cfg.training(attention="attention_dropout"),
    )
    if arch == "Cohere2ForCausalLM":
        return dec.per_layer(doc, _cohere2_layers(cfg, doc["blocks"]))
    return doc


FAMILY = Family(
    "Cohere",
    ("CohereForCausalLM", "Cohere2ForCausalLM"),
    ("cohere", "cohere2"),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
