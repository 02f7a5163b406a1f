"""Lowering of an RNN sequence-to-sequence model (Bahdanau 2014 / Luong 2015): a recurrent encoder and a
decoder attending to its states."""

from __future__ import annotations

from ...spec.schema import RNNSeq2SeqSpec
from ..graph import LayerGraph
from .context import graph_meta


def lower_rnn_seq2seq(s: RNNSeq2SeqSpec) -> LayerGraph:
    r = s.rnn
    tv = s.target_vocab_size or s.vocab_size
    emb = r.embed or r.hidden
    enc_dim = r.hidden * (2 if r.bidirectional else 1)
    meta = graph_meta(s, "rnn_seq2seq", "seq2seq", 0, context=s.context, vocab_size=s.vocab_size, target_vocab_size=tv)
    g = LayerGraph(meta=meta)
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
