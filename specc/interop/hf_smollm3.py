"""SmolLM3 (``SmolLM3ForCausalLM``): Llama with NoPE layers — ``no_rope_layers`` (1: RoPE, 0: none; by default
every ``no_rope_layer_interval``-th layer has none) — and optional sliding layers. Weights: hf_llama_weights.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def rope_layers(cfg: HFConfig, n: int) -> list[bool]:
    """Which layers rotate q/k: ``no_rope_layers`` as given, else HF's interval rule."""
    flags = cfg.get("no_rope_layers")
    if flags is None:
        every = cfg.positive_int("no_rope_layer_interval", 4)
        return [(i + 1) % every != 0 for i in range(n)]
    cfg.ignore("no_rope_layer_interval")
    if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) or isinstance(f, bool) for f in flags):
        raise cfg.refuse("no_rope_layers", f"expected a list of {n} flags (1: RoPE, 0: none), one per layer")
    return [f == 1 for f in flags]


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    n = doc["blocks"]
    rope = rope_layers(cfg, n)
    use_window = cfg.flag("use_sliding_window", False)
    cfg.ignore("sliding_window")
    window = cfg.optional_int("sliding_window") if use_window else None
    default = ["sliding_attention" if window is not None and not r else "full_attention" for r in rope]
    types = dec.layer_types(cfg, default)
    layers: list[dec.Layer] = []
    for t, r in zip(types, rope, strict=True):
        # HF slides only where use_sliding_window is on, whatever layer_types says
        kind, attention = dec.attention_kind(cfg, t, window) if use_window else ("full", {})
        settings: dict[str, Any] = {"position": {"type": "rotary" if r else "none"}}
        if attention:
            settings["attention"] = attention
        layers.append((dec.name("rope" if r else "nope", kind if kind != "full" else ""), settings))
    bias = cfg.flag("attention_bias", False)
    mlp_bias = cfg.flag("mlp_bias", False)
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-6)},
        mlp=dec.swiglu(cfg),
        position=position(cfg, theta=2000000.0),
        bias={"qkv": bias, "out": bias, "mlp": mlp_bias, "norm": False, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", True),
        **cfg.training(attention="attention_dropout"),
    )
    return dec.per_layer(doc, layers)


FAMILY = Family(
    "SmolLM3",
    ("SmolLM3ForCausalLM",),
    ("smollm3",),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
