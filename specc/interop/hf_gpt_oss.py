"""GPT-OSS (``GptOssForCausalLM``): attention sinks (``self_attn.sinks``, a logit per head), q/k/v/o biases, GQA,
YaRN RoPE, sliding and full layers alternating (``layer_types``), and a MoE in every layer with a biased router and
biased experts whose activation is the clamped SwiGLU ``(up + 1) · gate · σ(α · gate)`` (``swiglu_alpha``,
``swiglu_limit``). Its experts are stored fused and ``[E, in, out]``: ``gate_up_proj`` [E, D, 2H] holds gate and up
interleaved (even / odd columns), ``down_proj`` is [E, H, D].
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..errors import SpecError
from ..ir.graph import LayerGraph
from . import hf_decoder as dec
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan


def _layers(cfg: HFConfig, n: int) -> list[dec.Layer]:
    """transformers' default: even layers slide, odd layers see everything."""
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    window = cfg.optional_int("sliding_window")
    return [dec.attention_kind(cfg, t, window) for t in dec.layer_types(cfg, default)]


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    doc["attention"]["sinks"] = True
    bias = cfg.flag("attention_bias", True)
    # transformers' experts compute gate · σ(α · gate) whatever hidden_act says
    cfg.ignore("hidden_act", "output_router_logits")
    cfg.ignore("experts_per_token", "initial_context_length")  # OpenAI's names of fields read under HF's
    if cfg.mapping("quantization_config"):
        cfg.notes.append(
            "quantization_config: the released checkpoints store the experts in MXFP4, which specc does not read; "
            "load weights saved unquantized (transformers' Mxfp4Config(dequantize=True), then save_pretrained)"
        )
    key = "num_local_experts" if cfg.data.get("num_local_experts") is not None else "num_experts"
    cfg.ignore("num_experts", "num_local_experts")
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-5)},
        mlp={
            "type": "moe",
            "experts": cfg.positive_int(key, 128),
            "active": cfg.positive_int("num_experts_per_tok", 4),
            "expert": "swiglu",
            "hidden": cfg.positive_int("intermediate_size"),
            "router": {"bias": True, "aux_loss_coef": cfg.number("router_aux_loss_coef", 0.001)},
            "clamp": {"alpha": cfg.number("swiglu_alpha", 1.702), "limit": cfg.number("swiglu_limit", 7.0)},
        },
        position=position(cfg, theta=150000.0),
        bias={"qkv": bias, "out": bias, "mlp": True, "norm": False, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    )
    return dec.per_layer(doc, [(k, {"attention": a} if a else {}) for k, a in _layers(cfg, doc["blocks"])])


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.self_attn\.sinks", n) for n in names)


_L = "{p}layers.*."
_E = f"{_L}mlp.experts."
TABLE = Table(
    "GPT-OSS",
    {
        "lm_head.weight": "lm_head.weight",
        "embed.weight": "{p}embed_tokens.weight",
        "norm_f.{k}": "{p}norm.{k}",
        "blocks.*.norm1.{k}": f"{_L}input_layernorm.{{k}}",
        "blocks.*.norm2.{k}": f"{_L}post_attention_layernorm.{{k}}",
        "blocks.*.attn.qkv.{k}": ("cat", *(f"{_L}self_attn.{x}_proj.{{k}}" for x in "qkv")),
        "blocks.*.attn.out.{k}": f"{_L}self_attn.o_proj.{{k}}",
        "blocks.*.attn.core.sinks": f"{_L}self_attn.sinks",
        "blocks.*.mlp.router.{k}": f"{_L}mlp.router.{{k}}",
        # [E, D, 2H], gate and up interleaved on the last axis → [E, H, D] each; biases [E, 2H] → [E, H]
        "blocks.*.mlp.experts.w_gate": (("every", 2, 0, 2, True), f"{_E}gate_up_proj"),
        "blocks.*.mlp.experts.w_up": (("every", 2, 1, 2, True), f"{_E}gate_up_proj"),
        "blocks.*.mlp.experts.b_gate": (("every", 1, 0, 2, False), f"{_E}gate_up_proj_bias"),
        "blocks.*.mlp.experts.b_up": (("every", 1, 1, 2, False), f"{_E}gate_up_proj_bias"),
        "blocks.*.mlp.experts.w_down": ("swap", f"{_E}down_proj"),
        "blocks.*.mlp.experts.b_down": f"{_E}down_proj_bias",
    },
    prefix="model.",
    ignore=(r"rotary_emb\.inv_freq$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    # its names are the Llama-style ones plus sinks: a spec without sinks is another family's
    if not any(op.kind == "attention" and op.attrs.sinks for op in g.ops()):
        raise SpecError("GPT-OSS checkpoints hold attention sinks; this spec has none", hint="not a GPT-OSS spec")
    tied = (("{p}embed_tokens.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family("GPT-OSS", ("GptOssForCausalLM",), ("gpt_oss",), ("decoder",), spec, detect, plan)
