"""Llama-style checkpoint names (``model.layers.{i}.self_attn.q_proj`` ...), shared by Llama, Mistral, Mixtral,
Qwen2/3 (+MoE), Gemma 1/2/3, Phi-3, OLMo-2, OLMoE, SmolLM3, EXAONE 4, Cohere 1/2 and StarCoder2 → specc scope
names: split or fused q/k/v, fused ``gate_up_proj``, StarCoder2's ``c_fc`` / ``c_proj``, per-expert or fused
expert tensors, QK-norms, sandwich / post-sublayer norms and Qwen2-MoE's shared expert.

One plan serves them all because it is driven by the graph's parameters: a norm the graph does not have is never
asked for, and a checkpoint tensor no parameter reads is reported as unexpected, so a checkpoint of one family
cannot fill a spec of another.
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..ir.graph import LayerGraph
from .name_table import Table, tied_head
from .name_table import plan as table_plan
from .weight_map import Plan


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.self_attn\.(q_proj|qkv_proj)\.weight", n) for n in names)


_L = "{p}layers.*."
_MOE = "{p}layers.*.block_sparse_moe.experts.{e}"  # Mixtral's per-expert names
_EXPERTS = "{p}layers.*.mlp.experts"  # Qwen-MoE's per-expert names ({e}) and transformers 5's fused tensors
TABLE = Table(
    "Llama-style",
    {
        "lm_head.weight": "lm_head.weight",
        "embed.weight": "{p}embed_tokens.weight",
        "norm_f.{k}": "{p}norm.{k}",
        "blocks.*.norm1.{k}": f"{_L}input_layernorm.{{k}}",
        # the pre-MLP norm; Gemma 2/3's sandwich calls it pre_feedforward_layernorm (plan) and uses
        # post_attention_layernorm for the norm after attention, as OLMo-2 does (output placement)
        "blocks.*.norm2.{k}": f"{_L}post_attention_layernorm.{{k}}",
        "blocks.*.norm1_post.{k}": f"{_L}post_attention_layernorm.{{k}}",
        "blocks.*.norm2_post.{k}": f"{_L}post_feedforward_layernorm.{{k}}",
        "blocks.*.attn.qkv.{k}": [
            ("cat", *(f"{_L}self_attn.{x}_proj.{{k}}" for x in "qkv")),
            f"{_L}self_attn.qkv_proj.{{k}}",  # Phi-3
        ],
        "blocks.*.attn.q_norm.{k}": f"{_L}self_attn.q_norm.{{k}}",
        "blocks.*.attn.k_norm.{k}": f"{_L}self_attn.k_norm.{{k}}",
        "blocks.*.attn.out.{k}": f"{_L}self_attn.o_proj.{{k}}",
        # Qwen2-MoE's shared expert
        **{f"blocks.*.mlp.shared.{x}.{{k}}": f"{_L}mlp.shared_expert.{x}_proj.{{k}}" for x in ("gate", "up", "down")},
        "blocks.*.mlp.shared_gate.{k}": f"{_L}mlp.shared_expert_gate.{{k}}",
        # dense MLPs: separate projections or Phi-3's fused [gate | up]
        "blocks.*.mlp.gate.{k}": [f"{_L}mlp.gate_proj.{{k}}", (("half", 0, 0), f"{_L}mlp.gate_up_proj.{{k}}")],
        "blocks.*.mlp.up.{k}": [f"{_L}mlp.up_proj.{{k}}", (("half", 0, 1), f"{_L}mlp.gate_up_proj.{{k}}")],
        "blocks.*.mlp.down.{k}": f"{_L}mlp.down_proj.{{k}}",
        # classic MLPs (StarCoder2)
        "blocks.*.mlp.fc1.{k}": f"{_L}mlp.c_fc.{{k}}",
        "blocks.*.mlp.fc2.{k}": f"{_L}mlp.c_proj.{{k}}",
        "blocks.*.mlp.router.{k}": [f"{_L}block_sparse_moe.gate.{{k}}", f"{_L}mlp.gate.{{k}}"],
        # experts [E, out, in]
        "blocks.*.mlp.experts.w_gate": [
            ("stack", f"{_MOE}.w1.weight"),
            ("stack", f"{_EXPERTS}.{{e}}.gate_proj.weight"),
            (("half", 1, 0), f"{_EXPERTS}.gate_up_proj"),
        ],
        "blocks.*.mlp.experts.w_up": [
            ("stack", f"{_MOE}.w3.weight"),
            ("stack", f"{_EXPERTS}.{{e}}.up_proj.weight"),
            (("half", 1, 1), f"{_EXPERTS}.gate_up_proj"),
        ],
        "blocks.*.mlp.experts.w_down": [
            ("stack", f"{_MOE}.w2.weight"),
            ("stack", f"{_EXPERTS}.{{e}}.down_proj.weight"),
            f"{_EXPERTS}.down_proj",
        ],
    },
    prefix="model.",
    ignore=(r"rotary_emb\.inv_freq$",),
)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    tied = (("{p}embed_tokens.weight", "lm_head.weight"),) if tied_head(g) else ()
    rows = dict(TABLE.rows)
    if any(re.fullmatch(r"blocks\.\d+\.norm2_post\.\w+", n) for n in g.params()):
        # a post-MLP norm comes with Gemma 2/3's sandwich alone, whose post_attention_layernorm is norm1_post
        rows["blocks.*.norm2.{k}"] = f"{_L}pre_feedforward_layernorm.{{k}}"
    return table_plan(replace(TABLE, rows=rows, tied=tied), g, names)
