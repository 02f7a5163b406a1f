"""StarCoder2 (``Starcoder2ForCausalLM``): a pre-LayerNorm decoder with a classic GELU MLP (``mlp.c_fc`` /
``mlp.c_proj``), biases on every projection (``use_bias``), GQA, RoPE and an optional sliding window on every
layer. Weights: hf_llama_weights (Llama's attention and norm names).
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
    window = cfg.optional_int("sliding_window")
    if window is not None:
        doc["attention"].update(dec.attention_kind(cfg, "sliding_attention", window)[1])
    bias = cfg.flag("use_bias", True)
    doc.update(
        kind="decoder",
        norm={"type": "layernorm", "placement": "pre", "eps": cfg.number("norm_epsilon", 1e-5)},
        mlp={
            "type": "classic",
            "hidden": cfg.positive_int("intermediate_size"),
            "activation": cfg.activation("hidden_act", "gelu_pytorch_tanh"),
        },
        position=position(cfg),
        # the LayerNorms keep their bias whatever use_bias says
        bias={"qkv": bias, "out": bias, "mlp": bias, "norm": True, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", True),
        **cfg.training(
            std_default=0.018042,
            embedding="embedding_dropout",
            attention="attention_dropout",
            residual="residual_dropout",
        ),
    )
    return doc


FAMILY = Family(
    "StarCoder2",
    ("Starcoder2ForCausalLM",),
    ("starcoder2",),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
