"""Lowering of an encoder-decoder Transformer (Vaswani 2017, BART, Marian, T5, Whisper): two stacks, the decoder
cross-attending to the encoder, whose input is token ids or (Whisper) audio features."""

from __future__ import annotations

from ...spec import resolve
from ...spec.schema import EncoderDecoderSpec
from ..graph import LayerGraph
from .blocks import stack
from .context import Context, embed_norm_dropout, embed_tail, graph_meta, head, relative_bias, text_facts


def lower_encoder_decoder(s: EncoderDecoderSpec) -> LayerGraph:
    tv = s.target_vocab_size or s.vocab_size
    layers = s.blocks.encoder + s.blocks.decoder
    task = "seq2seq" if s.head == "lm" else "seq2seq_hidden"  # none: the decoder's states, nothing to generate
    facts = {**text_facts(s), "target_vocab_size": tv}
    if s.decoder_start_token is not None:  # generation's default first decoder token
        facts["decoder_start_token_id"] = s.decoder_start_token
    if s.audio is not None:  # the analyzer's default lengths: the audio frames, the decoder's table
        facts.update(tokens=s.audio.positions, dec_tokens=s.context)
    g = LayerGraph(meta=graph_meta(s, "encoder_decoder", task, layers, **facts))
    scale = resolve.embedding_scale(s)
    shared_bias = s.position.type == "relative" and not s.position.per_layer  # T5: one table per stack
    if s.audio is not None:
        ids, pad = None, None
        enc = Context(g, s, "encoder", None)
        memory = stack(enc, "encoder.", _audio_frontend(enc), s.blocks.encoder, resolve.mask(s))
    else:
        ids = g.add_input("input_ids", ("B", "N"), "int64")
        pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
        enc = Context(g, s, "encoder", pad, ids=ids)
        if shared_bias:
            enc.bias = relative_bias(enc, "encoder.rel_bias", bidirectional=True)
        x = g.add(
            "embedding",
            "encoder.embed",
            [ids],
            "embed",
            stack="encoder",
            vocab=s.vocab_size,
            dim=s.d_model,
            scale=scale,
        )
        x = embed_tail(enc, x, "encoder.", s.context)
        memory = stack(enc, "encoder.", x, s.blocks.encoder, resolve.mask(s))
    dec_ids = g.add_input("decoder_input_ids", ("B", "N_dec"), "int64")

    dec = Context(g, s, "decoder", None, ids=dec_ids)
    if shared_bias:
        dec.bias = relative_bias(dec, "decoder.rel_bias", bidirectional=False)
    shared = "encoder.embed.weight" if s.shared_embeddings and ids is not None else None
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


def _audio_frontend(c: Context) -> str:
    """Whisper: input_features [B, mel, 2N] → gelu(conv1) → gelu(conv2, stride 2) as tokens [B, N, D] + the
    sinusoid table (the padding is the convolutions' own: kernel 3, padding 1)."""
    s, g, d = c.spec, c.g, c.d
    audio = s.audio
    assert audio is not None
    feats = g.add_input("input_features", ("B", audio.mel_bins, "2*N"), "float32")
    x = g.add(
        "conv1d",
        "encoder.conv1",
        [feats],
        "embed",
        stack="encoder",
        in_channels=audio.mel_bins,
        out_channels=d,
        kernel=3,
        padding=1,
    )
    x = g.add("activation", "encoder.act1", [x], "activation", stack="encoder", fn="gelu")
    x = g.add(
        "conv1d",
        "encoder.conv2",
        [x],
        "embed",
        stack="encoder",
        in_channels=d,
        out_channels=d,
        kernel=3,
        stride=2,
        padding=1,
        tokens_out=True,
    )
    x = g.add("activation", "encoder.act2", [x], "activation", stack="encoder", fn="gelu")
    x = g.add("sinusoid_table", "encoder.pos", [x], "pos", stack="encoder", positions=audio.positions, dim=d)
    return embed_norm_dropout(c, x, "encoder.")
