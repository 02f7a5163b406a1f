"""Lowering of a Vision Transformer: patch embedding, class token, 2-D positions, blocks, classifier or pooled head."""

from __future__ import annotations

from ...spec import resolve
from ...spec.schema import ViTSpec
from ..graph import LayerGraph
from .blocks import attention_pool, stack
from .context import Context, embed_norm_dropout, graph_meta, head, norm, pooler


def lower_vit(s: ViTSpec) -> LayerGraph:
    im = s.image
    grid = im.size // im.patch
    tokens = grid * grid + (1 if s.pooling == "cls" else 0)
    g = LayerGraph(
        meta=graph_meta(
            s,
            "vit",
            "image_classification" if s.head == "classifier" else "image_encoder",
            s.blocks,
            classes=s.classes,
            image=im.size,
            channels=im.channels,
            tokens=tokens,
        )
    )
    px = g.add_input("pixel_values", ("B", im.channels, im.size, im.size), "float32")
    c = Context(g, s, None, None)
    x = g.add(
        "patch_embed",
        "patch_embed",
        [px],
        "embed",
        channels=im.channels,
        patch=im.patch,
        dim=s.d_model,
        grid=grid,
        bias=im.patch_bias,
    )
    cls = s.pooling == "cls"
    if cls:
        x = g.add("cls_token", "cls_token", [x], "embed", dim=s.d_model)
    pos = s.position.type
    if pos == "learned":
        x = g.add("learned_pos", "pos", [x], "pos", positions=tokens, dim=s.d_model)
    elif pos == "learned_2d":
        x = g.add("learned_pos_2d", "pos", [x], "pos", grid=grid, dim=s.d_model, cls=cls)
    elif pos in ("sinusoidal", "sinusoidal_2d"):
        x = g.add("sinusoidal_pos_2d", "pos", [x], "pos", grid=grid, dim=s.d_model, cls=cls)
    x = embed_norm_dropout(c, x, "")
    x = stack(c, "", x, s.blocks, resolve.mask(s))
    g.set_output("last_hidden_state", x)
    if s.head == "classifier":
        assert s.classes is not None  # a rule guarantees it
        x = g.add("pool", "pool", [x], "head", mode=s.pooling)
        g.set_output("logits", head(c, x, s.classes, None, name="head", category="head"))
    elif s.head == "pooled":
        g.set_output("pooler_output", pooler(c, x, s.pooling))
    elif s.head == "attention_pool":  # SigLIP: the probe's cross-attention over the (final-normed) tokens
        g.set_output("pooler_output", attention_pool(c, "head", x))
    elif s.head == "pooled_norm":  # CLIP vision: the blocks' output unnormed, the pooled token normed
        h = g.add("pool", "pool", [x], "head", mode=s.pooling)
        g.set_output("pooler_output", norm(c, "pool_norm", h, None))
    return g
