"""Phi-1/1.5/2 (``PhiForCausalLM``): attention and MLP in parallel on one LayerNorm, partial rotary, biases on
every projection and on the LM head. Checkpoint names ``model.layers.{i}.self_attn.{q,k,v}_proj / dense``,
``mlp.fc1 / fc2``, ``model.final_layernorm``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from . import hf_decoder as dec
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    cfg.expect("qk_layernorm", False, False, "LayerNorm on q and k (specc's QK-norm is RMSNorm)")
    doc.update(
        kind="decoder",
        norm={"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_eps", 1e-5)},
        parallel="shared_norm",
        mlp={
            "type": "classic",
            "hidden": cfg.positive_int("intermediate_size"),
            "activation": cfg.activation("hidden_act", "gelu_new"),
        },
        position=position(cfg, partial=True),
        bias={"qkv": True, "out": True, "mlp": True, "norm": True, "head": True},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(embedding="embd_pdrop", attention="attention_dropout", residual="resid_pdrop"),
    )
    return doc


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.self_attn\.dense\.weight", n) for n in names)


TABLE = Table(
    "Phi",
    {
        "lm_head.{k}": "lm_head.{k}",
        "embed.weight": "{p}embed_tokens.weight",
        "norm_f.{k}": "{p}final_layernorm.{k}",
        "blocks.*.norm1.{k}": "{p}layers.*.input_layernorm.{k}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{{p}}layers.*.self_attn.{x}_proj.{{k}}" for x in "qkv")),
        "blocks.*.attn.out.{k}": "{p}layers.*.self_attn.dense.{k}",
        "blocks.*.mlp.fc1.{k}": "{p}layers.*.mlp.fc1.{k}",
        "blocks.*.mlp.fc2.{k}": "{p}layers.*.mlp.fc2.{k}",
    },
    prefix="model.",
    ignore=(r"rotary_emb\.inv_freq$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}embed_tokens.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("Phi", ("PhiForCausalLM",), ("phi",), ("decoder",), spec, detect, plan)
