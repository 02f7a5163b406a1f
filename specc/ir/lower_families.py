"""Lowering of each model family (decoder, encoder, encoder-decoder, ViT, RNN seq2seq) onto the shared
block helpers of ``lower.py``."""

from __future__ import annotations

from ..spec import resolve
from ..spec.schema import DecoderSpec, EncoderDecoderSpec, EncoderSpec, RNNSeq2SeqSpec, ViTSpec
from .graph import LayerGraph
from .lower import _Ctx, _embed_norm_dropout, _embed_tail, _head, _linear, _meta, _pooler, _stack, _text_facts


def _decoder(s: DecoderSpec) -> LayerGraph:
    # A decoder's positions follow its padding mask (a left-padded row computes what it would alone, as HF's
    # generate counts them); every backend reads this fact instead of deciding it again.
    meta = _meta(s, "decoder", "causal_lm", s.blocks, **_text_facts(s), positions_follow="attention_mask")
    g = LayerGraph(meta=meta)
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    c = _Ctx(g, s, None, pad)
    x = g.add("embedding", "embed", [ids], "embed", vocab=s.vocab_size, dim=s.d_model, scale=resolve.embedding_scale(s))
    x = _embed_tail(c, x, "", s.context)
    x = _stack(c, "", x, s.blocks, resolve.mask(s))
    g.set_output("logits", _head(c, x, s.vocab_size, "embed.weight" if s.tie_embeddings else None))
    return g


def _encoder(s: EncoderSpec) -> LayerGraph:
    task = {"mlm": "masked_lm", "pooled": "pooled_encoder", "none": "encoder"}[s.head]
    g = LayerGraph(
        meta=_meta(s, "encoder", task, s.blocks, **_text_facts(s), type_vocab_size=s.type_vocab_size or None)
    )
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    c = _Ctx(g, s, None, pad)
    x = g.add("embedding", "embed", [ids], "embed", vocab=s.vocab_size, dim=s.d_model, scale=resolve.embedding_scale(s))
    if s.position.type == "learned":
        x = g.add("learned_pos", "pos", [x], "pos", positions=s.context, dim=s.d_model)
    elif s.position.type == "sinusoidal":
        x = g.add("sinusoidal_pos", "pos", [x], "pos", dim=s.d_model)
    if s.type_vocab_size:
        types = g.add_input("token_type_ids", ("B", "N"), "int64", optional=True)
        x = g.add("type_embedding", "token_type", [x, types], "embed", vocab=s.type_vocab_size, dim=s.d_model)
    x = _embed_norm_dropout(c, x, "")
    x = _stack(c, "", x, s.blocks, resolve.mask(s))
    g.set_output("last_hidden_state", x)
    if s.head == "mlm":
        h = _linear(c, "mlm.transform", x, s.d_model, s.d_model, "head", None, s.bias.mlp)
        h = g.add("activation", "mlm.act", [h], "activation", fn=s.head_activation)
        h = g.add("layernorm", "mlm.norm", [h], "norm", dim=s.d_model, eps=s.norm.eps, bias=s.bias.norm)
        g.set_output("logits", _head(c, h, s.vocab_size, "embed.weight" if s.tie_embeddings else None))
    elif s.head == "pooled":
        g.set_output("pooler_output", _pooler(c, x, "cls"))
    return g


def _encoder_decoder(s: EncoderDecoderSpec) -> LayerGraph:
    tv = s.target_vocab_size or s.vocab_size
    layers = s.blocks.encoder + s.blocks.decoder
    g = LayerGraph(meta=_meta(s, "encoder_decoder", "seq2seq", layers, **_text_facts(s), target_vocab_size=tv))
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    dec_ids = g.add_input("decoder_input_ids", ("B", "N_dec"), "int64")
    scale = resolve.embedding_scale(s)
    enc = _Ctx(g, s, "encoder", pad)
    x = g.add(
        "embedding", "encoder.embed", [ids], "embed", stack="encoder", vocab=s.vocab_size, dim=s.d_model, scale=scale
    )
    x = _embed_tail(enc, x, "encoder.", s.context)
    memory = _stack(enc, "encoder.", x, s.blocks.encoder, resolve.mask(s))

    dec = _Ctx(g, s, "decoder", None)
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
    y = _embed_tail(dec, y, "decoder.", s.context)
    y = _stack(dec, "decoder.", y, s.blocks.decoder, "causal", memory=memory, mem_pad=pad)
    tied = (shared or "decoder.embed.weight") if s.tie_embeddings else None
    g.set_output("logits", _head(dec, y, tv, tied))
    return g


def _vit(s: ViTSpec) -> LayerGraph:
    im = s.image
    grid = im.size // im.patch
    tokens = grid * grid + (1 if s.pooling == "cls" else 0)
    g = LayerGraph(
        meta=_meta(
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
    c = _Ctx(g, s, None, None)
    x = g.add(
        "patch_embed",
        "patch_embed",
        [px],
        "embed",
        channels=im.channels,
        patch=im.patch,
        dim=s.d_model,
        grid=grid,
        bias=True,
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
    x = _embed_norm_dropout(c, x, "")
    x = _stack(c, "", x, s.blocks, resolve.mask(s))
    g.set_output("last_hidden_state", x)
    if s.head == "classifier":
        assert s.classes is not None  # a rule guarantees it
        x = g.add("pool", "pool", [x], "head", mode=s.pooling)
        g.set_output("logits", _head(c, x, s.classes, None, name="head", category="head"))
    elif s.head == "pooled":
        g.set_output("pooler_output", _pooler(c, x, s.pooling))
    return g


def _rnn_seq2seq(s: RNNSeq2SeqSpec) -> LayerGraph:
    r = s.rnn
    tv = s.target_vocab_size or s.vocab_size
    emb = r.embed or r.hidden
    enc_dim = r.hidden * (2 if r.bidirectional else 1)
    g = LayerGraph(
        meta=_meta(s, "rnn_seq2seq", "seq2seq", 0, context=s.context, vocab_size=s.vocab_size, target_vocab_size=tv)
    )
    ids = g.add_input("input_ids", ("B", "N"), "int64")
    pad = g.add_input("attention_mask", ("B", "N"), "int64", optional=True)
    dec_ids = g.add_input("decoder_input_ids", ("B", "N_dec"), "int64")
    x = g.add("embedding", "encoder.embed", [ids], "embed", stack="encoder", vocab=s.vocab_size, dim=emb, scale=1.0)
    h = g.add(
        "rnn",
        "encoder.rnn",
        [x, pad],
        "rnn",
        stack="encoder",
        cell=r.cell,
        input_size=emb,
        hidden=r.hidden,
        layers=r.layers,
        bidirectional=r.bidirectional,
    )
    y = g.add("embedding", "decoder.embed", [dec_ids], "embed", stack="decoder", vocab=tv, dim=emb, scale=1.0)
    y = g.add(
        "rnn_decoder",
        "decoder.rnn",
        [y, h, pad],
        "rnn",
        stack="decoder",
        cell=r.cell,
        input_size=emb,
        hidden=r.hidden,
        layers=r.layers,
        enc_dim=enc_dim,
        enc_directions=2 if r.bidirectional else 1,  # h_final = [forward h_T | backward h_1] when 2
        attention=r.attention,
        attention_dim=r.attention_dim or r.hidden,
    )
    out = g.add(
        "linear",
        "decoder.out",
        [y],
        "lm_head",
        stack="decoder",
        in_features=r.hidden + enc_dim,
        out_features=tv,
        bias=True,
    )
    g.set_output("logits", out)
    return g
