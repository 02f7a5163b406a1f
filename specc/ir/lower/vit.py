"""Lowering of a Vision Transformer: patch embedding, class token, 2-D positions, blocks, classifier or pooled head."""

from __future__ import annotations

from ...spec import resolve
from ...spec.schema import ViTSpec
from ..graph import LayerGraph
from .blocks import attention_pool, stack
from .context import Context, embed_norm_dropout, graph_meta, head, linear, norm, pooler


def lower_vit(s: ViTSpec) -> LayerGraph:
    im = s.image
    g = LayerGraph(
        meta=graph_meta(
            s,
            "vit",
            "image_classification" if s.head == "classifier" else "image_encoder",
            s.blocks,
            classes=s.classes,
            image=im.size,
            channels=im.channels,
            tokens=tokens(s),
        )
    )
    px = g.add_input("pixel_values", ("B", im.channels, im.size, im.size), "float32")
    c = Context(g, s, None, None)
    x, pooled = vit_tower(c, "", px)
    g.set_output("last_hidden_state", x)
    if s.head == "classifier":
        assert s.classes is not None  # a rule guarantees it
        x = g.add("pool", "pool", [x], "head", mode=s.pooling)
        g.set_output("logits", head(c, x, s.classes, None, name="head", category="head"))
    elif pooled is not None:
        g.set_output("image_embeds" if s.projection is not None else "pooler_output", pooled)
    return g


def tokens(s: ViTSpec) -> int:
    grid = s.image.size // s.image.patch
    return grid * grid + (1 if s.pooling == "cls" else 0)


def vit_tower(c: Context, p: str, px: str) -> tuple[str, str | None]:
    """The tower's ops under ``p`` (its scope prefix, "" alone): last_hidden_state and the pooled output (through
    the projection when the spec has one; None for head classifier or none)."""
    s, g, st = c.spec, c.g, c.stack
    assert isinstance(s, ViTSpec)
    im = s.image
    grid = im.size // im.patch
    x = g.add(
        "patch_embed",
        f"{p}patch_embed",
        [px],
        "embed",
        stack=st,
        channels=im.channels,
        patch=im.patch,
        dim=s.d_model,
        grid=grid,
        bias=im.patch_bias,
    )
    cls = s.pooling == "cls"
    if cls:
        x = g.add("cls_token", f"{p}cls_token", [x], "embed", stack=st, dim=s.d_model)
    pos = s.position.type
    if pos == "learned":
        x = g.add("learned_pos", f"{p}pos", [x], "pos", stack=st, positions=tokens(s), dim=s.d_model)
    elif pos == "learned_2d":
        x = g.add("learned_pos_2d", f"{p}pos", [x], "pos", stack=st, grid=grid, dim=s.d_model, cls=cls)
    elif pos in ("sinusoidal", "sinusoidal_2d"):
        x = g.add("sinusoidal_pos_2d", f"{p}pos", [x], "pos", stack=st, grid=grid, dim=s.d_model, cls=cls)
    x = embed_norm_dropout(c, x, p)
    x = stack(c, p, x, s.blocks, resolve.mask(s))
    pooled = None
    if s.head == "pooled":
        pooled = pooler(c, x, s.pooling, p)
    elif s.head == "attention_pool":  # SigLIP: the probe's cross-attention over the (final-normed) tokens
        pooled = attention_pool(c, f"{p}head", x)
    elif s.head == "pooled_norm":  # CLIP vision: the blocks' output unnormed, the pooled token normed
        h = g.add("pool", f"{p}pool", [x], "head", stack=st, mode=s.pooling)
        pooled = norm(c, f"{p}pool_norm", h, None)
    if pooled is not None and s.projection is not None:
        pr = s.projection
        pooled = linear(c, f"{p}projection", pooled, s.d_model, pr.dim, "head", None, pr.bias)
    return x, pooled
