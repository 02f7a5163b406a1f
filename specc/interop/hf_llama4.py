"""Llama 4 text (``Llama4ForCausalLM``, and the text model of ``Llama4ForConditionalGeneration``, whose config
holds it as ``text_config``): RoPE layers (adjacent-pair rotation, chunked attention ``attention_chunk_size``, an
L2 norm of q and k without weights ``use_qk_norm``) and NoPE layers (``no_rope_layers``, by default every
``no_rope_layer_interval``-th; full causal attention with temperature tuning ``attn_temperature_tuning``,
``floor_scale``, ``attn_scale``); MoE layers (``moe_layers``, by default every ``interleave_moe_layer_step``-th) with
a top-k sigmoid router whose score scales the chosen expert's input and a shared expert, dense layers of
``intermediate_size_mlp`` between them. Experts are stored fused and ``[E, in, out]``: ``gate_up_proj`` [E, D, 2H]
holds gate then up, ``down_proj`` is [E, H, D].
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
from .hf_smollm3 import rope_layers
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan

MULTIMODAL = "Llama4ForConditionalGeneration"
_MULTIMODAL_FIELDS = ("boi_token_index", "eoi_token_index", "image_token_index", "vision_config", "text_config")


def _mlp(cfg: HFConfig, act: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the MoE layers' mlp, the dense layers' mlp)."""
    hidden = cfg.positive_int("intermediate_size", 8192)
    cfg.ignore("router_aux_loss_coef", "router_jitter_noise", "output_router_logits")  # transformers reads none
    moe = {
        "type": "moe",
        "experts": cfg.positive_int("num_local_experts", 16),
        "active": cfg.positive_int("num_experts_per_tok", 1),
        "expert": "swiglu",
        "hidden": hidden,
        "activation": act,
        "router": {"score": "sigmoid", "normalize": False, "weighs": "input", "aux_loss_coef": 0.0},
        "shared": {"hidden": hidden},
    }
    dense = {"type": "swiglu", "hidden": cfg.positive_int("intermediate_size_mlp", 16384), "activation": act}
    return moe, dense


def _moe_layers(cfg: HFConfig, n: int) -> list[bool]:
    """``moe_layers`` as given, else every ``interleave_moe_layer_step``-th layer (transformers' rule)."""
    given = cfg.get("moe_layers")
    if given is None:
        step = cfg.positive_int("interleave_moe_layer_step", 1)
        return [i % step == step - 1 for i in range(n)]
    cfg.ignore("interleave_moe_layer_step")
    if not isinstance(given, list) or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in given):
        raise cfg.refuse("moe_layers", "expected a list of layer indices")
    return [i in given for i in range(n)]


def _text_spec(cfg: HFConfig) -> dict[str, Any]:
    doc = dec.sizes(cfg)
    n = doc["blocks"]
    act = cfg.activation("hidden_act", "silu")
    rope = rope_layers(cfg, n)
    chunk = cfg.get("attention_chunk_size", 8192)
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise cfg.refuse("attention_chunk_size", f"expected a whole number ≥ 1 or null, got {chunk!r}")
    default = ["chunked_attention" if r and chunk is not None else "full_attention" for r in rope]
    types = dec.layer_types(cfg, default)
    if any(t == "sliding_attention" for t in types):
        raise cfg.refuse("layer_types", "Llama 4 layers are chunked or full, not sliding")
    if chunk is None and "chunked_attention" in types:
        raise cfg.refuse("layer_types", "there are chunked layers but no attention_chunk_size is set")
    qk_norm = cfg.flag("use_qk_norm", True)
    tuning = cfg.get("attn_temperature_tuning", True)  # read as transformers does: truthy (Scout's file says 4)
    if not isinstance(tuning, int):
        raise cfg.refuse("attn_temperature_tuning", f"expected true, false or a number, got {tuning!r}")
    temperature = {"floor": cfg.positive_int("floor_scale", 8192), "scale": cfg.number("attn_scale", 0.1)}
    moe, dense = _mlp(cfg, act)
    sparse = _moe_layers(cfg, n)
    layers: list[dec.Layer] = []
    for r, t, s in zip(rope, types, sparse, strict=True):
        attention: dict[str, Any] = {"mask": "chunked", "chunk": chunk} if t == "chunked_attention" else {}
        if r and qk_norm:
            attention["qk_norm"] = "l2"
        if not r and bool(tuning):
            attention["temperature"] = temperature
        settings: dict[str, Any] = {"position": {"type": "rotary" if r else "none"}}
        if attention:
            settings["attention"] = attention
        if any(sparse) and not s:
            settings["mlp"] = dense
        kind = "chunked" if t == "chunked_attention" and not r else ""  # a NoPE layer chunked by layer_types
        layers.append((dec.name("rope" if r else "nope", kind, "dense" if settings.get("mlp") else ""), settings))
    bias = cfg.flag("attention_bias", False)
    rotary = position(cfg, theta=500000.0)
    doc.update(
        kind="decoder",
        norm={"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-5)},
        mlp=moe if any(sparse) else dense,
        position={**rotary, "rotation": "interleaved"},  # transformers turns adjacent pairs (complex products)
        bias={"qkv": bias, "out": bias, "mlp": False, "norm": False, "head": False},
        tie_embeddings=cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    )
    return dec.per_layer(doc, layers)


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    if arch != MULTIMODAL:
        return _text_spec(cfg)
    inner = cfg.nested("text_config")
    if inner is None:
        raise cfg.refuse("text_config", "a Llama 4 multimodal config holds its text model here", "add text_config")
    doc = _text_spec(inner)
    cfg.ignore(*_MULTIMODAL_FIELDS, "tie_word_embeddings")
    cfg.notes.extend(inner.notes)
    cfg.notes.append(
        "the vision tower (vision_config) and its projector are not imported: the spec is the text model, whose "
        "weights are language_model.*"
    )
    unknown = inner.unused()
    if unknown:
        cfg.notes.append(f"text_config fields specc does not know (check they leave the model unchanged): "
                         f"{', '.join(unknown)}")  # fmt: skip
    return doc


def detect(names: set[str]) -> bool:
    return any(
        re.fullmatch(r"(language_model\.)?(model\.)?layers\.\d+\.feed_forward\.(gate_proj|router)\.weight", n)
        for n in names
    )


_L = "{p}layers.*."
_F = f"{_L}feed_forward."
_ROWS: dict[str, Any] = {
    "embed.weight": "{p}embed_tokens.weight",
    "norm_f.{k}": "{p}norm.{k}",
    "blocks.*.norm1.{k}": f"{_L}input_layernorm.{{k}}",
    "blocks.*.norm2.{k}": f"{_L}post_attention_layernorm.{{k}}",
    "blocks.*.attn.qkv.{k}": ("cat", *(f"{_L}self_attn.{x}_proj.{{k}}" for x in "qkv")),
    "blocks.*.attn.out.{k}": f"{_L}self_attn.o_proj.{{k}}",
    **{f"blocks.*.mlp.{x}.{{k}}": f"{_F}{x}_proj.{{k}}" for x in ("gate", "up", "down")},
    **{f"blocks.*.mlp.shared.{x}.{{k}}": f"{_F}shared_expert.{x}_proj.{{k}}" for x in ("gate", "up", "down")},
    "blocks.*.mlp.router.{k}": f"{_F}router.{{k}}",
    # [E, D, 2H]: gate then up on the last axis → [E, H, D] each; down [E, H, D] → [E, D, H]
    "blocks.*.mlp.experts.w_gate": (("half", 2, 0, True), f"{_F}experts.gate_up_proj"),
    "blocks.*.mlp.experts.w_up": (("half", 2, 1, True), f"{_F}experts.gate_up_proj"),
    "blocks.*.mlp.experts.w_down": ("swap", f"{_F}experts.down_proj"),
}
TABLE = Table("Llama 4", {"lm_head.weight": "lm_head.weight", **_ROWS}, prefix="model.",
              ignore=(r"rotary_emb\.inv_freq$",))  # fmt: skip
# the multimodal checkpoint: the text model under language_model., the vision tower and projector left out
MULTIMODAL_TABLE = Table(
    "Llama 4",
    {"lm_head.weight": "language_model.lm_head.weight", **_ROWS},
    prefix="language_model.model.",
    ignore=TABLE.ignore,
    dropped=(r"^vision_model\.", r"^multi_modal_projector\."),
)


def _llama4_graph(g: LayerGraph) -> bool:
    """Does the graph use a feature only Llama 4 has (input-weighted experts, temperature tuning, the L2 norm)?"""
    return any(
        (op.kind == "moe" and op.attrs.weigh_input)
        or (op.kind == "attention" and op.attrs.temperature_floor is not None)
        or (op.kind == "slice_rmsnorm" and not op.attrs.affine)
        for op in g.ops()
    )


def plan(g: LayerGraph, names: set[str]) -> Plan:
    # its names are Llama's with feed_forward for mlp: a spec without any Llama 4 feature, and no checkpoint
    # named so, is another family's (a Llama written from scratch keeps Llama's names in model.py)
    if not detect(names) and not _llama4_graph(g):
        raise SpecError("this spec has none of Llama 4's features", hint="not a Llama 4 spec")
    multimodal = any(n.startswith("language_model.") for n in names)
    table = MULTIMODAL_TABLE if multimodal else TABLE
    head = "language_model.lm_head.weight" if multimodal else "lm_head.weight"
    tied = (("{p}embed_tokens.weight", head),) if tied_head(g) else ()
    return table_plan(replace(table, tied=tied), g, names)


FAMILY = Family(
    "Llama 4", ("Llama4ForCausalLM", MULTIMODAL), ("llama4_text", "llama4"), ("decoder",), spec, detect, plan
)
