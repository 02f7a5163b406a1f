"""GPT-J (``GPTJForCausalLM``): attention and MLP in parallel on one LayerNorm, RoPE on the first ``rotary_dim``
dims of each head in interleaved pairs (theta 10000), no q/k/v/out biases, an LM head with bias.
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


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    d, heads = cfg.positive_int("n_embd"), cfg.positive_int("n_head")
    rotary = cfg.optional_int("rotary_dim") or d // heads
    if rotary > d // heads or rotary % 2:
        raise cfg.refuse("rotary_dim", f"{rotary} must be even and at most head_dim {d // heads}")
    return {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("n_positions"),
        "d_model": d,
        "blocks": cfg.positive_int("n_layer"),
        "attention": {"heads": heads},
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_epsilon", 1e-5)},
        "parallel": "shared_norm",
        "mlp": {
            "type": "classic",
            "hidden": cfg.optional_int("n_inner") or 4 * d,
            "activation": cfg.activation("activation_function", "gelu_new"),
        },
        # GPT-J's sin/cos table has a fixed base of 10000 (its config has no RoPE base)
        "position": {"type": "rotary", "theta": 10000.0, "fraction": rotary / (d // heads), "rotation": "interleaved"},
        "bias": {"qkv": False, "out": False, "mlp": True, "norm": True, "head": True},
        "tie_embeddings": cfg.flag("tie_word_embeddings", False),
        **cfg.training(embedding="embd_pdrop", attention="attn_pdrop", residual="resid_pdrop"),
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(transformer\.)?h\.\d+\.attn\.q_proj\.weight", n) for n in names)


TABLE = Table(
    "GPT-J",
    {
        "lm_head.{k}": "lm_head.{k}",
        "embed.weight": "{p}wte.weight",
        "norm_f.{k}": "{p}ln_f.{k}",
        "blocks.*.norm1.{k}": "{p}h.*.ln_1.{k}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{{p}}h.*.attn.{x}_proj.{{k}}" for x in "qkv")),
        "blocks.*.attn.out.{k}": "{p}h.*.attn.out_proj.{k}",
        "blocks.*.mlp.fc1.{k}": "{p}h.*.mlp.fc_in.{k}",
        "blocks.*.mlp.fc2.{k}": "{p}h.*.mlp.fc_out.{k}",
    },
    prefix="transformer.",
    ignore=(r"\.attn\.(bias|masked_bias|embed_positions)$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}wte.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("GPT-J", ("GPTJForCausalLM",), ("gptj",), ("decoder",), spec, detect, plan)
