"""OLMoE (``OlmoeForCausalLM``): a pre-RMSNorm decoder whose q / k are RMS-normalised over their full projected
width (as OLMo-2's), with a softmax-top-k MoE in every layer. Weights: hf_llama_weights (``mlp.gate`` router,
``mlp.experts.*`` experts).
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
    if cfg.get("clip_qkv") is not None:
        raise cfg.refuse("clip_qkv", "clamping q, k and v (clip_qkv) is not supported")
    cfg.ignore("output_router_logits")
    bias = cfg.flag("attention_bias", False)
    # transformers saves num_experts under its attribute_map alias num_local_experts when a config sets that
    key = "num_local_experts" if cfg.data.get("num_local_experts") is not None else "num_experts"
    cfg.ignore("num_experts", "num_local_experts")
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-5)},
        mlp={
            "type": "moe",
            "experts": cfg.positive_int(key, 64),
            "active": cfg.positive_int("num_experts_per_tok", 8),
            "expert": "swiglu",
            "hidden": cfg.positive_int("intermediate_size"),
            "activation": cfg.activation("hidden_act", "silu"),
            "router": {
                "normalize": cfg.flag("norm_topk_prob", False),
                "aux_loss_coef": cfg.number("router_aux_loss_coef", 0.01),
            },
        },
        position=position(cfg),
        bias={"qkv": bias, "out": bias, "mlp": False, "norm": False, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    )
    return doc


FAMILY = Family(
    "OLMoE",
    ("OlmoeForCausalLM",),
    ("olmoe",),
    ("decoder",),
    spec,
    hf_llama_weights.detect,
    hf_llama_weights.plan,
)
