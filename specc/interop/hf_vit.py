"""ViT (``ViTForImageClassification``, ``ViTModel``): config → vit spec; patch conv, class token, ``[1, T, D]``
positions and split query/key/value → specc names.

``ViTModel`` becomes ``head: pooled`` (outputs ``last_hidden_state`` and the dense + tanh ``pooler_output``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import HFConfig
from .name_table import Table
from .name_table import plan as table_plan
from .weight_map import Plan


def _square(cfg: HFConfig, key: str) -> int:
    v = cfg.require(key)
    if isinstance(v, (list, tuple)):
        if len(v) != 2 or v[0] != v[1]:
            raise cfg.refuse(key, f"{list(v)} is not square; specc's vit takes one size", "use a square size")
        v = v[0]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise cfg.refuse(key, f"expected a positive whole number, got {v!r}")
    return v


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    hidden = cfg.positive_int("hidden_size")
    if arch == "ViTModel":
        head: dict[str, Any] = {"head": "pooled"}
        cfg.expect("pooler_act", "tanh", "tanh", "specc's pooler is dense + tanh")
        cfg.expect("pooler_output_size", (None, hidden), None, "specc's pooler keeps the model width")
    else:
        head = {"head": "classifier", "classes": cfg.num_labels()}
        cfg.ignore("pooler_output_size", "pooler_act")  # the classifier model has no pooler
    cfg.ignore("encoder_stride", "use_mask_token")  # masked-image-modelling only
    act = cfg.activation("hidden_act", "gelu")
    return {
        "kind": "vit",
        "image": {
            "size": _square(cfg, "image_size"),
            "patch": _square(cfg, "patch_size"),
            "channels": cfg.positive_int("num_channels", 3),
        },
        "pooling": "cls",
        **head,
        "d_model": hidden,
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": {"heads": cfg.positive_int("num_attention_heads"), "mask": "none"},
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_eps", 1e-12)},
        "mlp": {"type": "classic", "hidden": cfg.positive_int("intermediate_size"), "activation": act},
        "position": "learned",
        "bias": {"qkv": cfg.flag("qkv_bias", True), "out": True, "mlp": True, "norm": True, "head": True},
        **cfg.training(
            embedding="hidden_dropout_prob", attention="attention_probs_dropout_prob", residual="hidden_dropout_prob"
        ),
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(vit\.)?embeddings\.patch_embeddings\.projection\.weight", n) for n in names)


_L = "{p}encoder.layer.*."
TABLE = Table(
    "ViT",
    {
        "cls_token.token": "{p}embeddings.cls_token",
        "pos.weight": ("squeeze", "{p}embeddings.position_embeddings"),
        "patch_embed.{k}": "{p}embeddings.patch_embeddings.projection.{k}",
        "head.{k}": "classifier.{k}",
        "pooler.dense.{k}": "{p}pooler.dense.{k}",
        "norm_f.{k}": "{p}layernorm.{k}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{_L}attention.attention.{x}.{{k}}" for x in ("query", "key", "value"))),
        "blocks.*.norm1.{k}": f"{_L}layernorm_before.{{k}}",
        "blocks.*.attn.out.{k}": f"{_L}attention.output.dense.{{k}}",
        "blocks.*.norm2.{k}": f"{_L}layernorm_after.{{k}}",
        "blocks.*.mlp.fc1.{k}": f"{_L}intermediate.dense.{{k}}",
        "blocks.*.mlp.fc2.{k}": f"{_L}output.dense.{{k}}",
    },
    prefix="vit.",
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    pooler = () if "pooler.dense.weight" in g.params() else (r"^{p}pooler\.",)
    return table_plan(replace(TABLE, dropped=(r"^{p}embeddings\.mask_token", *pooler)), g, names)


FAMILY = Family("ViT", ("ViTForImageClassification", "ViTModel"), ("vit",), ("vit",), spec, detect, plan)
