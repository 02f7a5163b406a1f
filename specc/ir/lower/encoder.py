"""Lowering of an encoder (BERT): embeddings with token types, bidirectional blocks, MLM or pooled head."""

from __future__ import annotations

from ...spec import resolve
from ...spec.schema import EncoderSpec
from ..graph import LayerGraph
from .blocks import stack
from .context import (
    Context,
    embed_norm_dropout,
    graph_meta,
    head,
    linear,
    pooler,
    pos_offset,
    relative_bias,
    text_facts,
)

TASKS = {"mlm": "masked_lm", "pooled": "pooled_encoder", "eos": "pooled_encoder", "last": "pooled_encoder"}


def lower_encoder(s: EncoderSpec) -> LayerGraph:
    follow = {"positions_follow": "attention_mask"} if s.position.skip_padding else {}
    g = LayerGraph(
        meta=graph_meta(
            s,
            "encoder",
            TASKS.get(s.head, "encoder"),
            s.blocks,
            **text_facts(s),
            type_vocab_size=s.type_vocab_size or None,
            **follow,
        )
    )
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    c = Context(g, s, None, pad)
    x, pooled = text_tower(c, "", ids)
    g.set_output("last_hidden_state", x)
    if s.head == "mlm":
        h = linear(c, "mlm.transform", x, s.d_model, s.d_model, "head", None, s.bias.mlp)
        h = g.add("activation", "mlm.act", [h], "activation", fn=s.head_activation)
        h = g.add("layernorm", "mlm.norm", [h], "norm", dim=s.d_model, eps=s.norm.eps, bias=s.bias.norm)
        g.set_output("logits", head(c, h, s.vocab_size, "embed.weight" if s.tie_embeddings else None))
    elif pooled is not None:
        g.set_output("text_embeds" if s.projection is not None else "pooler_output", pooled)
    return g


def text_tower(c: Context, p: str, ids: str) -> tuple[str, str | None]:
    """The tower's ops under ``p`` (its scope prefix, "" alone): last_hidden_state and the pooled output (through
    the projection when the spec has one; None for head mlm or none)."""
    s, g, st = c.spec, c.g, c.stack
    assert isinstance(s, EncoderSpec)
    c.ids = ids
    if s.position.type == "relative" and not s.position.per_layer:  # T5's encoder: one table, read by every layer
        c.bias = relative_bias(c, f"{p}rel_bias", bidirectional=True)
    x = g.add(
        "embedding",
        f"{p}embed",
        [ids],
        "embed",
        stack=st,
        vocab=s.vocab_size,
        dim=s.d_model,
        scale=resolve.embedding_scale(s),
    )
    if s.position.type == "learned":
        x = g.add("learned_pos", f"{p}pos", [x], "pos", stack=st, positions=s.context, dim=s.d_model, **pos_offset(s))
    elif s.position.type == "sinusoidal":
        x = g.add("sinusoidal_pos", f"{p}pos", [x], "pos", stack=st, dim=s.d_model)
    if s.type_vocab_size:
        types = g.add_input("token_type_ids", ("B", "N"), "int64", optional=True)
        x = g.add(
            "type_embedding", f"{p}token_type", [x, types], "embed", stack=st, vocab=s.type_vocab_size, dim=s.d_model
        )
    x = embed_norm_dropout(c, x, p)
    x = stack(c, p, x, s.blocks, resolve.mask(s))
    pooled = None
    if s.head == "pooled":
        pooled = pooler(c, x, "cls", p)
    elif s.head == "eos":  # CLIP text: the (final-normed) token at the EOS id
        eos = {"eos_token_id": s.eos_token} if s.eos_token is not None else {}
        pooled = g.add("pool", f"{p}pool", [x, ids], "head", stack=st, mode="eos", **eos)
    elif s.head == "last":  # SigLIP text: the (final-normed) last position, padded or not
        pooled = g.add("pool", f"{p}pool", [x], "head", stack=st, mode="last")
    if pooled is not None and s.projection is not None:
        pr = s.projection
        pooled = linear(c, f"{p}projection", pooled, s.d_model, pr.dim, "head", None, pr.bias)
    return x, pooled
