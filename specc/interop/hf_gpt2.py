"""GPT-2 (``GPT2LMHeadModel``): config → decoder spec; ``transformer.h.{i}.*`` Conv1D weights → specc names."""

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

# specc name ← GPT-2 name (``transformer.`` in task models); Conv1D weights are stored [in, out]: transposed
TABLE = Table(
    "GPT-2",
    {
        "lm_head.weight": "lm_head.weight",
        "embed.weight": "{p}wte.weight",
        "pos.weight": "{p}wpe.weight",
        "norm_f.{k}": "{p}ln_f.{k}",
        "blocks.*.norm1.{k}": "{p}h.*.ln_1.{k}",
        "blocks.*.norm2.{k}": "{p}h.*.ln_2.{k}",
        "blocks.*.attn.qkv.weight": ("t", "{p}h.*.attn.c_attn.weight"),
        "blocks.*.attn.qkv.bias": "{p}h.*.attn.c_attn.bias",
        "blocks.*.attn.out.weight": ("t", "{p}h.*.attn.c_proj.weight"),
        "blocks.*.attn.out.bias": "{p}h.*.attn.c_proj.bias",
        "blocks.*.mlp.fc1.weight": ("t", "{p}h.*.mlp.c_fc.weight"),
        "blocks.*.mlp.fc1.bias": "{p}h.*.mlp.c_fc.bias",
        "blocks.*.mlp.fc2.weight": ("t", "{p}h.*.mlp.c_proj.weight"),
        "blocks.*.mlp.fc2.bias": "{p}h.*.mlp.c_proj.bias",
    },
    prefix="transformer.",
    ignore=(r"^{p}h\.\d+\.attn\.(bias|masked_bias)$",),  # causal-mask tables old checkpoints stored
)


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    d = cfg.positive_int("n_embd")
    cfg.expect("add_cross_attention", False, False, "cross-attention inside a decoder-only model")
    cfg.expect("scale_attn_by_inverse_layer_idx", False, False, "a per-layer attention scale")
    cfg.ignore("reorder_and_upcast_attn", "n_ctx")  # fp32 attention scores (numerics only); n_ctx: unread
    cfg.ignore(*(k for k in cfg.data if k.startswith("summary_")))  # GPT2DoubleHeadsModel only
    attention: dict[str, Any] = {"heads": cfg.positive_int("n_head")}
    if not cfg.flag("scale_attn_weights", True):
        attention["scale"] = 1.0
    return {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("n_positions"),
        "d_model": d,
        "blocks": cfg.positive_int("n_layer"),
        "attention": attention,
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_epsilon", 1e-5)},
        "mlp": {
            "type": "classic",
            "hidden": cfg.optional_int("n_inner") or 4 * d,
            "activation": cfg.activation("activation_function", "gelu_new"),
        },
        "position": "learned",
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": False},
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        **cfg.training(True, embedding="embd_pdrop", attention="attn_pdrop", residual="resid_pdrop"),
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(transformer\.)?h\.\d+\.attn\.c_attn\.weight", n) for n in names)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}wte.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("GPT-2", ("GPT2LMHeadModel",), ("gpt2",), ("decoder",), spec, detect, plan)
