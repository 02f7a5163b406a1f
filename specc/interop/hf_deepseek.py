"""DeepSeek-V2 and DeepSeek-V3 (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``; Kimi K2 is V3's
architecture): config → decoder spec with multi-head latent attention (``attention.latent``), DeepSeek MoE routing
(``mlp.router``: sigmoid scores, the selection-only bias, group-limited top-k, routed scale), shared experts and
dense-first layers (``first_k_dense_replace`` → a ``dense`` layer kind); the checkpoint names as a table.

transformers builds no multi-token-prediction layer (``num_nextn_predict_layers``), so neither does the spec.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..ir.graph import LayerGraph
from .family import Family
from .hf_config import HFConfig
from .hf_rope import position
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan

V3 = "DeepseekV3ForCausalLM"


def _latent(cfg: HFConfig) -> dict[str, Any]:
    out = {
        "kv_rank": cfg.positive_int("kv_lora_rank"),
        "rope_head_dim": cfg.positive_int("qk_rope_head_dim"),
        "nope_head_dim": cfg.positive_int("qk_nope_head_dim"),
        "v_head_dim": cfg.positive_int("v_head_dim"),
        "eps": 1e-6,  # transformers' q_a_layernorm / kv_a_layernorm keep DeepseekRMSNorm's default eps
    }
    q_rank = cfg.optional_int("q_lora_rank")
    if q_rank is not None:
        out["q_rank"] = q_rank
    return out


def _router(cfg: HFConfig, arch: str) -> dict[str, Any]:
    groups = cfg.optional_int("n_group") or 1
    top = cfg.optional_int("topk_group") or groups
    if arch == V3:
        cfg.expect("scoring_func", ("sigmoid",), "sigmoid", "DeepSeek-V3's transformers code scores by sigmoid")
        cfg.expect("topk_method", ("noaux_tc",), "noaux_tc", "DeepSeek-V3's transformers code routes noaux_tc")
        return {
            "score": "sigmoid",
            "score_bias": True,
            "groups": groups,
            "top_groups": top,
            "group_score": "top2_sum",
            "normalize": cfg.flag("norm_topk_prob", True),
            "scale": cfg.number("routed_scaling_factor", 2.5),
            "aux_loss_coef": 0.0,
        }
    method = cfg.expect("topk_method", ("greedy", "group_limited_greedy"), "greedy")
    cfg.expect("scoring_func", ("softmax",), "softmax", "DeepSeek-V2's transformers code scores by softmax")
    cfg.ignore("norm_topk_prob")  # transformers' DeepseekV2 router never renormalises
    limited = method == "group_limited_greedy"
    return {
        "groups": groups if limited else 1,
        "top_groups": top if limited else 1,
        "group_score": "max",
        "normalize": False,
        "scale": cfg.number("routed_scaling_factor", 1.0),
        "aux_loss_coef": 0.0,
    }


def _count(cfg: HFConfig, key: str, default: int) -> int:
    """A whole number ≥ 0 (``first_k_dense_replace``, ``n_shared_experts`` may be 0)."""
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise cfg.refuse(key, f"expected a whole number ≥ 0, got {value!r}")
    return value


def spec(cfg: HFConfig, arch: str) -> dict[str, Any]:
    n, heads = cfg.positive_int("num_hidden_layers"), cfg.positive_int("num_attention_heads")
    cfg.ignore("head_dim", "num_key_value_heads", "qk_head_dim")  # derived; MLA expands K/V for every head
    cfg.ignore("num_nextn_predict_layers", "num_mtp_layers", "pretraining_tp", "output_router_logits")
    cfg.ignore("aux_loss_alpha", "seq_aux", "ep_size")  # training-time balancing of the original code
    act = cfg.activation("hidden_act", "silu")
    mlp_bias = cfg.flag("mlp_bias", False) if arch != V3 else False
    dense = {"type": "swiglu", "hidden": cfg.positive_int("intermediate_size"), "activation": act}
    experts = _count(cfg, "n_routed_experts", 256 if arch == V3 else 64)
    first_dense = _count(cfg, "first_k_dense_replace", 3 if arch == V3 else 0)
    freq = cfg.positive_int("moe_layer_freq", 1)
    if freq != 1:
        raise cfg.refuse("moe_layer_freq", f"{freq} is not supported: transformers makes every layer MoE", "use 1")
    moe_layers = [i >= first_dense for i in range(n)] if experts else [False] * n
    mlp: dict[str, Any] = dense
    if any(moe_layers):
        if mlp_bias:
            raise cfg.refuse("mlp_bias", "biases with MoE layers are not supported: transformers' experts have none")
        hidden = cfg.positive_int("moe_intermediate_size")
        mlp = {
            "type": "moe",
            "experts": experts,
            "active": cfg.positive_int("num_experts_per_tok"),
            "expert": "swiglu",
            "hidden": hidden,
            "activation": act,
            "router": _router(cfg, arch),
        }
        shared = _count(cfg, "n_shared_experts", 1 if arch == V3 else 2)
        if shared:
            mlp["shared"] = {"hidden": shared * hidden}
    pos = position(cfg)
    if pos.get("type") == "rotary" and (arch != V3 or cfg.flag("rope_interleave", True)):
        pos["rotation"] = "interleaved"  # DeepSeek's rotary pairs are adjacent (V2: always; V3: rope_interleave)
    bias = cfg.flag("attention_bias", False)
    doc: dict[str, Any] = {
        "kind": "decoder",
        "vocab_size": cfg.positive_int("vocab_size"),
        "context": cfg.positive_int("max_position_embeddings"),
        "d_model": cfg.positive_int("hidden_size"),
        "blocks": n,
        "attention": {"heads": heads, "latent": _latent(cfg)},
        "norm": {"type": "rmsnorm", "placement": "pre", "eps": cfg.number("rms_norm_eps", 1e-6)},
        "mlp": mlp,
        "position": pos,
        "bias": {"qkv": bias, "out": bias, "mlp": mlp_bias, "norm": False, "head": False},
        "tie_embeddings": cfg.flag("tie_word_embeddings", False),
        **cfg.training(attention="attention_dropout"),
    }
    if any(moe_layers) and not all(moe_layers):
        doc["layer_kinds"] = {"dense": {"mlp": dense}, "moe": {}}
        doc["layer_pattern"] = ["dense" if not m else "moe" for m in moe_layers]
    return doc


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.self_attn\.kv_a_proj_with_mqa\.weight", n) for n in names)


_L = "{p}layers.*."
_A = f"{_L}self_attn."
_X = f"{_L}mlp.experts"
TABLE = Table(
    "DeepSeek",
    {
        "lm_head.weight": "lm_head.weight",
        "embed.weight": "{p}embed_tokens.weight",
        "norm_f.{k}": "{p}norm.{k}",
        "blocks.*.norm1.{k}": f"{_L}input_layernorm.{{k}}",
        "blocks.*.norm2.{k}": f"{_L}post_attention_layernorm.{{k}}",
        "blocks.*.attn.q.{k}": f"{_A}q_proj.{{k}}",
        "blocks.*.attn.q_a.{k}": f"{_A}q_a_proj.{{k}}",
        "blocks.*.attn.q_a_norm.{k}": f"{_A}q_a_layernorm.{{k}}",
        "blocks.*.attn.q_b.{k}": f"{_A}q_b_proj.{{k}}",
        "blocks.*.attn.kv_a.{k}": f"{_A}kv_a_proj_with_mqa.{{k}}",
        "blocks.*.attn.kv_a_norm.{k}": f"{_A}kv_a_layernorm.{{k}}",
        "blocks.*.attn.core.kv_b.{k}": f"{_A}kv_b_proj.{{k}}",
        "blocks.*.attn.out.{k}": f"{_A}o_proj.{{k}}",
        "blocks.*.mlp.gate.{k}": f"{_L}mlp.gate_proj.{{k}}",
        "blocks.*.mlp.up.{k}": f"{_L}mlp.up_proj.{{k}}",
        "blocks.*.mlp.down.{k}": f"{_L}mlp.down_proj.{{k}}",
        "blocks.*.mlp.router.{k}": f"{_L}mlp.gate.{{k}}",
        "blocks.*.mlp.experts.score_bias": f"{_L}mlp.gate.e_score_correction_bias",
        **{f"blocks.*.mlp.shared.{x}.{{k}}": f"{_L}mlp.shared_experts.{x}_proj.{{k}}" for x in ("gate", "up", "down")},
        # experts [E, out, in]: transformers 5's fused tensors, or the original per-expert names
        "blocks.*.mlp.experts.w_gate": [
            (("half", 1, 0), f"{_X}.gate_up_proj"),
            ("stack", f"{_X}.{{e}}.gate_proj.weight"),
        ],
        "blocks.*.mlp.experts.w_up": [(("half", 1, 1), f"{_X}.gate_up_proj"), ("stack", f"{_X}.{{e}}.up_proj.weight")],
        "blocks.*.mlp.experts.w_down": [f"{_X}.down_proj", ("stack", f"{_X}.{{e}}.down_proj.weight")],
    },
    prefix="model.",
    ignore=(r"rotary_emb\.inv_freq$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}embed_tokens.weight", "lm_head.weight"),) if tied_head(g) else ()
    return table_plan(replace(TABLE, tied=tied), g, names)


FAMILY = Family(
    "DeepSeek",
    ("DeepseekV2ForCausalLM", V3),
    ("deepseek_v2", "deepseek_v3", "kimi_k2"),  # Kimi K2's config.json names DeepseekV3ForCausalLM
    ("decoder",),
    spec,
    detect,
    plan,
)
