"""Phi-1/1.5/2 (``PhiForCausalLM``): attention and MLP in parallel on one LayerNorm, partial rotary, biases on
every projection and on the LM head. Checkpoint names ``model.layers.{i}.self_attn.{q,k,v}_proj / dense``,
``mlp.fc1 / fc2``, ``model.final_layernorm``.
"""

from __future__ import annotations

import re
from typing import Any

from ..ir.graph import LayerGraph
from . import hf_decoder as dec
from .family import BLOCK, Family, attention_sizes, prefix, rules_for
from .hf_config import HFConfig
from .hf_rope import position
from .weight_map import Plan, Rule, ShapeT, concat, copy

_BLOCK = {"norm1": "input_layernorm", "attn.out": "self_attn.dense", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}


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
        dropout={
            "embedding": cfg.dropout("embd_pdrop"),
            "attention": cfg.dropout("attention_dropout"),
            "residual": cfg.dropout("resid_pdrop"),
        },
        init={"std": cfg.number("initializer_range", 0.02), "scaled_residual": False},
    )
    return doc


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.self_attn\.dense\.weight", n) for n in names)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    p = prefix(names, "model.")

    def make(target: str, shape: ShapeT) -> Rule | None:
        local, kind = target.rsplit(".", 1)
        if local == "lm_head":
            return copy(target, shape)
        if local in ("embed", "norm_f"):
            return copy(f"{p}{'embed_tokens' if local == 'embed' else 'final_layernorm'}.{kind}", shape)
        m = BLOCK.fullmatch(local)
        if not m:
            return None
        hf, part_name = f"{p}layers.{m.group(2)}", m.group(3)
        if part_name == "attn.qkv":
            split = [f"{hf}.self_attn.{x}_proj.{kind}" for x in "qkv"]
            return concat(split, shape, attention_sizes(g, target))
        return copy(f"{hf}.{_BLOCK[part_name]}.{kind}", shape) if part_name in _BLOCK else None

    tied = g.op("lm_head").attrs.get("tied_to")
    return Plan(
        "Phi",
        rules_for(g, "Phi", make),
        tied=[(f"{p}embed_tokens.weight", "lm_head.weight")] if tied else [],
        ignore=r"rotary_emb\.inv_freq$",
    )


FAMILY = Family("Phi", ("PhiForCausalLM",), ("phi",), ("decoder",), spec, detect, plan)
