"""MPT (``MptForCausalLM``): ALiBi positions, bias-free LayerNorms and projections, a packed ``Wqkv`` in specc's
order, exact-GELU MLPs of 4·d, and the attention settings in a nested ``attn_config``.

transformers' MPT always builds ALiBi with max_bias 8, no biases and a 4·d MLP, whatever ``alibi``,
``alibi_bias_max``, ``no_bias`` and ``expansion_ratio`` say (MosaicML's own code reads them): a config whose
fields claim otherwise is refused at that field, as the two implementations would compute different functions.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import GENERIC_IGNORED, HFConfig
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan

# attn_config keys: what transformers computes with each → (the value it assumes, why another is refused)
_ATTN_FIXED = {
    "attn_type": ("multihead_attention", "only multi-head attention is built"),
    "alibi": (True, "transformers' MPT always adds ALiBi"),
    "alibi_bias_max": (8, "transformers' MPT builds ALiBi slopes with max_bias 8 whatever this says"),
    "clip_qkv": (None, "clipping the q/k/v projection is not supported"),
    "qk_ln": (False, "transformers' MPT builds no q/k LayerNorm"),
    "prefix_lm": (False, "prefix-LM masks are not read by transformers' MPT"),
    "attn_uses_sequence_id": (False, "sequence-id masks are not read by transformers' MPT"),
}
# attn_config keys that leave inference unchanged
_ATTN_IGNORED = ("attn_pdrop", "attn_impl", "softmax_scale")


def _attention(cfg: HFConfig, heads: int) -> dict[str, Any]:
    attn = cfg.mapping("attn_config") or {}
    out: dict[str, Any] = {"heads": heads}
    for key, value in attn.items():
        if key in _ATTN_FIXED:
            want, why = _ATTN_FIXED[key]
            if value != want:
                raise cfg.refuse(f"attn_config.{key}", f"{value!r} is not supported ({why}); only {want!r} is")
        elif key not in _ATTN_IGNORED and key not in GENERIC_IGNORED:  # (saved as a nested PretrainedConfig)
            raise cfg.refuse(f"attn_config.{key}", "an attention setting specc does not know")
    scale = attn.get("softmax_scale")
    if scale is not None:
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
            raise cfg.refuse("attn_config.softmax_scale", f"expected a positive number, got {scale!r}")
        out["scale"] = float(scale)
    return out


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    for key, want, why in (
        ("no_bias", True, "transformers' MPT has no biases whatever this says"),
        ("expansion_ratio", 4, "transformers' MPT builds a 4·d MLP whatever this says"),
        ("logit_scale", None, "transformers' MPT does not scale its logits"),
    ):
        cfg.expect(key, (want,), want, why)
    # training-only or bookkeeping: the embedding's gradient fraction, the init device, logging, the norm's
    # low-precision kernel, a learned position table transformers never builds
    cfg.ignore("embedding_fraction", "init_device", "verbose", "norm_type", "learned_pos_emb", "init_config")
    d = cfg.positive_int("d_model")
    attn_dropout = (cfg.mapping("attn_config") or {}).get("attn_pdrop", 0.0)
    doc = {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_seq_len", 2048),
        "d_model": d,
        "blocks": cfg.positive_int("n_layers"),
        "attention": _attention(cfg, cfg.positive_int("n_heads")),
        "norm": {"type": "layernorm", "placement": "pre", "eps": cfg.number("layer_norm_epsilon", 1e-5)},
        "mlp": {"type": "classic", "hidden": 4 * d, "activation": "gelu"},
        "position": {"type": "alibi"},
        "bias": False,
        "tie_embeddings": True,
        **cfg.training(embedding="emb_pdrop", residual="resid_pdrop"),
    }
    if isinstance(attn_dropout, (int, float)) and not isinstance(attn_dropout, bool) and 0 <= attn_dropout < 1:
        doc["dropout"]["attention"] = float(attn_dropout)
    return doc


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(transformer\.)?blocks\.\d+\.attn\.Wqkv\.weight", n) for n in names)


TABLE = Table(
    "MPT",
    {
        "lm_head.{k}": "lm_head.{k}",
        "embed.weight": "{p}wte.weight",
        "norm_f.{k}": "{p}norm_f.{k}",
        "blocks.*.norm1.{k}": "{p}blocks.*.norm_1.{k}",
        "blocks.*.norm2.{k}": "{p}blocks.*.norm_2.{k}",
        "blocks.*.attn.qkv.{k}": "{p}blocks.*.attn.Wqkv.{k}",
        "blocks.*.attn.out.{k}": "{p}blocks.*.attn.out_proj.{k}",
        "blocks.*.mlp.fc1.{k}": "{p}blocks.*.ffn.up_proj.{k}",
        "blocks.*.mlp.fc2.{k}": "{p}blocks.*.ffn.down_proj.{k}",
    },
    prefix="transformer.",
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}wte.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("MPT", ("MptForCausalLM",), ("mpt",), ("decoder",), spec, detect, plan)
