"""Lowering of an encoder (BERT): embeddings with token types, bidirectional blocks, MLM or pooled head."""

from __future__ import annotations

from ...spec import resolve
from ...spec.schema import EncoderSpec
from ..graph import LayerGraph
from .blocks import stack
from .context import Context, embed_norm_dropout, graph_meta, head, linear, pooler, pos_offset, text_facts


def lower_encoder(s: EncoderSpec) -> LayerGraph:
    task = {"mlm": "masked_lm", "pooled": "pooled_encoder", "eos": "pooled_encoder", "none": "encoder"}[s.head]
    follow = {"positions_follow": "attention_mask"} if s.position.skip_padding else {}
    g = LayerGraph(
        meta=graph_meta(
            s, "encoder", task, s.blocks, **text_facts(s), type_vocab_size=s.type_vocab_size or None, **follow
        )
    )
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    c = Context(g, s, None, pad)
    x = g.add("embedding", "embed", [ids], "embed", vocab=s.vocab_size, dim=s.d_model, scale=resolve.embedding_scale(s))
    if s.position.type == "learned":
        x = g.add("learned_pos", "pos", [x], "pos", positions=s.context, dim=s.d_model, **pos_offset(s))
    elif s.position.type == "sinusoidal":
        x = g.add("sinusoidal_pos", "pos", [x], "pos", dim=s.d_model)
    if s.type_vocab_size:
        types = g.add_input("token_type_ids", ("B", "N"), "int64", optional=True)
        x = g.add("type_embedding", "token_type", [x, types], "embed", vocab=s.type_vocab_size, dim=s.d_model)
    x = embed_norm_dropout(c, x, "")
    x = stack(c, "", x, s.blocks, resolve.mask(s))
    g.set_output("last_hidden_state", x)
    if s.head == "mlm":
        h = linear(c, "mlm.transform", x, s.d_model, s.d_model, "head", None, s.bias.mlp)
        h = g.add("activation", "mlm.act", [h], "activation", fn=s.head_activation)
        h = g.add("layernorm", "mlm.norm", [h], "norm", dim=s.d_model, eps=s.norm.eps, bias=s.bias.norm)
        g.set_output("logits", head(c, h, s.vocab_size, "embed.weight" if s.tie_embeddings else None))
    elif s.head == "pooled":
        g.set_output("pooler_output", pooler(c, x, "cls"))
    elif s.head == "eos":  # CLIP text: the (final-normed) token at the EOS id
        eos = {"eos_token_id": s.eos_token} if s.eos_token is not None else {}
        g.set_output("pooler_output", g.add("pool", "pool", [x, ids], "head", mode="eos", **eos))
    return g
