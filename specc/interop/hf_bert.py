"""BERT (``BertModel``: pooled head; ``BertForMaskedLM``: MLM head): config → encoder spec; split
query/key/value → packed qkv, post-norm ``LayerNorm`` (or old ``gamma``/``beta``) names → specc names.
"""

from __future__ import annotations

import re
from typing import Any

from ..ir.graph import LayerGraph
from .family import BLOCK, Family, attention_sizes, prefix, rules_for
from .hf_config import HFConfig
from .weight_map import Plan, Rule, ShapeT, concat, copy

_BLOCK = {
    "attn.out": "attention.output.dense",
    "norm1": "attention.output.LayerNorm",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
    "norm2": "output.LayerNorm",
}
_TOP = {
    "embed": "embeddings.word_embeddings",
    "pos": "embeddings.position_embeddings",
    "token_type": "embeddings.token_type_embeddings",
    "embed_norm": "embeddings.LayerNorm",
    "pooler.dense": "pooler.dense",
}
_HEAD = {"mlm.transform": "cls.predictions.transform.dense", "mlm.norm": "cls.predictions.transform.LayerNorm"}
_HEADS = {"BertModel": "pooled", "BertForMaskedLM": "mlm"}


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    cfg.expect("is_decoder", False, False, "a causal BERT is not an encoder")
    cfg.expect("add_cross_attention", False, False, "cross-attention in an encoder-only model")
    cfg.expect("position_embedding_type", "absolute", "absolute", "relative position scores")
    cfg.ignore("pad_token_id")  # only freezes a row's gradient
    act = cfg.activation("hidden_act", "gelu")
    head = _HEADS[arch]
    return {
        "kind": "encoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings"),
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
        "position": "learned",
        "head": head,
        "head_activation": act,
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": head == "mlm"},
        "dropout": {
            "embedding": cfg.dropout("hidden_dropout_prob"),
            "attention": cfg.dropout("attention_probs_dropout_prob"),
            "residual": cfg.dropout("hidden_dropout_prob"),
        },
        "init": {"std": cfg.number("initializer_range", 0.02), "scaled_residual": False},
    }


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(bert\.)?encoder\.layer\.\d+\.attention\.self\.query\.weight", n) for n in names)


def _norm_or_old(src: str, kind: str, shape: ShapeT) -> list[Rule]:
    """LayerNorm ``weight``/``bias``, or ``gamma``/``beta`` in checkpoints from TF conversions."""
    old = {"weight": "gamma", "bias": "beta"}[kind]
    return [copy(f"{src}.{kind}", shape), copy(f"{src}.{old}", shape)]


def plan(g: LayerGraph, names: set[str]) -> Plan:
    p = prefix(names, "bert.")

    def make(target: str, shape: ShapeT) -> Rule | list[Rule] | None:
        local, kind = target.rsplit(".", 1)
        if target == "lm_head.bias":
            return [copy("cls.predictions.bias", shape), copy("cls.predictions.decoder.bias", shape)]
        if target == "lm_head.weight":
            return copy("cls.predictions.decoder.weight", shape)
        src = f"{p}{_TOP[local]}" if local in _TOP else _HEAD.get(local)
        m = BLOCK.fullmatch(local)
        if m:
            layer, rest = f"{p}encoder.layer.{m.group(2)}", m.group(3)
            if rest == "attn.qkv":
                split = [f"{layer}.attention.self.{x}.{kind}" for x in ("query", "key", "value")]
                return concat(split, shape, attention_sizes(g, target))
            src = f"{layer}.{_BLOCK[rest]}" if rest in _BLOCK else None
        if src is None:
            return None
        return _norm_or_old(src, kind, shape) if src.endswith("LayerNorm") else copy(f"{src}.{kind}", shape)

    built = set(g.params())
    tied = [("cls.predictions.bias", "cls.predictions.decoder.bias")]
    if "lm_head.weight" not in built and "lm_head.bias" in built:
        tied.append((f"{p}embeddings.word_embeddings.weight", "cls.predictions.decoder.weight"))

    # heads of other BERT classes: next-sentence prediction, pooler or MLM when the spec lacks them
    dropped = [r"^cls\.seq_relationship\."]
    dropped += [f"^{re.escape(p)}pooler\\."] if "pooler.dense.weight" not in built else []
    dropped += [r"^cls\.predictions\."] if "mlm.transform.weight" not in built else []

    return Plan(
        "BERT",
        rules_for(g, "BERT", make),
        tied=tied,
        ignore=r"embeddings\.(position_ids|token_type_ids)$",
        dropped="|".join(dropped),
    )


FAMILY = Family("BERT", tuple(_HEADS), ("bert",), ("encoder",), spec, detect, plan)
