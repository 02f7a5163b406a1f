"""Falcon (``FalconForCausalLM``): 7B-style multi-query attention with attention and MLP in parallel on one
LayerNorm, or 40B-style ``new_decoder_architecture`` with ``num_kv_heads`` groups and two norms (``ln_attn``,
``ln_mlp``). The fused ``query_key_value`` (per KV group ``[q.., k, v]``) is reordered into specc's packed
q/k/v. Falcon-RW's ``alibi`` adds ALiBi (BLOOM's slopes) scaled with the scores by 1/√head_dim, in place of RoPE.
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


def _layout(cfg: HFConfig) -> tuple[str, dict[str, Any]]:
    """(parallel mode, attention heads) from Falcon's architecture flags."""
    heads = cfg.positive_int("num_attention_heads")
    new = cfg.flag("new_decoder_architecture", False)
    parallel = cfg.flag("parallel_attn", True)
    kv = cfg.positive_int("num_kv_heads", heads) if cfg.get("num_kv_heads") is not None else heads
    if new:
        if not parallel:
            raise cfg.refuse("parallel_attn", "false with new_decoder_architecture builds no layer norms in HF")
        norms = cfg.get("num_ln_in_parallel_attn") or 2
        if norms not in (1, 2):
            raise cfg.refuse("num_ln_in_parallel_attn", f"expected 1 or 2, got {norms!r}")
        cfg.ignore("multi_query")  # the new architecture reads num_kv_heads instead
        return ("separate_norms" if norms == 2 else "shared_norm"), {"heads": heads, "kv_heads": kv}
    cfg.ignore("num_ln_in_parallel_attn")  # read by the new architecture only
    if cfg.flag("multi_query", True):
        return ("shared_norm" if parallel else "none"), {"heads": heads, "kv_heads": 1}
    if kv != heads:
        raise cfg.refuse("num_kv_heads", f"{kv} with multi-head attention; HF splits q/k/v per head ({heads})")
    return ("shared_norm" if parallel else "none"), {"heads": heads, "kv_heads": heads}


def _position(cfg: HFConfig) -> dict[str, Any]:
    if not cfg.flag("alibi", False):
        return position(cfg)
    cfg.ignore("rope_theta", "rope_scaling", "rope_parameters")  # no RoPE in an ALiBi model
    return {"type": "alibi", "scaled": True, "bias_dtype": "bf16"}  # its code rounds slope · position to bf16


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    d = cfg.positive_int("hidden_size")
    parallel, attention = _layout(cfg)
    bias = cfg.flag("bias", False)
    doc: dict[str, Any] = {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings", 2048),  # the hub's Falcon configs omit it
        "d_model": d,
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": attention,
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_epsilon", 1e-5)},
        "mlp": {
            "type": "classic",
            "hidden": cfg.optional_int("ffn_hidden_size") or 4 * d,
            "activation": cfg.activation("activation", "gelu"),
        },
        "position": _position(cfg),
        "bias": {"qkv": bias, "out": bias, "mlp": bias, "norm": True, "head": False},
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        **cfg.training(attention="attention_dropout", residual="hidden_dropout"),
    }
    if parallel != "none":
        doc["parallel"] = parallel
    return doc


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(transformer\.)?h\.\d+\.self_attention\.query_key_value\.weight", n) for n in names)


TABLE = Table(
    "Falcon",
    {
        "lm_head.{k}": "lm_head.{k}",
        "embed.weight": "{p}word_embeddings.weight",
        "norm_f.{k}": "{p}ln_f.{k}",
        # per KV group [q.., k, v]: with one group (multi-query) that is specc's order, with a group per head
        # (multi-head) it is the per-head layout [q_h, k_h, v_h]
        "blocks.*.attn.qkv.{k}": (("regroup", "per_group"), "{p}h.*.self_attention.query_key_value.{k}"),
        "blocks.*.attn.out.{k}": "{p}h.*.self_attention.dense.{k}",
        "blocks.*.mlp.fc1.{k}": "{p}h.*.mlp.dense_h_to_4h.{k}",
        "blocks.*.mlp.fc2.{k}": "{p}h.*.mlp.dense_4h_to_h.{k}",
        "blocks.*.norm1.{k}": ["{p}h.*.input_layernorm.{k}", "{p}h.*.ln_attn.{k}"],
        "blocks.*.norm2.{k}": ["{p}h.*.post_attention_layernorm.{k}", "{p}h.*.ln_mlp.{k}"],
    },
    prefix="transformer.",
    ignore=(r"rotary_emb\.inv_freq$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}word_embeddings.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("Falcon", ("FalconForCausalLM",), ("falcon",), ("decoder",), spec, detect, plan)
