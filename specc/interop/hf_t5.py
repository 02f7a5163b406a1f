"""T5 (``T5ForConditionalGeneration``), mT5 and UMT5: config → encoder_decoder spec with relative positions.

Pre-norm RMSNorms (T5LayerNorm: no mean, no bias), no biases anywhere, unscaled scores (1/√d is folded into the
weights: ``attention.scale: 1``), a head size ``d_kv`` of its own, a bucketed relative position bias
(``position: relative``) held by layer 0 of each stack and read by all (T5, mT5) or one per layer (UMT5),
``feed_forward_proj`` relu (T5 v1.0) or gated-gelu (v1.1, flan: a gated MLP over gelu_new), one ``shared``
table for both stacks, and, as transformers 5 computes it, the decoder output scaled by d_model^-½ before the head
(``output.scale``) where ``scale_decoder_outputs`` says so, or, without it, when ``tie_word_embeddings`` is not false
(T5, UMT5; mT5 never scales).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import ACTIVATIONS, HFConfig
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan


def _mlp(cfg: HFConfig, hidden: int) -> dict[str, Any]:
    """``feed_forward_proj`` as transformers reads it: "[gated-]act", gated-gelu meaning gelu_new."""
    proj = cfg.get("feed_forward_proj", "relu")
    if not isinstance(proj, str):
        raise cfg.refuse("feed_forward_proj", 'expected a name such as "relu" or "gated-gelu"')
    parts = proj.split("-")
    gated = parts[0] == "gated" and len(parts) == 2
    if len(parts) > 1 and not gated:
        raise cfg.refuse("feed_forward_proj", f"{proj!r} is not `gated-{{ACT}}` or `{{ACT}}`")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    if act not in ACTIVATIONS:
        raise cfg.refuse("feed_forward_proj", f"activation {act!r} has no exact counterpart in specc",
                         f"supported: {', '.join(sorted(ACTIVATIONS))}")  # fmt: skip
    mlp: dict[str, Any] = {"type": "swiglu" if gated else "classic", "hidden": hidden, "activation": ACTIVATIONS[act]}
    return mlp


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    d = cfg.positive_int("d_model")
    layers = cfg.positive_int("num_layers")
    mt5 = arch.startswith("MT5")
    tie = cfg.flag("tie_word_embeddings", not mt5)  # a head of its own is stored when false (flan-T5, mT5)
    cfg.expect("is_decoder", False, False, "a lone decoder is not an encoder-decoder")
    cfg.ignore("dense_act_fn", "is_gated_act", "scalable_attention", "n_positions", "gradient_checkpointing")
    cfg.ignore("initializer_factor", "layer_norm_eps")  # init only; T5 reads layer_norm_epsilon
    if not arch.endswith("ForConditionalGeneration"):  # T5Model: the decoder's states, no head
        cfg.ignore("tie_word_embeddings", "scale_decoder_outputs")
    doc: dict[str, Any] = {
        "kind": "encoder_decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("n_positions", 512),  # relative positions have no table: a runtime bound only
        "d_model": d,
        "blocks": {"encoder": layers, "decoder": cfg.positive_int("num_decoder_layers", layers)},
        "attention": {
            "heads": cfg.positive_int("num_heads"),
            "head_dim": cfg.positive_int("d_kv"),
            "scale": 1.0,  # transformers' T5 does not scale the scores (1/√d_kv is folded into the weights)
            "mask": "padding",
        },
        "norm": {"type": "rmsnorm", "placement": "pre", "eps": cfg.number("layer_norm_epsilon", 1e-6)},
        "mlp": _mlp(cfg, cfg.positive_int("d_ff")),
        "position": {
            "type": "relative",
            "buckets": cfg.positive_int("relative_attention_num_buckets", 32),
            "max_distance": cfg.positive_int("relative_attention_max_distance", 128),
            "per_layer": arch.startswith("UMT5"),
        },
        "shared_embeddings": True,
        "tie_embeddings": tie,
        "bias": False,
        **cfg.training(embedding="dropout_rate", attention="dropout_rate", residual="dropout_rate"),
    }
    # transformers' T5 and UMT5 scale the decoder output by d_model^-½ (mT5 never does): as the saved
    # scale_decoder_outputs says (5.x writes it, and then always tie_word_embeddings: true), else when tied
    scale = not mt5 and cfg.flag("scale_decoder_outputs", tie)
    if mt5:
        cfg.ignore("scale_decoder_outputs")
    if not arch.endswith("ForConditionalGeneration"):
        return {**{k: v for k, v in doc.items() if k != "tie_embeddings"}, "head": "none"}
    if scale:
        doc["output"] = {"scale": d**-0.5}
    return doc


def detect(names: set[str]) -> bool:
    return _t5_names(names) and any(n.startswith("decoder.") for n in names)


def _t5_names(names: set[str]) -> bool:
    return any(re.fullmatch(r"(encoder\.)?block\.0\.layer\.0\.SelfAttention\.q\.weight", n) for n in names)


_A = "{s}.block.*.layer.0.SelfAttention."
_X = "decoder.block.*.layer.1.EncDecAttention."
TABLE = Table(
    "T5",
    {
        "lm_head.weight": "lm_head.weight",
        "decoder.embed.weight": "decoder.embed_tokens.weight",
        "{s}.rel_bias.weight": "{s}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "{s}.blocks.*.attn.rel_bias.weight": f"{_A}relative_attention_bias.weight",
        "{s}.norm_f.weight": "{s}.final_layer_norm.weight",
        "{s}.blocks.*.norm1.weight": "{s}.block.*.layer.0.layer_norm.weight",
        "{s}.blocks.*.attn.qkv.weight": ("cat", *(f"{_A}{x}.weight" for x in "qkv")),
        "{s}.blocks.*.attn.out.weight": f"{_A}o.weight",
        "decoder.blocks.*.norm_cross.weight": "decoder.block.*.layer.1.layer_norm.weight",
        "decoder.blocks.*.cross_attn.q.weight": f"{_X}q.weight",
        "decoder.blocks.*.cross_attn.kv.weight": ("cat", f"{_X}k.weight", f"{_X}v.weight"),
        "decoder.blocks.*.cross_attn.out.weight": f"{_X}o.weight",
        "encoder.blocks.*.norm2.weight": "encoder.block.*.layer.1.layer_norm.weight",
        "decoder.blocks.*.norm2.weight": "decoder.block.*.layer.2.layer_norm.weight",
        **{
            f"{s}.blocks.*.mlp.{ours}.weight": f"{s}.block.*.layer.{n}.DenseReluDense.{theirs}.weight"
            for s, n in (("encoder", 1), ("decoder", 2))
            for ours, theirs in (("fc1", "wi"), ("fc2", "wo"), ("gate", "wi_0"), ("up", "wi_1"), ("down", "wo"))
        },
    },
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    head = ("lm_head.weight",) if "lm_head" in g.graph and tied_head(g) else ()  # T5Model has no head
    tied = (("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", *head),)
    rows = {"encoder.embed.weight": ["shared.weight", "encoder.embed_tokens.weight"], **TABLE.rows}
    return table_plan(replace(TABLE, rows=rows, tied=tied), g, names)


FAMILY = Family(
    "T5",
    (
        "T5ForConditionalGeneration",
        "MT5ForConditionalGeneration",
        "UMT5ForConditionalGeneration",
        "T5Model",
        "MT5Model",
        "UMT5Model",
    ),
    ("t5", "mt5", "umt5"),
    ("encoder_decoder",),
    spec,
    detect,
    plan,
)


def encoder_spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    """``T5EncoderModel`` (and mT5's, UMT5's): the encoder stack alone as an encoder spec with relative positions,
    its ``last_hidden_state`` the output (``head: none``), the shared table its token embedding."""
    doc = spec(cfg, arch.replace("EncoderModel", "ForConditionalGeneration"))
    cfg.ignore("num_decoder_layers", "tie_word_embeddings", "scale_decoder_outputs")  # the decoder's and the head's
    drop = ("kind", "blocks", "shared_embeddings", "tie_embeddings", "output")
    return {"kind": "encoder", **{k: v for k, v in doc.items() if k not in drop}, "blocks": doc["blocks"]["encoder"],
            "head": "none"}  # fmt: skip


def _encoder_rows() -> dict[str, Any]:
    """The encoder stack's rows of ``TABLE``, its names without the ``encoder.`` scope (a graph of one stack)."""

    def fill(alt: Any) -> Any:
        return alt.replace("{s}", "encoder") if isinstance(alt, str) else (alt[0], *(fill(n) for n in alt[1:]))

    rows: dict[str, Any] = {"embed.weight": ["shared.weight", "encoder.embed_tokens.weight"]}
    for key, alt in TABLE.rows.items():
        for scope in ("{s}.", "encoder."):
            if key.startswith(scope):
                rows[key.removeprefix(scope)] = fill(alt)
    return rows


ENCODER_TABLE = Table("T5 encoder", _encoder_rows(), tied=(("shared.weight", "encoder.embed_tokens.weight"),))


def encoder_detect(names: set[str]) -> bool:
    return _t5_names(names) and not any(n.startswith("decoder.") for n in names)


def encoder_plan(g: LayerGraph, names: set[str]) -> Plan:
    return table_plan(ENCODER_TABLE, g, names)


ENCODER_FAMILY = Family(
    "T5 encoder",
    ("T5EncoderModel", "MT5EncoderModel", "UMT5EncoderModel"),
    ("t5", "mt5", "umt5"),
    ("encoder",),
    encoder_spec,
    encoder_detect,
    encoder_plan,
)
