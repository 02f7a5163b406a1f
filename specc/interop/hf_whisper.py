"""Whisper (``WhisperForConditionalGeneration``; ``WhisperModel``, the same without its head: ``head: none``): config
→ encoder_decoder spec with the audio front-end.

The encoder reads ``input_features`` [B, num_mel_bins, 2 · max_source_positions] through two Conv1d + GELU (the
second of stride 2) and adds a fixed sinusoid table (``audio``); the decoder has learned positions of
``max_target_positions`` rows and a head tied to its embedding. Pre-norm LayerNorm blocks with a final norm in
each stack, biases everywhere but the key projections (``bias.k: false``) and the head. Both dialects of
config.json: the hub's older files (``num_hidden_layers`` beside ``encoder_layers``, generation settings such as
``forced_decoder_ids`` and ``max_length``, which specc leaves to the caller) and transformers 5's.
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

# transformers' WhisperConfig.attribute_map: the generic names, which older config.json files also write
_ALIASES = {
    "d_model": "hidden_size",
    "encoder_layers": "num_hidden_layers",
    "encoder_attention_heads": "num_attention_heads",
}


def _size(cfg: HFConfig, key: str) -> int:
    """A size under its own name or (older files) its alias; both given, they must agree."""
    alias = _ALIASES.get(key)
    if cfg.get(key) is None and alias is not None and cfg.get(alias) is not None:
        return cfg.positive_int(alias)
    value = cfg.positive_int(key)
    if alias is not None and cfg.get(alias) is not None and cfg.positive_int(alias) != value:
        raise cfg.refuse(alias, f"{cfg.get(alias)} differs from {key} {value}, which transformers reads")
    return value


def _same(cfg: HFConfig, a: str, b: str) -> int:
    va, vb = _size(cfg, a), cfg.positive_int(b)
    if va != vb:
        raise cfg.refuse(b, f"{vb} differs from {a} {va}; specc uses one value for encoder and decoder")
    return va


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    d = _size(cfg, "d_model")
    cfg.expect("is_decoder", False, False, "a lone decoder is not an encoder-decoder")
    cfg.expect("use_weighted_layer_sum", False, False, "it weighs the layers of WhisperForAudioClassification")
    # generation settings (the older dialect keeps them in config.json; transformers 5 in generation_config.json),
    # training-only ones (layer drop; SpecAugment masks only in training), timestamps and the classifier's
    cfg.ignore("forced_decoder_ids", "max_length", "median_filter_width", "classifier_proj_size")
    cfg.ignore("encoder_layerdrop", "decoder_layerdrop", "activation_dropout", "apply_spec_augment")
    cfg.ignore(*(f"mask_{a}_{b}" for a in ("time", "feature") for b in ("prob", "length", "min_masks")))
    if cfg.flag("apply_spec_augment", False):
        cfg.notes.append("apply_spec_augment (SpecAugment masking of input_features, training only) is not applied")
    if cfg.flag("scale_embedding", False):  # transformers computes embed_scale and never multiplies by it
        cfg.notes.append("scale_embedding: true is ignored, as transformers' Whisper ignores it")
    start = cfg.get("decoder_start_token_id")
    vocab = cfg.positive_int("vocab_size")
    if start is not None and (not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < vocab):
        raise cfg.refuse("decoder_start_token_id", f"expected a token id below vocab_size {vocab}, got {start!r}")
    out: dict[str, Any] = {
        "kind": "encoder_decoder",
        "vocab_size": vocab,
        "context": cfg.positive_int("max_target_positions", 448),
        "d_model": d,
        "blocks": {"encoder": _size(cfg, "encoder_layers"), "decoder": cfg.positive_int("decoder_layers")},
        "attention": {"heads": _same(cfg, "encoder_attention_heads", "decoder_attention_heads"), "mask": "none"},
        "norm": {"type": "layernorm", "placement": "pre", "eps": 1e-5},
        "mlp": {
            "type": "classic",
            "hidden": _same(cfg, "encoder_ffn_dim", "decoder_ffn_dim"),
            "activation": cfg.activation("activation_function", "gelu"),
        },
        "position": "learned",
        "audio": {
            "mel_bins": cfg.positive_int("num_mel_bins", 80),
            "positions": cfg.positive_int("max_source_positions", 1500),
        },
        "tie_embeddings": cfg.flag("tie_word_embeddings", True),
        "bias": {"qkv": True, "k": False, "out": True, "mlp": True, "norm": True, "head": False},
        **cfg.training(std="init_std", embedding="dropout", attention="attention_dropout", residual="dropout"),
    }
    if start is not None:
        out["decoder_start_token"] = start
    if arch == "WhisperModel":  # no proj_out: the decoder's final-normed states
        out["head"] = "none"
    return out


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?encoder\.conv2\.weight", n) for n in names) and any(
        re.fullmatch(r"(model\.)?decoder\.layers\.\d+\.encoder_attn\.q_proj\.weight", n) for n in names
    )


_L = "{p}{s}.layers.*."
TABLE = Table(
    "Whisper",
    {
        "lm_head.weight": "proj_out.weight",
        "encoder.conv1.{k}": "{p}encoder.conv1.{k}",
        "encoder.conv2.{k}": "{p}encoder.conv2.{k}",
        "encoder.pos.weight": "{p}encoder.embed_positions.weight",
        "decoder.embed.weight": "{p}decoder.embed_tokens.weight",
        "decoder.pos.weight": "{p}decoder.embed_positions.weight",
        "{s}.norm_f.{k}": "{p}{s}.layer_norm.{k}",
        "{s}.blocks.*.attn.qkv.weight": ("cat", *(f"{_L}self_attn.{x}_proj.weight" for x in "qkv")),
        "{s}.blocks.*.attn.qkv.bias": ("cat", f"{_L}self_attn.q_proj.bias", f"{_L}self_attn.v_proj.bias"),
        "{s}.blocks.*.attn.out.{k}": f"{_L}self_attn.out_proj.{{k}}",
        "{s}.blocks.*.norm1.{k}": f"{_L}self_attn_layer_norm.{{k}}",
        "{s}.blocks.*.cross_attn.q.{k}": f"{_L}encoder_attn.q_proj.{{k}}",
        "{s}.blocks.*.cross_attn.kv.weight": (
            "cat",
            f"{_L}encoder_attn.k_proj.weight",
            f"{_L}encoder_attn.v_proj.weight",
        ),
        "{s}.blocks.*.cross_attn.kv.bias": f"{_L}encoder_attn.v_proj.bias",  # k has none
        "{s}.blocks.*.cross_attn.out.{k}": f"{_L}encoder_attn.out_proj.{{k}}",
        "{s}.blocks.*.norm_cross.{k}": f"{_L}encoder_attn_layer_norm.{{k}}",
        "{s}.blocks.*.mlp.fc1.{k}": f"{_L}fc1.{{k}}",
        "{s}.blocks.*.mlp.fc2.{k}": f"{_L}fc2.{{k}}",
        "{s}.blocks.*.norm2.{k}": f"{_L}final_layer_norm.{{k}}",
    },
    prefix="model.",
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = "lm_head" in g.graph and g.op("lm_head").tied_to is not None
    return table_plan(
        replace(TABLE, tied=(("{p}decoder.embed_tokens.weight", "proj_out.weight"),) if tied else ()), g, names
    )


FAMILY = Family(
    "Whisper",
    ("WhisperForConditionalGeneration", "WhisperModel"),
    ("whisper",),
    ("encoder_decoder",),
    spec,
    detect,
    plan,
)
