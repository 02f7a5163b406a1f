"""Lowering of a dual encoder (CLIP, SigLIP): the image and text towers side by side, each pooled embedding
L2-normalised, and the two scored against each other with a learned temperature (and bias)."""

from __future__ import annotations

from typing import TypeVar

from ...spec.rules_contrastive import embed_width
from ...spec.schema import DualEncoderSpec, TextTower, VisionTower
from ..graph import LayerGraph
from .context import Context, graph_meta, text_facts
from .encoder import text_tower
from .vit import tokens, vit_tower


def lower_dual_encoder(s: DualEncoderSpec) -> LayerGraph:
    v, t = _as_model(s, s.vision), _as_model(s, s.text)
    im = v.image
    g = LayerGraph(
        meta=graph_meta(
            s,
            "dual_encoder",
            "image_text",
            v.blocks + t.blocks,
            image=im.size,
            channels=im.channels,
            image_tokens=tokens(v),  # fixed by the image; N (the default: context) is the text's length
            **text_facts(t),
        )
    )
    px = g.add_input("pixel_values", ("B", im.channels, im.size, im.size), "float32")
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    _, image = vit_tower(Context(g, v, "vision", None), "vision.", px)
    _, text = text_tower(Context(g, t, "text", pad), "text.", ids)
    assert image is not None and text is not None  # a rule makes both towers pool
    dim = embed_width(v)
    image = g.add("l2_normalize", "image_embeds", [image], "head", dim=dim)
    text = g.add("l2_normalize", "text_embeds", [text], "head", dim=dim)
    c = s.contrastive
    per_text = g.add(
        "contrastive", "contrastive", [text, image], "head", dim=dim, logit_scale=c.logit_scale, logit_bias=c.logit_bias
    )
    g.set_output("image_embeds", image)
    g.set_output("text_embeds", text)
    g.set_output("logits_per_image", g.add("transpose", "logits_per_image", [per_text], "head"))
    g.set_output("logits_per_text", per_text)
    return g


Tower = TypeVar("Tower", VisionTower, TextTower)


def _as_model(s: DualEncoderSpec, tower: Tower) -> Tower:
    """The tower with the model's dtype and init (a rule keeps the towers from setting their own)."""
    return tower.model_copy(update={"dtype": s.dtype, "init": s.init})
