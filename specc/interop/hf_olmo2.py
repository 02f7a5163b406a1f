"""OLMo-2 (``Olmo2ForCausalLM``): config → decoder spec. Each sublayer's norm comes after it (x + norm(f(x))), and
q / k are RMS-normalised over their full projected width. Weights: hf_llama_weights.
"""

from __future__ import annotations

from typing import Any

from . import hf_decoder as dec
from . import hf_llama_weights
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    doc["attention"]["qk_norm"] = "full"
    bias = cfg.flag("attention_bias", False)
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "output", "eps": cfg.number("rms_norm_eps", 1e-5)},
        mlp=dec.swiglu(cfg),
        position=position(cfg),
        bias={"qkv": bias, "out": bias, "mlp": False, "norm": False, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    )
    return doc


FAMILY = Family(
    "OLMo-2",
    ("Olmo2ForCausalLM",),
    ("olmo2",),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
