"""BLOOM (``BloomForCausalLM``): ALiBi positions (BLOOM's slope rule is ALiBi's with max_bias 8), a LayerNorm on
the embeddings, tanh-GELU MLPs of 4·d, biases everywhere and a fused ``query_key_value`` laid out per head
``[heads, 3, head_dim]``, reordered into specc's packed q/k/v.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import HFConfig
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan

# Megatron-DeepSpeed training switches BLOOM's configs carry; transformers reads none of them.
_MEGATRON = (
    "attention_softmax_in_fp32",
    "bias_dropout_fusion",
    "masked_softmax_fusion",
    "offset_alibi",
    "skip_bias_add",
    "skip_bias_add_qkv",
    "pretraining_tp",  # with slow_but_exact it only splits the output projection's sum into slices
    "slow_but_exact",
    "n_inner",  # transformers builds 4·hidden_size whatever it says
    "unk_token_id",
)


def _first(cfg: HFConfig, *keys: str) -> int:
    """The first of ``keys`` present (transformers' name, then the hub configs' older ones)."""
    for key in keys[:-1]:
        if cfg.get(key) is not None:
            cfg.ignore(*keys)
            return cfg.positive_int(key)
    return cfg.positive_int(keys[-1])


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    cfg.expect(
        "apply_residual_connection_post_layernorm", False, False, "residuals from the normed input are not supported"
    )
    cfg.ignore(*_MEGATRON)
    d = _first(cfg, "n_embed", "hidden_size")
    return {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("seq_length", 2048),  # ALiBi has no table: the length of analyses only
        "d_model": d,
        "blocks": _first(cfg, "num_hidden_layers", "n_layer"),
        "attention": {"heads": _first(cfg, "num_attention_heads", "n_head")},
        "norm": {
            "type": "layernorm",
            "placement": "pre",
            "eps": cfg.number("layer_norm_epsilon", 1e-5),
            "embedding": True,
        },
        "mlp": {"type": "classic", "hidden": 4 * d, "activation": "gelu_tanh"},
        "position": {"type": "alibi"},
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": False},
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        **cfg.training(attention="attention_dropout", residual="hidden_dropout"),
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(transformer\.)?word_embeddings_layernorm\.weight", n) for n in names)


TABLE = Table(
    "BLOOM",
    {
        "lm_head.{k}": "lm_head.{k}",
        "embed.weight": "{p}word_embeddings.weight",
        "embed_norm.{k}": "{p}word_embeddings_layernorm.{k}",
        "norm_f.{k}": "{p}ln_f.{k}",
        "blocks.*.norm1.{k}": "{p}h.*.input_layernorm.{k}",
        "blocks.*.norm2.{k}": "{p}h.*.post_attention_layernorm.{k}",
        "blocks.*.attn.qkv.{k}": (("regroup", "per_head"), "{p}h.*.self_attention.query_key_value.{k}"),
        "blocks.*.attn.out.{k}": "{p}h.*.self_attention.dense.{k}",
        "blocks.*.mlp.fc1.{k}": "{p}h.*.mlp.dense_h_to_4h.{k}",
        "blocks.*.mlp.fc2.{k}": "{p}h.*.mlp.dense_4h_to_h.{k}",
    },
    prefix="transformer.",
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}word_embeddings.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("BLOOM", ("BloomForCausalLM",), ("bloom",), ("decoder",), spec, detect, plan)
