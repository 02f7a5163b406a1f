"""BART (``BartForConditionalGeneration``) and Marian (``MarianMTModel``): config → encoder_decoder spec.

BART: post-norm, learned positions in a table with 2 leading rows (HF's ``offset``: ``position: {type: learned,
offset: 2}``), a LayerNorm after the
embeddings, optional sqrt(d_model) embedding scale, ``final_logits_bias``. Marian: the same without the
embedding norm and with fixed sinusoidal positions. Split q/k/v → packed ``attn.qkv``; cross-attention k/v →
packed ``cross_attn.kv``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..errors import SpecError
from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import HFConfig
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan

BART_POSITION_OFFSET = 2


def _same(cfg: HFConfig, a: str, b: str) -> int:
    va, vb = cfg.positive_int(a), cfg.positive_int(b)
    if va != vb:
        raise cfg.refuse(b, f"{vb} differs from {a} {va}; specc uses one value for encoder and decoder")
    return va


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    marian = arch == "MarianMTModel"
    d = cfg.positive_int("d_model")
    heads = _same(cfg, "encoder_attention_heads", "decoder_attention_heads")
    hidden = _same(cfg, "encoder_ffn_dim", "decoder_ffn_dim")
    vocab = cfg.positive_int("vocab_size")
    tie = cfg.flag("tie_word_embeddings", True)
    # Fields old BART configs carry that transformers itself no longer reads (it always builds post-norm
    # with an embedding LayerNorm and 2 offset rows), and training-only ones.
    cfg.ignore("normalize_before", "add_final_layer_norm", "normalize_embedding", "static_position_embeddings")
    cfg.ignore("extra_pos_embeddings", "add_bias_logits", "encoder_layerdrop", "decoder_layerdrop", "num_hidden_layers")
    cfg.ignore("activation_dropout", "classif_dropout")
    cfg.expect("is_decoder", False, False, "a lone decoder is not an encoder-decoder")
    if marian:
        shared = cfg.flag("share_encoder_decoder_embeddings", True)
        target = cfg.positive_int("decoder_vocab_size", vocab)
        if shared and target != vocab:
            raise cfg.refuse("decoder_vocab_size", f"{target} differs from vocab_size {vocab} with shared embeddings")
    else:
        shared = tie  # BART ties encoder, decoder and head embeddings together or not at all
        target = vocab
    out: dict[str, Any] = {
        "kind": "encoder_decoder",
        "vocab_size": vocab,
        "context": cfg.positive_int("max_position_embeddings"),
        "d_model": d,
        "blocks": {"encoder": cfg.positive_int("encoder_layers"), "decoder": cfg.positive_int("decoder_layers")},
        "attention": {"heads": heads, "mask": "padding"},
        "norm": {"type": "layernorm", "placement": "post", "eps": 1e-5, "embedding": not marian},
        "mlp": {"type": "classic", "hidden": hidden, "activation": cfg.activation("activation_function", "gelu")},
        "position": "sinusoidal" if marian else {"type": "learned", "offset": BART_POSITION_OFFSET},
        "shared_embeddings": shared,
        "tie_embeddings": tie,
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": True},  # head: final_logits_bias
        **cfg.training(std="init_std", embedding="dropout", attention="attention_dropout", residual="dropout"),
    }
    if target != vocab:
        out["target_vocab_size"] = target
    cfg.notes.append("final_logits_bias (an HF buffer) loads as lm_head.bias, a parameter here")
    if marian:
        cfg.notes.append(
            "Marian's [sin | cos] position layout becomes specc's interleaved one by permuting the d_model axis of "
            "the weights on load (exact)"
        )
    if cfg.flag("scale_embedding", False):
        out["embedding_scale"] = "sqrt_d_model"
    return out


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?decoder\.layers\.\d+\.encoder_attn\.q_proj\.weight", n) for n in names)


_L = "{p}{s}.layers.*."
TABLE = Table(
    "BART/Marian",
    {
        "lm_head.weight": "lm_head.weight",
        "lm_head.bias": ("squeeze", "final_logits_bias"),
        "decoder.embed.weight": "{p}decoder.embed_tokens.weight",
        "{s}.pos.weight": "{p}{s}.embed_positions.weight",
        "{s}.embed_norm.{k}": "{p}{s}.layernorm_embedding.{k}",
        "{s}.norm_f.{k}": "{p}{s}.layer_norm.{k}",
        "{s}.blocks.*.attn.qkv.{k}": ("cat", *(f"{_L}self_attn.{x}_proj.{{k}}" for x in "qkv")),
        "{s}.blocks.*.attn.out.{k}": f"{_L}self_attn.out_proj.{{k}}",
        "{s}.blocks.*.norm1.{k}": f"{_L}self_attn_layer_norm.{{k}}",
        "{s}.blocks.*.cross_attn.q.{k}": f"{_L}encoder_attn.q_proj.{{k}}",
        "{s}.blocks.*.cross_attn.kv.{k}": ("cat", *(f"{_L}encoder_attn.{x}_proj.{{k}}" for x in "kv")),
        "{s}.blocks.*.cross_attn.out.{k}": f"{_L}encoder_attn.out_proj.{{k}}",
        "{s}.blocks.*.norm_cross.{k}": f"{_L}encoder_attn_layer_norm.{{k}}",
        "{s}.blocks.*.mlp.fc1.{k}": f"{_L}fc1.{{k}}",
        "{s}.blocks.*.mlp.fc2.{k}": f"{_L}fc2.{{k}}",
        "{s}.blocks.*.norm2.{k}": f"{_L}final_layer_norm.{{k}}",
    },
    prefix="model.",
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    shared = tied_head(g, "decoder.embed")
    learned = g.op("encoder.pos").kind == "learned_pos" if "encoder.pos" in g.graph else False
    own, common = "{p}encoder.embed_tokens.weight", "{p}shared.weight"
    rows = {"encoder.embed.weight": [common, own] if shared else [own, common], **TABLE.rows}
    if learned and not g.op("encoder.pos").attrs.offset:  # a spec without the leading rows: never read, dropped
        rows["{s}.pos.weight"] = (("rows", BART_POSITION_OFFSET), "{p}{s}.embed_positions.weight")
    head = ("lm_head.weight",) if tied_head(g) else ()
    if shared:  # one table: shared, both stacks' embed_tokens and (tied) the head
        tied = (("{p}shared.weight", "{p}encoder.embed_tokens.weight", "{p}decoder.embed_tokens.weight", *head),)
    else:
        tied = (("{p}decoder.embed_tokens.weight", *head),)
    # Marian's fixed sinusoid tables are recomputed by specc; untied BART keeps a ``shared`` table neither stack
    # reads (when a stack reads it, it is used, not ignored)
    ignore = () if learned else (r"embed_positions\.weight$",)
    ignore += () if shared else (r"^{p}shared\.weight$",)
    sinusoids = "encoder.pos" in g.graph and g.op("encoder.pos").kind == "sinusoidal_pos"
    after = marian_interleaving(g, list(g.params())) if sinusoids else {}
    return table_plan(replace(TABLE, rows=rows, tied=tied, ignore=ignore, after=after), g, names)


# ------------------------------------------------------------------------------------------ Marian positions
# Marian's sinusoids are [sin(p·w_0..w_{d/2-1}) | cos(p·w_0..)]; specc's (Vaswani) interleave them: specc dim
# 2k is Marian dim k, specc dim 2k+1 is Marian dim d/2+k. Every op is equivariant under a permutation of the
# residual stream (LayerNorm statistics ignore the order; linears absorb it in their weights), so permuting
# the d_model axis of every tensor that reads or writes the stream turns Marian into the same function with
# specc's table, exactly.

_READS = ("embed.weight", ".attn.qkv.weight", ".cross_attn.q.weight", ".cross_attn.kv.weight", ".mlp.fc1.weight")
_WRITES = (".attn.out.weight", ".attn.out.bias", ".cross_attn.out.weight", ".cross_attn.out.bias", ".mlp.fc2.weight")
_WRITES_TOO = (".mlp.fc2.bias",)
_NEITHER = (".attn.qkv.bias", ".cross_attn.q.bias", ".cross_attn.kv.bias", ".mlp.fc1.bias", "lm_head.bias")


def marian_interleaving(g: LayerGraph, targets: list[str]) -> dict[str, tuple[str, int]]:
    """target → ("interleave", axis) for every parameter that reads or writes the residual stream."""
    norms = {f"{op.name}.{k}" for op in g.ops() if op.kind in ("layernorm", "rmsnorm") for k in op.params}
    out: dict[str, tuple[str, int]] = {}
    for name in targets:
        if name in norms or name.endswith(_WRITES + _WRITES_TOO):
            out[name] = ("interleave", 0)
        elif name.endswith(_READS) or name == "lm_head.weight":
            out[name] = ("interleave", 1)
        elif not name.endswith(_NEITHER):  # a parameter this mapping does not know: refusing beats a wrong model
            raise SpecError(f"BART/Marian checkpoint: no rule to reorder {name} along the residual stream")
    return out


FAMILY = Family(
    "BART/Marian",
    ("BartForConditionalGeneration", "MarianMTModel"),
    ("bart", "marian"),
    ("encoder_decoder",),
    spec,
    detect,
    plan,
)
