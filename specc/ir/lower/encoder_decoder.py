"""Lowering of an encoder-decoder Transformer (Vaswani 2017, BART, Marian): two stacks, the decoder
cross-attending to the encoder."""

from __future__ import annotations

from ...spec import resolve
from ...spec.schema import EncoderDecoderSpec
from ..graph import LayerGraph
from .blocks import stack
from .context import Context, embed_tail, graph_meta, head, relative_bias, text_facts


def lower_encoder_decoder(s: EncoderDecoderSpec) -> LayerGraph:
    tv = s.target_vocab_size or s.vocab_size
    layers = s.blocks.encoder + s.blocks.decoder
    task = "seq2seq" if s.head == "lm" else "seq2seq_hidden"  # none: the decoder's states, nothing to generate
    g = LayerGraph(meta=graph_meta(s, "encoder_decoder", task, layers, **text_facts(s), target_vocab_size=tv))
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    dec_ids = g.add_input("decoder_input_ids", ("B", "N_dec"), "int64")
    scale = resolve.embedding_scale(s)
    enc = Context(g, s, "encoder", pad, ids=ids)
    shared_bias = s.position.type == "relative" and not s.position.per_layer  # T5: one table per stack
    if shared_bias:
        enc.bias = relative_bias(enc, "encoder.rel_bias", bidirectional=True)
    x = g.add(
        "embedding", "encoder.embed", [ids], "embed", stack="encoder", vocab=s.vocab_size, dim=s.d_model, scale=scale
    )
    x = embed_tail(enc, x, "encoder.", s.context)
    memory = stack(enc, "encoder.", x, s.blocks.encoder, resolve.mask(s))

    dec = Context(g, s, "decoder", None, ids=dec_ids)
    if shared_bias:
        dec.bias = relative_bias(dec, "decoder.rel_bias", bidirectional=False)
    shared = "encoder.embed.weight" if s.shared_embeddings else None
    y = g.add(
        "embedding",
        "decoder.embed",
        [dec_ids],
        "embed",
        stack="decoder",
        vocab=tv,
        dim=s.d_model,
        scale=scale,
        **({"tied_to": shared} if shared else {}),
    )
    y = embed_tail(dec, y, "decoder.", s.context)
    y = stack(dec, "decoder.", y, s.blocks.decoder, "causal", memory=memory, mem_pad=pad)
    if s.head == "none":
        g.set_output("last_hidden_state", y)
        return g
    tied = (shared or "decoder.embed.weight") if s.tie_embeddings else None
    g.set_output("logits", head(dec, y, tv, tied))
    return g
