"""GPT-2 (``GPT2LMHeadModel``): config → decoder spec; ``transformer.h.{i}.*`` Conv1D weights → specc names."""

from __future__ import annotations

import re
from typing import Any

from ..ir.graph import LayerGraph
from .family import BLOCK, Family, prefix, rules_for
from .hf_config import HFConfig
from .weight_map import Plan, Rule, ShapeT, copy, transposed

# specc local name inside a block → (HF name inside ``h.{i}.``, stored as Conv1D [in, out]?)
_BLOCK = {
    "norm1": ("ln_1", False),
    "attn.qkv": ("attn.c_attn", True),
    "attn.out": ("attn.c_proj", True),
    "norm2": ("ln_2", False),
    "mlp.fc1": ("mlp.c_fc", True),
    "mlp.fc2": ("mlp.c_proj", True),
}
_TOP = {"embed": "wte", "pos": "wpe", "norm_f": "ln_f"}


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
        "dropout": {
            "embedding": cfg.dropout("embd_pdrop"),
            "attention": cfg.dropout("attn_pdrop"),
            "residual": cfg.dropout("resid_pdrop"),
        },
        "init": {"std": cfg.number("initializer_range", 0.02), "scaled_residual": True},
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(transformer\.)?h\.\d+\.attn\.c_attn\.weight", n) for n in names)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    p = prefix(names, "transformer.")

    def make(target: str, shape: ShapeT) -> Rule | None:
        local, kind = target.rsplit(".", 1)
        if target == "lm_head.weight":
            return copy("lm_head.weight", shape)
        if local in _TOP:
            return copy(f"{p}{_TOP[local]}.{kind}", shape)
        m = BLOCK.fullmatch(local)
        if m and m.group(3) in _BLOCK:
            hf, conv = _BLOCK[m.group(3)]
            src = f"{p}h.{m.group(2)}.{hf}.{kind}"
            return transposed(src, shape) if conv and kind == "weight" else copy(src, shape)
        return None

    tied = g.op("lm_head").attrs.get("tied_to")
    return Plan(
        "GPT-2",
        rules_for(g, "GPT-2", make),
        tied=[(f"{p}wte.weight", "lm_head.weight")] if tied else [],
        # causal-mask tables that old checkpoints stored next to the weights
        ignore=r"^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$",
    )


FAMILY = Family("GPT-2", ("GPT2LMHeadModel",), ("gpt2",), ("decoder",), spec, detect, plan)
