"""Lowering of a decoder-only language model (GPT-2, LLaMA, ...): embedding, blocks with a causal mask, LM head."""

from __future__ import annotations

from ...spec import resolve
from ...spec.schema import DecoderSpec
from ..graph import LayerGraph
from .blocks import stack
from .context import Context, embed_tail, graph_meta, head, text_facts


def lower_decoder(s: DecoderSpec) -> LayerGraph:
    # A decoder's positions follow its padding mask (a left-padded row computes what it would alone, as HF's
    # generate counts them); every backend reads this fact instead of deciding it again.
    meta = graph_meta(s, "decoder", "causal_lm", s.blocks, **text_facts(s), positions_follow="attention_mask")
    g = LayerGraph(meta=meta)
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    c = Context(g, s, None, pad)
    x = g.add("embedding", "embed", [ids], "embed", vocab=s.vocab_size, dim=s.d_model, scale=resolve.embedding_scale(s))
    x = embed_tail(c, x, "", s.context)
    x = stack(c, "", x, s.blocks, resolve.mask(s))
    g.set_output("logits", head(c, x, s.vocab_size, "embed.weight" if s.tie_embeddings else None))
    return g
