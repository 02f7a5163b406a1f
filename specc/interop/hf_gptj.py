"""GPT-J (``GPTJForCausalLM``): attention and MLP in parallel on one LayerNorm, RoPE on the first ``rotary_dim``
dims of each head in interleaved pairs (theta 10000), no q/k/v/out biases, an LM head with bias.
"""

from __future__ import annotations

import re
from typing import Any

from ..ir.graph import LayerGraph
from .family import BLOCK, Family, attention_sizes, prefix, rules_for
from .hf_config import HFConfig
from .weight_map import Plan, Rule, ShapeT, concat, copy

_BLOCK = {"norm1": "ln_1", "attn.out": "attn.out_proj", "mlp.fc1": "mlp.fc_in", "mlp.fc2": "mlp.fc_out"}


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
        "dropout": {
            "embedding": cfg.dropout("embd_pdrop"),
            "attention": cfg.dropout("attn_pdrop"),
            "residual": cfg.dropout("resid_pdrop"),
        },
        "init": {"std": cfg.number("initializer_range", 0.02), "scaled_residual": False},
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(transformer\.)?h\.\d+\.attn\.q_proj\.weight", n) for n in names)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    p = prefix(names, "transformer.")

    def make(target: str, shape: ShapeT) -> Rule | None:
        local, kind = target.rsplit(".", 1)
        if local == "lm_head":
            return copy(target, shape)
        if local in ("embed", "norm_f"):
            return copy(f"{p}{'wte' if local == 'embed' else 'ln_f'}.{kind}", shape)
        m = BLOCK.fullmatch(local)
        if not m:
            return None
        hf, part_name = f"{p}h.{m.group(2)}", m.group(3)
        if part_name == "attn.qkv":
            return concat([f"{hf}.attn.{x}_proj.{kind}" for x in "qkv"], shape, attention_sizes(g, target))
        return copy(f"{hf}.{_BLOCK[part_name]}.{kind}", shape) if part_name in _BLOCK else None

    tied = g.op("lm_head").attrs.get("tied_to")
    return Plan(
        "GPT-J",
        rules_for(g, "GPT-J", make),
        tied=[(f"{p}wte.weight", "lm_head.weight")] if tied else [],
        ignore=r"\.attn\.(bias|masked_bias|embed_positions)$",
    )


FAMILY = Family("GPT-J", ("GPTJForCausalLM",), ("gptj",), ("decoder",), spec, detect, plan)
