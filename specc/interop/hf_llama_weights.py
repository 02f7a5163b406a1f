"""Llama-style checkpoint names (``model.layers.{i}.self_attn.q_proj`` ...), shared by Llama, Mistral, Mixtral,
Qwen2/3 (+MoE), Gemma 1/2/3, Phi-3 and OLMo-2 → specc scope names: split or fused q/k/v, fused ``gate_up_proj``,
per-expert or fused expert tensors, QK-norms, sandwich / post-sublayer norms and Qwen2-MoE's shared expert.

One plan serves them all because it is driven by the graph's parameters: a norm the graph does not have is never
asked for, and a checkpoint tensor no parameter reads is reported as unexpected, so a checkpoint of one family
cannot fill a spec of another.
"""

from __future__ import annotations

import re

from ..ir.graph import LayerGraph
from .family import BLOCK, attention_sizes, prefix, rules_for
from .weight_map import Plan, Rule, ShapeT, concat, copy, part, stacked

# specc block norm → HF names, first present wins: Gemma 2/3 call the pre-MLP norm pre_feedforward_layernorm
# and use post_attention_layernorm for the norm after attention (sandwich), as OLMo-2 does (output placement)
_NORMS = {
    "norm1": ("input_layernorm",),
    "norm2": ("pre_feedforward_layernorm", "post_attention_layernorm"),
    "norm1_post": ("post_attention_layernorm",),
    "norm2_post": ("post_feedforward_layernorm",),
}
_DENSE = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def detect(names: set[str]) -> bool:
    return any(re.fullmatch(r"(model\.)?layers\.\d+\.self_attn\.(q_proj|qkv_proj)\.weight", n) for n in names)


def plan(g: LayerGraph, names: set[str]) -> Plan:
    p = prefix(names, "model.")

    def make(target: str, shape: ShapeT) -> Rule | list[Rule] | None:
        local, kind = target.rsplit(".", 1)
        if target == "lm_head.weight":
            return copy("lm_head.weight", shape)
        if local in ("embed", "norm_f"):
            return copy(f"{p}{'embed_tokens' if local == 'embed' else 'norm'}.{kind}", shape)
        m = BLOCK.fullmatch(local)
        if not m:
            return None
        hf, part_name = f"{p}layers.{m.group(2)}", m.group(3)
        if part_name in _NORMS:
            return [copy(f"{hf}.{n}.{kind}", shape) for n in _NORMS[part_name]]
        if part_name == "attn.qkv":
            sizes = attention_sizes(g, target)
            split = [f"{hf}.self_attn.{x}_proj.{kind}" for x in "qkv"]
            return [concat(split, shape, sizes), copy(f"{hf}.self_attn.qkv_proj.{kind}", shape)]
        if part_name in ("attn.q_norm", "attn.k_norm"):
            return copy(f"{hf}.self_attn.{part_name[5:]}.{kind}", shape)
        if part_name == "attn.out":
            return copy(f"{hf}.self_attn.o_proj.{kind}", shape)
        if part_name.startswith("mlp.shared."):  # Qwen2-MoE's shared expert
            return copy(f"{hf}.mlp.shared_expert.{_DENSE[part_name[11:]]}.{kind}", shape)
        if part_name == "mlp.shared_gate":
            return copy(f"{hf}.mlp.shared_expert_gate.{kind}", shape)
        if part_name.startswith("mlp.") and part_name[4:] in _DENSE:
            rules = [copy(f"{hf}.mlp.{_DENSE[part_name[4:]]}.{kind}", shape)]
            if part_name != "mlp.down":  # Phi-3 style fused [gate | up]
                fused = (2 * shape[0], *shape[1:])
                rules.append(part(f"{hf}.mlp.gate_up_proj.{kind}", shape, fused, 0, shape[0] * (part_name == "mlp.up")))
            return rules
        if part_name == "mlp.router":
            return [copy(f"{hf}.block_sparse_moe.gate.weight", shape), copy(f"{hf}.mlp.gate.weight", shape)]
        if part_name == "mlp.experts":
            return _experts(hf, kind, shape)
        return None

    tied = g.op("lm_head").attrs.get("tied_to")
    return Plan(
        "Llama-style",
        rules_for(g, "Llama-style", make),
        tied=[(f"{p}embed_tokens.weight", "lm_head.weight")] if tied else [],
        ignore=r"rotary_emb\.inv_freq$",
    )


def _experts(hf: str, kind: str, shape: ShapeT) -> list[Rule] | None:
    """``w_gate``/``w_up``/``w_down`` [E, out, in] from per-expert tensors (Mixtral's w1/w3/w2, Qwen-MoE's
    gate/up/down_proj) or transformers-5 fused ones."""
    e = shape[0]
    legacy = {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}.get(kind)
    if legacy is None:
        return None
    rules = [
        stacked([f"{hf}.block_sparse_moe.experts.{j}.{legacy}.weight" for j in range(e)], shape),
        stacked([f"{hf}.mlp.experts.{j}.{_DENSE[kind[2:]]}.weight" for j in range(e)], shape),
    ]
    if kind == "w_down":
        rules.append(copy(f"{hf}.mlp.experts.down_proj", shape))
    else:
        fused = (e, 2 * shape[1], shape[2])
        rules.append(part(f"{hf}.mlp.experts.gate_up_proj", shape, fused, 1, shape[1] * (kind == "w_up")))
    return rules
