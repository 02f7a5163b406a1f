"""Granite (``GraniteForCausalLM``): Llama with four multipliers — ``embedding_multiplier`` (``embedding_scale``),
``attention_multiplier`` (the score scale, ``attention.scale``), ``residual_multiplier`` (``residual_scale``: x +
m · f(x)) and ``logits_scaling`` (logits divided by it: ``output.scale`` = 1 / it). Weights: hf_llama_weights.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def _positive(cfg: HFConfig, key: str) -> float:
    value = cfg.number(key, 1.0)
    if value <= 0:
        raise cfg.refuse(key, f"expected a positive number, got {value!r}")
    return value


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    doc["attention"]["scale"] = _positive(cfg, "attention_multiplier")
    bias = cfg.flag("attention_bias", False)
    embed = _positive(cfg, "embedding_multiplier")
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-6)},
        mlp=dec.swiglu(cfg),
        position=position(cfg),
        bias={"qkv": bias, "out": bias, "mlp": cfg.flag("mlp_bias", False), "norm": False, "head": False},
        residual_scale=_positive(cfg, "residual_multiplier"),
        output={"scale": 1.0 / _positive(cfg, "logits_scaling")},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    )
    if embed != 1.0:
        doc["embedding_scale"] = embed
    return doc


FAMILY = Family(
    "Granite",
    ("GraniteForCausalLM",),
    ("granite",),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
