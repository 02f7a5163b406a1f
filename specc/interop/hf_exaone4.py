"""EXAONE 4 (``Exaone4ForCausalLM``): each sublayer's RMSNorm after it (x + norm(f(x)), as OLMo-2), per-head
QK-norm, and hybrid attention: sliding layers with RoPE, full layers with none (NoPE) — or RoPE everywhere when
no sliding window is set. Weights: hf_llama_weights.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def _default_types(cfg: HFConfig, n: int, window: int | None) -> list[str]:
    """HF's rule when config.json has no ``layer_types``: every ``sliding_window_pattern``-th layer is full."""
    if window is None:
        cfg.ignore("sliding_window_pattern")
        return ["full_attention"] * n
    every = cfg.positive_int("sliding_window_pattern", 4)
    return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    doc["attention"]["qk_norm"] = "head"
    n = doc["blocks"]
    window = cfg.optional_int("sliding_window") if "sliding_window" in cfg.data else 4096
    cfg.ignore("sliding_window")
    if cfg.data.get("layer_types") is not None:
        cfg.ignore("sliding_window_pattern")  # HF reads it only to build layer_types
        types = dec.layer_types(cfg, [])
    else:
        types = _default_types(cfg, n, window)
    layers: list[dec.Layer] = []
    for t in types:
        kind, attention = dec.attention_kind(cfg, t, window)
        rope = window is None or kind == "sliding"
        settings: dict[str, Any] = {"position": {"type": "rotary" if rope else "none"}}
        if attention:
            settings["attention"] = attention
        layers.append((kind if rope else f"{kind}_nope", settings))
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "output", "eps": cfg.number("rms_norm_eps", 1e-5)},
        mlp=dec.swiglu(cfg),
        position=position(cfg),
        bias={"qkv": False, "out": False, "mlp": False, "norm": False, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    )
    return dec.per_layer(doc, layers)


FAMILY = Family(
    "EXAONE 4",
    ("Exaone4ForCausalLM",),
    ("exaone4",),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
