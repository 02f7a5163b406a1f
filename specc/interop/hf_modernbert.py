"""ModernBERT (``ModernBertModel``, ``ModernBertForMaskedLM``): config → encoder spec; global layers (every
``global_attn_every_n_layers``-th from the first, or ``layer_types``) alternate with two-sided local windows
(``mask: local``, ``window: local_attention``), each kind with its own RoPE base; no attention norm in layer 0
(``norm.skip_first``); bias-free GeGLU MLPs (the packed ``Wi``: act(first half) · second half); a final norm; the
MLM head (dense, activation, norm, the tied decoder with its bias) → specc names.

Both config dialects: transformers 5's ``layer_types`` + per-type ``rope_parameters``, and the released files'
``global_attn_every_n_layers`` + ``global_rope_theta`` / ``local_rope_theta``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from . import hf_decoder as dec
from .family import Family
from .hf_config import HFConfig
from .name_table import Table
from .name_table import plan as table_plan
from .weight_map import Plan

_HEADS = {"ModernBertModel": "none", "ModernBertForMaskedLM": "mlm"}


def _theta(cfg: HFConfig, layer_type: str, old_key: str, default: float) -> float:
    params = cfg.mapping("rope_parameters")
    if params is not None and isinstance(params.get(layer_type), dict):
        p = params[layer_type]
        if p.get("rope_type", "default") != "default":
            raise cfg.refuse("rope_parameters", f"RoPE type {p.get('rope_type')!r} is not supported for ModernBERT")
        return float(p.get("rope_theta", default))
    return cfg.number(old_key, default)


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    n = cfg.positive_int("num_hidden_layers")
    every = cfg.positive_int("global_attn_every_n_layers", 3)
    types = dec.layer_types(cfg, ["full_attention" if i % every == 0 else "sliding_attention" for i in range(n)])
    window = cfg.positive_int("local_attention", 128)
    cfg.expect("classifier_pooling", ("cls", "mean"), "cls", "pooling is read only by classification heads")
    cfg.ignore("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")
    cfg.ignore("initializer_cutoff_factor", "deterministic_flash_attn", "sparse_prediction", "sparse_pred_ignore_index")
    cfg.ignore("reference_compile", "repad_logits_with_grad")
    cfg.ignore("layer_norm_eps", "position_embedding_type")  # left in the released configs; ModernBERT reads neither
    head = _HEADS[arch]
    act = cfg.activation("hidden_activation", "gelu")
    bias = {
        "qkv": cfg.flag("attention_bias", False),
        "out": cfg.flag("attention_bias", False),
        "mlp": cfg.flag("mlp_bias", False),
        "norm": cfg.flag("norm_bias", False),
        "head": head == "mlm" and cfg.flag("decoder_bias", True),
    }
    if head == "mlm" and cfg.flag("classifier_bias", False) != bias["mlp"]:
        raise cfg.refuse("classifier_bias", "a head dense bias unlike the MLP's (mlp_bias) is not supported")
    full = _theta(cfg, "full_attention", "global_rope_theta", 160000.0)
    local = _theta(cfg, "sliding_attention", "local_rope_theta", 10000.0)
    layers: list[dec.Layer] = []
    for t in types:
        if t == "full_attention":
            layers.append(("global", {}))
        else:
            layers.append(("local", {"attention": {"mask": "local", "window": window}, "position": {"theta": local}}))
    doc: dict[str, Any] = {
        "kind": "encoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings", 8192),
        "d_model": cfg.positive_int("hidden_size"),
        "blocks": n,
        "attention": {"heads": cfg.positive_int("num_attention_heads"), "mask": "padding"},
        "norm": {
            "type": "layernorm",
            "placement": "pre",
            "eps": cfg.number("norm_eps", 1e-5),
            "embedding": True,
            "skip_first": True,
        },
        "mlp": {"type": "swiglu", "hidden": cfg.positive_int("intermediate_size"), "activation": act},
        "position": {"type": "rotary", "theta": full},
        "head": head,
        "head_activation": cfg.activation("classifier_activation", "gelu"),
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        "bias": bias,
        **cfg.training(
            embedding="embedding_dropout", attention="attention_dropout", residual="mlp_dropout", std_default=0.02
        ),
    }
    cfg.ignore("classifier_dropout")
    return dec.per_layer(doc, layers)


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.attn\.Wqkv\.weight", n) for n in names)


_L = "{p}layers.*."
TABLE = Table(
    "ModernBERT",
    {
        "embed.weight": "{p}embeddings.tok_embeddings.weight",
        "embed_norm.{k}": "{p}embeddings.norm.{k}",
        "blocks.*.norm1.{k}": f"{_L}attn_norm.{{k}}",
        "blocks.*.attn.qkv.{k}": f"{_L}attn.Wqkv.{{k}}",
        "blocks.*.attn.out.{k}": f"{_L}attn.Wo.{{k}}",
        "blocks.*.norm2.{k}": f"{_L}mlp_norm.{{k}}",
        "blocks.*.mlp.gate.{k}": (("half", 0, 0), f"{_L}mlp.Wi.{{k}}"),
        "blocks.*.mlp.up.{k}": (("half", 0, 1), f"{_L}mlp.Wi.{{k}}"),
        "blocks.*.mlp.down.{k}": f"{_L}mlp.Wo.{{k}}",
        "norm_f.{k}": "{p}final_norm.{k}",
        "mlm.transform.{k}": "head.dense.{k}",
        "mlm.norm.{k}": "head.norm.{k}",
        "lm_head.weight": "decoder.weight",
        "lm_head.bias": "decoder.bias",
    },
    prefix="model.",
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}embeddings.tok_embeddings.weight", "decoder.weight"),) if "lm_head.weight" not in g.params() else ()
    dropped = () if "mlm.transform.weight" in g.params() else (r"^head\.", r"^decoder\.")
    return table_plan(replace(TABLE, tied=tied, dropped=dropped), g, names)


FAMILY = Family("ModernBERT", tuple(_HEADS), ("modernbert",), ("encoder",), spec, detect, plan)
