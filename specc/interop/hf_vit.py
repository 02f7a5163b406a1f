"""ViT (``ViTForImageClassification``, ``ViTModel``): config → vit spec; patch conv, class token, ``[1, T, D]``
positions and split query/key/value → specc names.

``ViTModel`` becomes ``head: pooled`` (outputs ``last_hidden_state`` and the dense + tanh ``pooler_output``).
"""

from __future__ import annotations

import re
from typing import Any

from ..ir.graph import LayerGraph
from .family import BLOCK, Family, attention_sizes, prefix, rules_for
from .hf_config import HFConfig
from .weight_map import Plan, Rule, ShapeT, concat, copy, squeezed

_BLOCK = {
    "norm1": "layernorm_before",
    "attn.out": "attention.output.dense",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}
_TOP = {"patch_embed": "embeddings.patch_embeddings.projection", "norm_f": "layernorm"}


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
        "dropout": {
            "embedding": cfg.dropout("hidden_dropout_prob"),
            "attention": cfg.dropout("attention_probs_dropout_prob"),
            "residual": cfg.dropout("hidden_dropout_prob"),
        },
        "init": {"std": cfg.number("initializer_range", 0.02), "scaled_residual": False},
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(vit\.)?embeddings\.patch_embeddings\.projection\.weight", n) for n in names)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    p = prefix(names, "vit.")
    has_pooler = "pooler.dense.weight" in g.params()

    def make(target: str, shape: ShapeT) -> Rule | None:
        local, kind = target.rsplit(".", 1)
        if target == "cls_token.token":
            return copy(f"{p}embeddings.cls_token", shape)
        if target == "pos.weight":
            return squeezed(f"{p}embeddings.position_embeddings", shape)
        if local == "head":
            return copy(f"classifier.{kind}", shape)
        if local == "pooler.dense":
            return copy(f"{p}pooler.dense.{kind}", shape)
        if local in _TOP:
            return copy(f"{p}{_TOP[local]}.{kind}", shape)
        m = BLOCK.fullmatch(local)
        if not m:
            return None
        layer, rest = f"{p}encoder.layer.{m.group(2)}", m.group(3)
        if rest == "attn.qkv":
            split = [f"{layer}.attention.attention.{x}.{kind}" for x in ("query", "key", "value")]
            return concat(split, shape, attention_sizes(g, target))
        return copy(f"{layer}.{_BLOCK[rest]}.{kind}", shape) if rest in _BLOCK else None

    return Plan(
        "ViT",
        rules_for(g, "ViT", make),
        dropped=f"^{re.escape(p)}embeddings\\.mask_token" + ("" if has_pooler else f"|^{re.escape(p)}pooler\\."),
    )


FAMILY = Family("ViT", ("ViTForImageClassification", "ViTModel"), ("vit",), ("vit",), spec, detect, plan)
