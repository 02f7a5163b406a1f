"""RoBERTa (``RobertaModel``: pooled head; ``RobertaForMaskedLM``: MLM head): BERT's encoder under ``roberta.``
with positions that start after the padding id and skip padding (``position: {type: learned, offset: pad + 1,
skip_padding: true}``), and an MLM head ``lm_head.dense → gelu → lm_head.layer_norm → decoder``.

DistilBERT (``DistilBertModel``, ``DistilBertForMaskedLM``): a post-norm encoder without token types or pooler,
``distilbert.transformer.layer.{i}.attention.{q,k,v,out}_lin``, ``sa_layer_norm``, ``ffn.lin1 / lin2``,
``output_layer_norm``; MLM head ``vocab_transform → act → vocab_layer_norm → vocab_projector``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_bert import encoder_spec
from .hf_config import HFConfig
from .name_table import Table
from .name_table import plan as table_plan
from .weight_map import Plan

_ROBERTA_HEADS = {"RobertaModel": "pooled", "RobertaForMaskedLM": "mlm"}
_DISTIL_HEADS = {"DistilBertModel": "none", "DistilBertForMaskedLM": "mlm"}


def roberta_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    cfg.expect("is_decoder", False, False, "a causal RoBERTa is not an encoder")
    cfg.expect("add_cross_attention", False, False, "cross-attention in an encoder-only model")
    cfg.expect("position_embedding_type", "absolute", "absolute", "relative position scores")
    pad = cfg.get("pad_token_id", 1)
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
        raise cfg.refuse("pad_token_id", f"expected a whole number ≥ 0 (positions start after it), got {pad!r}")
    rows = cfg.positive_int("max_position_embeddings")
    if rows <= pad + 1:
        raise cfg.refuse("max_position_embeddings", f"{rows} rows leave no position after the padding id {pad}")
    cfg.notes.append(
        "positions count the tokens attention_mask marks (HF: input_ids != pad_token_id); they agree when padding "
        "is masked"
    )
    position = {"type": "learned", "offset": pad + 1, "skip_padding": True}
    # RobertaLMHead applies gelu whatever hidden_act says
    return encoder_spec(cfg, _ROBERTA_HEADS[arch], rows - pad - 1, position, head_activation="gelu")


def distilbert_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    if cfg.flag("sinusoidal_pos_embds", False):
        raise cfg.refuse("sinusoidal_pos_embds", "fixed sinusoidal tables held as frozen parameters are not supported")
    cfg.ignore("pad_token_id", "qa_dropout", "seq_classif_dropout")  # a row's gradient; task heads' dropout
    act = cfg.activation("activation", "gelu")
    head = _DISTIL_HEADS[arch]
    return {
        "kind": "encoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings"),
        "d_model": cfg.positive_int("dim"),
        "blocks": cfg.positive_int("n_layers"),
        "attention": {"heads": cfg.positive_int("n_heads"), "mask": "padding"},
        "norm": {"type": "layernorm", "placement": "post", "eps": 1e-12, "embedding": True},
        "mlp": {"type": "classic", "hidden": cfg.positive_int("hidden_dim"), "activation": act},
        "position": "learned",
        "head": head,
        "head_activation": act,
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": head == "mlm"},
        **cfg.training(embedding="dropout", attention="attention_dropout", residual="dropout"),
    }


_L = "{p}encoder.layer.*."
ROBERTA = Table(
    "RoBERTa",
    {
        "lm_head.bias": ["lm_head.bias", "lm_head.decoder.bias"],
        "lm_head.weight": "lm_head.decoder.weight",
        "embed.weight": "{p}embeddings.word_embeddings.weight",
        "pos.weight": "{p}embeddings.position_embeddings.weight",
        "token_type.weight": "{p}embeddings.token_type_embeddings.weight",
        "embed_norm.{k}": "{p}embeddings.LayerNorm.{k}",
        "pooler.dense.{k}": "{p}pooler.dense.{k}",
        "mlm.transform.{k}": "lm_head.dense.{k}",
        "mlm.norm.{k}": "lm_head.layer_norm.{k}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{_L}attention.self.{x}.{{k}}" for x in ("query", "key", "value"))),
        "blocks.*.attn.out.{k}": f"{_L}attention.output.dense.{{k}}",
        "blocks.*.norm1.{k}": f"{_L}attention.output.LayerNorm.{{k}}",
        "blocks.*.mlp.fc1.{k}": f"{_L}intermediate.dense.{{k}}",
        "blocks.*.mlp.fc2.{k}": f"{_L}output.dense.{{k}}",
        "blocks.*.norm2.{k}": f"{_L}output.LayerNorm.{{k}}",
    },
    prefix="roberta.",
    ignore=(r"embeddings\.(position_ids|token_type_ids)$",),
)

_T = "{p}transformer.layer.*."
DISTILBERT = Table(
    "DistilBERT",
    {
        "lm_head.bias": "vocab_projector.bias",
        "lm_head.weight": "vocab_projector.weight",
        "embed.weight": "{p}embeddings.word_embeddings.weight",
        "pos.weight": "{p}embeddings.position_embeddings.weight",
        "embed_norm.{k}": "{p}embeddings.LayerNorm.{k}",
        "mlm.transform.{k}": "vocab_transform.{k}",
        "mlm.norm.{k}": "vocab_layer_norm.{k}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{_T}attention.{x}_lin.{{k}}" for x in "qkv")),
        "blocks.*.attn.out.{k}": f"{_T}attention.out_lin.{{k}}",
        "blocks.*.norm1.{k}": f"{_T}sa_layer_norm.{{k}}",
        "blocks.*.mlp.fc1.{k}": f"{_T}ffn.lin1.{{k}}",
        "blocks.*.mlp.fc2.{k}": f"{_T}ffn.lin2.{{k}}",
        "blocks.*.norm2.{k}": f"{_T}output_layer_norm.{{k}}",
    },
    prefix="distilbert.",
    ignore=(r"embeddings\.position_ids$",),
)


def roberta_detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"roberta\.encoder\.layer\.\d+\.attention\.self\.query\.weight", n) for n in names)


def distilbert_detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(distilbert\.)?transformer\.layer\.\d+\.attention\.q_lin\.weight", n) for n in names)


def roberta_plan(g: LayerGraph, names: set[str]) -> Plan:
    built = set(g.params())
    tied = [("lm_head.bias", "lm_head.decoder.bias")]
    if "lm_head.weight" not in built and "lm_head.bias" in built:
        tied.append(("{p}embeddings.word_embeddings.weight", "lm_head.decoder.weight"))
    dropped = [r"^{p}pooler\."] if "pooler.dense.weight" not in built else []
    dropped += [r"^lm_head\."] if "mlm.transform.weight" not in built else []
    return table_plan(replace(ROBERTA, tied=tuple(tied), dropped=tuple(dropped)), g, names)


def distilbert_plan(g: LayerGraph, names: set[str]) -> Plan:
    built = set(g.params())
    tied = [("{p}embeddings.word_embeddings.weight", "vocab_projector.weight")] if "lm_head.weight" not in built else []
    dropped = [r"^vocab_(transform|layer_norm|projector)\."] if "mlm.transform.weight" not in built else []
    return table_plan(replace(DISTILBERT, tied=tuple(tied), dropped=tuple(dropped)), g, names)


ROBERTA_FAMILY = Family(
    "RoBERTa", tuple(_ROBERTA_HEADS), ("roberta",), ("encoder",), roberta_spec, roberta_detect, roberta_plan
)
DISTILBERT_FAMILY = Family(
    "DistilBERT",
    tuple(_DISTIL_HEADS),
    ("distilbert",),
    ("encoder",),
    distilbert_spec,
    distilbert_detect,
    distilbert_plan,
)
