"""GPT-NeoX / Pythia (``GPTNeoXForCausalLM``): LayerNorms with bias, partial rotary (``rotary_pct``), attention
and MLP in parallel on two norms (``use_parallel_residual``), and a fused ``query_key_value`` laid out per head
``[heads, 3, head_dim]``, reordered into specc's packed q/k/v.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan


def _rotary(cfg: HFConfig) -> dict[str, Any]:
    """transformers 5 writes rope_parameters; the hub's configs name the base and fraction rotary_emb_base and
    rotary_pct (defaults 10000 and 0.25, as transformers reads them)."""
    if cfg.get("rope_parameters") is not None or cfg.get("rope_scaling") is not None:
        return position(cfg, partial=True)
    out = {"type": "rotary", "theta": cfg.number("rotary_emb_base", 10000.0)}
    fraction = cfg.number("rotary_pct", 0.25)
    if not 0 < fraction <= 1:
        raise cfg.refuse("rotary_pct", f"expected a fraction in (0, 1], got {fraction!r}")
    return out | ({"fraction": fraction} if fraction != 1.0 else {})


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    d, heads = cfg.positive_int("hidden_size"), cfg.positive_int("num_attention_heads")
    cfg.ignore("is_decoder")
    bias = cfg.flag("attention_bias", True)
    doc: dict[str, Any] = {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings"),
        "d_model": d,
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": {"heads": heads},
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_eps", 1e-5)},
        "mlp": {
            "type": "classic",
            "hidden": cfg.positive_int("intermediate_size"),
            "activation": cfg.activation("hidden_act", "gelu"),
        },
        "position": _rotary(cfg),
        "bias": {"qkv": bias, "out": bias, "mlp": True, "norm": True, "head": False},
        "tie_embeddings": cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout", residual="hidden_dropout"),
    }
    if cfg.flag("use_parallel_residual", True):
        doc["parallel"] = "separate_norms"
    return doc


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(gpt_neox\.)?layers\.\d+\.attention\.query_key_value\.weight", n) for n in names)


TABLE = Table(
    "GPT-NeoX",
    {
        "lm_head.{k}": ["lm_head.{k}", "embed_out.{k}"],  # embed_out before transformers 5
        "embed.weight": "{p}embed_in.weight",
        "norm_f.{k}": "{p}final_layer_norm.{k}",
        "blocks.*.norm1.{k}": "{p}layers.*.input_layernorm.{k}",
        "blocks.*.norm2.{k}": "{p}layers.*.post_attention_layernorm.{k}",
        "blocks.*.attn.qkv.{k}": (("regroup", "per_head"), "{p}layers.*.attention.query_key_value.{k}"),
        "blocks.*.attn.out.{k}": "{p}layers.*.attention.dense.{k}",
        "blocks.*.mlp.fc1.{k}": "{p}layers.*.mlp.dense_h_to_4h.{k}",
        "blocks.*.mlp.fc2.{k}": "{p}layers.*.mlp.dense_4h_to_h.{k}",
    },
    prefix="gpt_neox.",
    # rotary tables and the causal-mask buffers older checkpoints stored
    ignore=(r"\.(rotary_emb\.inv_freq|attention\.bias|attention\.masked_bias)$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}embed_in.weight", "lm_head.weight", "embed_out.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("GPT-NeoX", ("GPTNeoXForCausalLM",), ("gpt_neox",), ("decoder",), spec, detect, plan)
