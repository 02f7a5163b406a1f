"""SigLIP's vision tower (``SiglipVisionModel``): config → vit spec; patch tokens without a class token, split
q/k/v, a final LayerNorm over every token (``post_layernorm``) and the attention-pooling head (``head``: a
probe, ``nn.MultiheadAttention`` with packed ``in_proj``, LayerNorm, MLP) → specc names.

``text_spec`` and ``TEXT_TABLE`` are the text tower of ``SiglipModel`` (hf_dual). ``vision_use_head: false``
becomes ``head: none`` (``last_hidden_state`` only, as transformers then returns no
pooled output).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_clip import _blocks
from .hf_config import HFConfig
from .hf_vit import _square
from .name_table import Table
from .name_table import plan as table_plan
from .weight_map import Plan


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    head = "attention_pool" if cfg.flag("vision_use_head", True) else "none"
    size, patch = _square(cfg, "image_size"), _square(cfg, "patch_size")
    return {
        "kind": "vit",
        "image": {
            "size": size,
            "patch": patch,
            "channels": cfg.positive_int("num_channels", 3),
            **({"drop_remainder": True} if size % patch else {}),  # the strided conv drops it (so400m: 384 / 14)
        },
        "pooling": "none",
        "head": head,
        "d_model": cfg.positive_int("hidden_size"),
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": {"heads": cfg.positive_int("num_attention_heads"), "mask": "none"},
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_eps", 1e-6)},
        "mlp": {
            "type": "classic",
            "hidden": cfg.positive_int("intermediate_size"),
            "activation": cfg.activation("hidden_act", "gelu_pytorch_tanh"),
        },
        "position": "learned",
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": False},
        **cfg.training(attention="attention_dropout"),
    }


_H = "{p}head."
TABLE = Table(
    "SigLIP vision",
    {
        "patch_embed.{k}": "{p}embeddings.patch_embedding.{k}",
        "pos.weight": "{p}embeddings.position_embedding.weight",
        "norm_f.{k}": "{p}post_layernorm.{k}",
        "head.probe.token": f"{_H}probe",
        # nn.MultiheadAttention packs [q | k | v] in one in_proj: q is its first third, [k | v] the rest
        "head.attn.q.weight": (("parts", 0, (1, 2), 0), f"{_H}attention.in_proj_weight"),
        "head.attn.q.bias": (("parts", 0, (1, 2), 0), f"{_H}attention.in_proj_bias"),
        "head.attn.kv.weight": (("parts", 0, (1, 2), 1), f"{_H}attention.in_proj_weight"),
        "head.attn.kv.bias": (("parts", 0, (1, 2), 1), f"{_H}attention.in_proj_bias"),
        "head.attn.out.{k}": f"{_H}attention.out_proj.{{k}}",
        "head.norm.{k}": f"{_H}layernorm.{{k}}",
        "head.mlp.fc1.{k}": f"{_H}mlp.fc1.{{k}}",
        "head.mlp.fc2.{k}": f"{_H}mlp.fc2.{{k}}",
        **_blocks("{p}"),
    },
    prefix="vision_model.",  # transformers 4 checkpoints; absent in 5
    ignore=(r"embeddings\.position_ids$",),
)


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(vision_model\.)?embeddings\.patch_embedding\.weight", n) for n in names) and not any(
        n.endswith("embeddings.class_embedding") for n in names
    )


def plan(g: LayerGraph, names: set[str]) -> Plan:
    dropped = () if "head.probe.token" in g.params() else (r"^{p}head\.",)
    return table_plan(replace(TABLE, dropped=dropped), g, names)


FAMILY = Family("SigLIP vision", ("SiglipVisionModel",), ("siglip_vision_model",), ("vit",), spec, detect, plan)


def text_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    """SigLIP's text tower: a bidirectional encoder (padding masked) whose pooled output is the final-normed last
    position, padded or not, through ``head`` (a linear with bias, to projection_size, default hidden_size)."""
    cfg.ignore("pad_token_id", "bos_token_id", "eos_token_id")  # the pooling reads the last position, no id
    # absent fields are SiglipTextConfig's defaults (the published so400m config states only its sizes)
    hidden = cfg.positive_int("hidden_size", 768)
    projection = hidden if cfg.get("projection_size") is None else cfg.positive_int("projection_size")
    return {
        "kind": "encoder",
        "vocab_size": cfg.positive_int("vocab_size", 32000),
        "context": cfg.positive_int("max_position_embeddings", 64),
        "d_model": hidden,
        "blocks": cfg.positive_int("num_hidden_layers", 12),
        "attention": {"heads": cfg.positive_int("num_attention_heads", 12), "mask": "padding"},
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_eps", 1e-6)},
        "mlp": {
            "type": "classic",
            "hidden": cfg.positive_int("intermediate_size", 3072),
            "activation": cfg.activation("hidden_act", "gelu_pytorch_tanh"),
        },
        "position": "learned",
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": False},
        "head": "last",
        "projection": {"dim": projection, "bias": True},
        **cfg.training(attention="attention_dropout"),
    }


TEXT_TABLE = Table(
    "SigLIP text",
    {
        "embed.weight": "{p}embeddings.token_embedding.weight",
        "pos.weight": "{p}embeddings.position_embedding.weight",
        "norm_f.{k}": "{p}final_layer_norm.{k}",
        "projection.{k}": "{p}head.{k}",
        **_blocks("{p}"),
    },
    prefix="text_model.",
    ignore=(r"embeddings\.position_ids$",),
)
