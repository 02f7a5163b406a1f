"""CLIP's towers (``CLIPVisionModel``, ``CLIPTextModel`` and their ``*WithProjection`` classes): config → vit /
encoder spec; split q/k/v projections and quick_gelu MLPs in both → specc names.

The vision tower is ``head: pooled_norm`` with ``norm.final: false`` (its ``last_hidden_state`` is the blocks'
output, unnormed), ``norm.embedding: true`` (``pre_layrnorm``), a class embedding and a bias-free patch conv.
The text tower is a causal encoder with ``head: eos``: ``pooler_output`` is the final-normed token at the first
EOS id (``eos_token``), or at the largest id for configs whose ``eos_token_id`` is 2 (transformers' rule for
CLIP configs from before the EOS id was fixed). The *WithProjection classes add the tower's bias-free projection
(``projection: projection_dim``), whose output is ``image_embeds`` / ``text_embeds`` in place of ``pooler_output``.
"""

from __future__ import annotations

import re
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import HFConfig
from .hf_vit import _square
from .name_table import Table
from .name_table import plan as table_plan
from .weight_map import Plan


def _tower(cfg: HFConfig, arch: str) -> dict[str, Any]:
    """What both towers share: width, blocks, heads, quick_gelu MLP, pre-norm LayerNorm blocks with biases; the
    projection of the *WithProjection classes (a tower of CLIPModel has its projection given by the model)."""
    cfg.ignore("initializer_factor")  # init only
    projection = cfg.positive_int("projection_dim", 512) if arch.endswith("WithProjection") else None
    if projection is None:
        cfg.ignore("projection_dim")  # only the *WithProjection classes (and CLIPModel, at its top level) read it
    return {
        **({"projection": projection} if projection is not None else {}),
        "d_model": cfg.positive_int("hidden_size"),
        "blocks": cfg.positive_int("num_hidden_layers"),
        "mlp": {
            "type": "classic",
            "hidden": cfg.positive_int("intermediate_size"),
            "activation": cfg.activation("hidden_act", "quick_gelu"),
        },
        "position": "learned",
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": False},
        **cfg.training(embedding="dropout", attention="attention_dropout", residual="dropout"),
    }


def vision_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    eps = cfg.number("layer_norm_eps", 1e-5)
    size, patch = _square(cfg, "image_size"), _square(cfg, "patch_size")
    return {
        "kind": "vit",
        "image": {
            "size": size,
            "patch": patch,
            "channels": cfg.positive_int("num_channels", 3),
            "patch_bias": False,
            **({"drop_remainder": True} if size % patch else {}),  # the strided conv drops it
        },
        "pooling": "cls",
        "head": "pooled_norm",
        "attention": {"heads": cfg.positive_int("num_attention_heads"), "mask": "none"},
        "norm": {"type": "layernorm", "placement": "pre", "eps": eps, "embedding": True, "final": False},
        **_tower(cfg, arch),
    }


def text_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    eos = cfg.get("eos_token_id", 49407)
    if not isinstance(eos, int) or isinstance(eos, bool) or eos < 0:
        raise cfg.refuse("eos_token_id", f"expected one token id, got {eos!r}", "CLIP pools at one EOS id")
    cfg.ignore("pad_token_id", "bos_token_id")  # the pooling reads only the EOS id
    vocab = cfg.positive_int("vocab_size")
    if eos != 2 and eos >= vocab:
        raise cfg.refuse("eos_token_id", f"{eos} is not below vocab_size {vocab}", "CLIP pools at the EOS id's token")
    return {
        "kind": "encoder",
        "vocab_size": vocab,
        "context": cfg.positive_int("max_position_embeddings", 77),
        "attention": {"heads": cfg.positive_int("num_attention_heads"), "mask": "causal"},
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_eps", 1e-5)},
        "head": "eos",
        "eos_token": None if eos == 2 else eos,  # 2: the old configs' id, pooled at the largest id
        **_tower(cfg, arch),
    }


def _blocks(prefix: str) -> dict[str, Any]:
    layer = f"{prefix}encoder.layers.*."
    attn = f"{layer}self_attn."
    return {
        "blocks.*.norm1.{k}": f"{layer}layer_norm1.{{k}}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{attn}{x}_proj.{{k}}" for x in "qkv")),
        "blocks.*.attn.out.{k}": f"{attn}out_proj.{{k}}",
        "blocks.*.norm2.{k}": f"{layer}layer_norm2.{{k}}",
        "blocks.*.mlp.fc1.{k}": f"{layer}mlp.fc1.{{k}}",
        "blocks.*.mlp.fc2.{k}": f"{layer}mlp.fc2.{{k}}",
    }


_V = "{p}"  # "vision_model." in transformers 4 checkpoints, absent in 5
VISION_TABLE = Table(
    "CLIP vision",
    {
        "cls_token.token": ("unsqueeze", f"{_V}embeddings.class_embedding"),
        "patch_embed.weight": f"{_V}embeddings.patch_embedding.weight",
        "pos.weight": f"{_V}embeddings.position_embedding.weight",
        "embed_norm.{k}": f"{_V}pre_layrnorm.{{k}}",
        "pool_norm.{k}": f"{_V}post_layernorm.{{k}}",
        "projection.weight": "visual_projection.weight",  # CLIPVisionModelWithProjection's, beside vision_model
        **_blocks(_V),
    },
    prefix="vision_model.",
    ignore=(r"embeddings\.position_ids$",),
)


_T = "{p}"  # "text_model." in transformers 4 checkpoints, absent in 5
TEXT_TABLE = Table(
    "CLIP text",
    {
        "embed.weight": f"{_T}embeddings.token_embedding.weight",
        "pos.weight": f"{_T}embeddings.position_embedding.weight",
        "norm_f.{k}": f"{_T}final_layer_norm.{{k}}",
        "projection.weight": "text_projection.weight",  # CLIPTextModelWithProjection's, beside text_model
        **_blocks(_T),
    },
    prefix="text_model.",
    ignore=(r"embeddings\.position_ids$",),
)


def text_detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(text_model\.)?embeddings\.token_embedding\.weight", n) for n in names)


def text_plan(g: LayerGraph, names: set[str]) -> Plan:
    return table_plan(TEXT_TABLE, g, names)


def vision_detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(vision_model\.)?embeddings\.class_embedding", n) for n in names)


def vision_plan(g: LayerGraph, names: set[str]) -> Plan:
    return table_plan(VISION_TABLE, g, names)


VISION_FAMILY = Family(
    "CLIP vision",
    ("CLIPVisionModel", "CLIPVisionModelWithProjection"),
    ("clip_vision_model",),
    ("vit",),
    vision_spec,
    vision_detect,
    vision_plan,
)
TEXT_FAMILY = Family(
    "CLIP text",
    ("CLIPTextModel", "CLIPTextModelWithProjection"),
    ("clip_text_model",),
    ("encoder",),
    text_spec,
    text_detect,
    text_plan,
)
