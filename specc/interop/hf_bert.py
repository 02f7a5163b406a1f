"""BERT (``BertModel``: pooled head; ``BertForMaskedLM``: MLM head): config → encoder spec; split
query/key/value → packed qkv, post-norm ``LayerNorm`` (or old ``gamma``/``beta``) names → specc names.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import HFConfig
from .name_table import Table
from .name_table import plan as table_plan
from .weight_map import Plan

_HEADS = {"BertModel": "pooled", "BertForMaskedLM": "mlm"}


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    cfg.expect("is_decoder", False, False, "a causal BERT is not an encoder")
    cfg.expect("add_cross_attention", False, False, "cross-attention in an encoder-only model")
    cfg.expect("position_embedding_type", "absolute", "absolute", "relative position scores")
    cfg.ignore("pad_token_id")  # only freezes a row's gradient
    context = cfg.positive_int("max_position_embeddings")
    return encoder_spec(cfg, _HEADS[arch], context, "learned")


def encoder_spec(
    cfg: HFConfig, head: str, context: int, position: Any, head_activation: str | None = None
) -> dict[str, Any]:
    """BERT's post-norm encoder; RoBERTa differs only in its position table and its MLM head's activation."""
    act = cfg.activation("hidden_act", "gelu")
    return {
        "kind": "encoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": context,
        "type_vocab_size": cfg.positive_int("type_vocab_size", 2),
        "d_model": cfg.positive_int("hidden_size"),
        "blocks": cfg.positive_int("num_hidden_layers"),
        "attention": {"heads": cfg.positive_int("num_attention_heads"), "mask": "padding"},
        "norm": {
            "type": "layernorm",
            "placement": "post",
            "eps": cfg.number("layer_norm_eps", 1e-12),
            "embedding": True,
        },
        "mlp": {"type": "classic", "hidden": cfg.positive_int("intermediate_size"), "activation": act},
        "position": position,
        "head": head,
        "head_activation": head_activation or act,
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": head == "mlm"},
        **cfg.training(
            embedding="hidden_dropout_prob", attention="attention_probs_dropout_prob", residual="hidden_dropout_prob"
        ),
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(bert\.)?encoder\.layer\.\d+\.attention\.self\.query\.weight", n) for n in names)


_LN = ("{k}", "{tf}")  # LayerNorm weight / bias, or gamma / beta in checkpoints from TF conversions
_L = "{p}encoder.layer.*."
TABLE = Table(
    "BERT",
    {
        "lm_head.bias": ["cls.predictions.bias", "cls.predictions.decoder.bias"],
        "lm_head.weight": "cls.predictions.decoder.weight",
        "embed.weight": "{p}embeddings.word_embeddings.weight",
        "pos.weight": "{p}embeddings.position_embeddings.weight",
        "token_type.weight": "{p}embeddings.token_type_embeddings.weight",
        "embed_norm.{k}": [f"{{p}}embeddings.LayerNorm.{x}" for x in _LN],
        "pooler.dense.{k}": "{p}pooler.dense.{k}",
        "mlm.transform.{k}": "cls.predictions.transform.dense.{k}",
        "mlm.norm.{k}": [f"cls.predictions.transform.LayerNorm.{x}" for x in _LN],
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{_L}attention.self.{x}.{{k}}" for x in ("query", "key", "value"))),
        "blocks.*.attn.out.{k}": f"{_L}attention.output.dense.{{k}}",
        "blocks.*.norm1.{k}": [f"{_L}attention.output.LayerNorm.{x}" for x in _LN],
        "blocks.*.mlp.fc1.{k}": f"{_L}intermediate.dense.{{k}}",
        "blocks.*.mlp.fc2.{k}": f"{_L}output.dense.{{k}}",
        "blocks.*.norm2.{k}": [f"{_L}output.LayerNorm.{x}" for x in _LN],
    },
    prefix="bert.",
    ignore=(r"embeddings\.(position_ids|token_type_ids)$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    built = set(g.params())
    tied = [("cls.predictions.bias", "cls.predictions.decoder.bias")]
    if "lm_head.weight" not in built and "lm_head.bias" in built:
        tied.append(("{p}embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"))
    # heads of other BERT classes: next-sentence prediction, pooler or MLM when the spec lacks them
    dropped = [r"^cls\.seq_relationship\."]
    dropped += [r"^{p}pooler\."] if "pooler.dense.weight" not in built else []
    dropped += [r"^cls\.predictions\."] if "mlm.transform.weight" not in built else []
    return table_plan(replace(TABLE, tied=tuple(tied), dropped=tuple(dropped)), g, names)


FAMILY = Family("BERT", tuple(_HEADS), ("bert",), ("encoder",), spec, detect, plan)
