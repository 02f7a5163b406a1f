"""The dual encoders (``CLIPModel``, ``SiglipModel``): config → dual_encoder spec, each tower read from its own
sub-config (``vision_config`` / ``text_config``) by its tower family's reader, and the towers' name tables nested
under ``vision.`` / ``text.`` (``vision_model.`` / ``text_model.`` in the checkpoint) beside the logit scale (and
SigLIP's logit bias).

CLIP's towers end in bias-free projections to ``projection_dim``; SigLIP's vision tower embeds its attention-pooled
output as it is and its text tower's ``head`` (with bias) is its projection. The contrastive section's values are
initial values only: CLIP's ``logit_scale_init_value``; SigLIP's config has none, and its paper starts the scale
at log 10 and the bias at -10.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..ir.graph import LayerGraph
from . import hf_clip, hf_siglip
from .family import Family
from .hf_config import HFConfig
from .name_table import Table
from .name_table import plan as table_plan
from .weight_map import Plan


def _tower(body: dict[str, Any]) -> dict[str, Any]:
    """A tower family's spec as a dual encoder's tower: no kind (the slot says it), no init (the model's)."""
    return {k: v for k, v in body.items() if k not in ("kind", "init")}


# CLIPVisionConfig's and CLIPTextConfig's defaults (transformers 5) of the sizes the tower readers require
_DEFAULTS = {
    "vision": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                   image_size=224, patch_size=32),
    "text": dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=8),
}  # fmt: skip


def _clip_tower(cfg: HFConfig, part: str) -> HFConfig:
    """``{part}_config``, or, in the older dialect, ``{part}_config_dict``: transformers then completes the dict with
    the tower config's defaults and lets it replace every field of ``{part}_config`` (CLIPConfig.__post_init__)."""
    if cfg.data.get(f"{part}_config_dict") is None:
        cfg.ignore(f"{part}_config_dict")
        return cfg.sub(f"{part}_config")
    cfg.ignore(f"{part}_config")
    cfg.notes.append(f"{part}_config_dict replaces {part}_config, completed by the defaults (transformers' rule)")
    return cfg.sub(f"{part}_config_dict", _DEFAULTS[part])


def clip_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    vision_cfg, text_cfg = _clip_tower(cfg, "vision"), _clip_tower(cfg, "text")
    vision = hf_clip.vision_spec(vision_cfg, "CLIPVisionModel")
    text = hf_clip.text_spec(text_cfg, "CLIPTextModel")
    dim = cfg.positive_int("projection_dim", 512)
    cfg.ignore("initializer_factor")  # init only
    return {
        "kind": "dual_encoder",
        "vision": {**_tower(vision), "projection": dim},
        "text": {**_tower(text), "projection": dim},
        "contrastive": {"logit_scale": cfg.number("logit_scale_init_value", 2.6592)},
        "init": vision["init"],
    }


def siglip_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    vision_cfg = cfg.sub("vision_config")
    vision = hf_siglip.spec(vision_cfg, "SiglipVisionModel")
    text = hf_siglip.text_spec(cfg.sub("text_config"), "SiglipTextModel")
    if vision["head"] == "none":
        raise vision_cfg.refuse("vision_use_head", "false leaves SiglipModel's image tower without a pooled output")
    cfg.ignore("initializer_factor")
    return {
        "kind": "dual_encoder",
        "vision": _tower(vision),
        "text": _tower(text),
        "contrastive": {"logit_scale": math.log(10.0), "logit_bias": -10.0},
        "init": vision["init"],
    }


def nest(table: Table, target: str, source: str) -> dict[str, Any]:
    """``table``'s rows with the targets under ``target`` and the checkpoint names' ``{p}`` as ``source``."""

    def fill(alt: Any) -> Any:
        if isinstance(alt, str):
            return alt.replace("{p}", source)
        op, *names = alt
        return (op, *(n.replace("{p}", source) for n in names))

    return {f"{target}{key}": fill(alt) for key, alt in table.rows.items()}


CLIP_TABLE = Table(
    "CLIP",
    {
        **nest(hf_clip.VISION_TABLE, "vision.", "vision_model."),
        **nest(hf_clip.TEXT_TABLE, "text.", "text_model."),
        "contrastive.logit_scale": ("unsqueeze", "logit_scale"),  # a 0-d tensor in CLIPModel
    },
    ignore=(r"embeddings\.position_ids$",),
)
SIGLIP_TABLE = Table(
    "SigLIP",
    {
        **nest(hf_siglip.TABLE, "vision.", "vision_model."),
        **nest(hf_siglip.TEXT_TABLE, "text.", "text_model."),
        "contrastive.logit_scale": "logit_scale",
        "contrastive.logit_bias": "logit_bias",
    },
    ignore=(r"embeddings\.position_ids$",),
)


def clip_detect(names: set[str]) -> bool:
    return "logit_scale" in names and "logit_bias" not in names and "vision_model.embeddings.class_embedding" in names


def siglip_detect(names: set[str]) -> bool:
    return "logit_bias" in names and any(re.fullmatch(r"vision_model\.head\.probe", n) for n in names)


def clip_plan(g: LayerGraph, names: set[str]) -> Plan:
    return table_plan(CLIP_TABLE, g, names)


def siglip_plan(g: LayerGraph, names: set[str]) -> Plan:
    return table_plan(SIGLIP_TABLE, g, names)


CLIP_FAMILY = Family("CLIP", ("CLIPModel",), ("clip",), ("dual_encoder",), clip_spec, clip_detect, clip_plan)
SIGLIP_FAMILY = Family(
    "SigLIP", ("SiglipModel",), ("siglip",), ("dual_encoder",), siglip_spec, siglip_detect, siglip_plan
)
