"""OPT (``OPTForCausalLM``): a LayerNorm decoder (pre-norm, or post-norm with ``do_layer_norm_before: false``)
with ReLU MLPs, learned positions in a table with 2 leading rows (``position: {type: learned, offset: 2}``,
counted along attention_mask as every specc decoder does) and a tied head. Checkpoint names
``model.decoder.layers.{i}.self_attn.{q,k,v,out}_proj``, ``self_attn_layer_norm``, ``fc1 / fc2``,
``final_layer_norm``.
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

OPT_POSITION_OFFSET = 2  # transformers' OPTLearnedPositionalEmbedding.offset


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    d = cfg.positive_int("hidden_size")
    proj = cfg.get("word_embed_proj_dim", d)
    if proj != d:
        raise cfg.refuse(
            "word_embed_proj_dim", f"embeddings of width {proj!r} projected to hidden_size {d} are not supported"
        )
    cfg.expect("layer_norm_elementwise_affine", True, True, "LayerNorms without weights")
    pre = cfg.flag("do_layer_norm_before", True)
    final = pre and not cfg.flag("_remove_final_layer_norm", False)
    bias = cfg.flag("enable_bias", True)
    cfg.ignore("layerdrop", "pad_token_id")  # training-only; a row's gradient
    return {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings"),
        "d_model": d,
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": {"heads": cfg.positive_int("num_attention_heads")},
        "norm": {"type": "layernorm", "placement": "pre" if pre else "post", "eps": 1e-5, "final": final},
        "mlp": {
            "type": "classic",
            "hidden": cfg.positive_int("ffn_dim"),
            "activation": cfg.activation("activation_function", "relu"),
        },
        "position": {"type": "learned", "offset": OPT_POSITION_OFFSET},
        "bias": {"qkv": bias, "out": bias, "mlp": bias, "norm": True, "head": False},
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        **cfg.training(std="init_std", embedding="dropout", attention="attention_dropout", residual="dropout"),
    }


def detect(names: set[str]) -> bool:
    return any(
        re.fullmatch(r"(model\.)?decoder\.layers\.\d+\.self_attn_layer_norm\.weight", n) for n in names
    ) and not any(".encoder_attn." in n for n in names)


_L = "{p}decoder.layers.*."
TABLE = Table(
    "OPT",
    {
        "lm_head.weight": "lm_head.weight",
        "embed.weight": "{p}decoder.embed_tokens.weight",
        "pos.weight": "{p}decoder.embed_positions.weight",
        "norm_f.{k}": "{p}decoder.final_layer_norm.{k}",
        "blocks.*.norm1.{k}": f"{_L}self_attn_layer_norm.{{k}}",
        "blocks.*.norm2.{k}": f"{_L}final_layer_norm.{{k}}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{_L}self_attn.{x}_proj.{{k}}" for x in "qkv")),
        "blocks.*.attn.out.{k}": f"{_L}self_attn.out_proj.{{k}}",
        "blocks.*.mlp.fc1.{k}": f"{_L}fc1.{{k}}",
        "blocks.*.mlp.fc2.{k}": f"{_L}fc2.{{k}}",
    },
    prefix="model.",
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}decoder.embed_tokens.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("OPT", ("OPTForCausalLM",), ("opt",), ("decoder",), spec, detect, plan)
