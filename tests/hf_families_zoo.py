"""Tiny random configs of today's decoder families (Llama 3, Qwen2/3 (+MoE), Gemma 1/2/3, Phi-2/3, GPT-NeoX, GPT-J,
Falcon, OLMo-2), each with its family's features switched on; shared by the test_hf_families_* files.

Every config is 2 layers of width 64 with sequences (11 tokens, 16 when generating) longer than any sliding
window used, so that windows, per-layer kinds and caches all matter. Weights are redrawn at test_hf_zoo.STD.
"""

from __future__ import annotations

from typing import Any

from test_hf_zoo import Case

from specc.spec import schema

# spec fields the cases rely on → (where the field lives, its name)
_FIELDS = {
    "layer_kinds": (schema.DecoderSpec, "layer_kinds"),
    "qk_norm": (schema.Attention, "qk_norm"),
    "softcap": (schema.Attention, "softcap"),
    "unit_offset": (schema.Norm, "unit_offset"),
    "parallel": (schema.DecoderSpec, "parallel"),
    "shared_expert": (schema.MoEMLP, "shared"),
    "output": (schema.DecoderSpec, "output"),
    "rope_scaling": (schema.Position, "scaling"),
    "rotation": (schema.Position, "rotation"),
}


def missing_features(case: Case) -> list[str]:
    """The spec features ``case`` needs that this specc does not have yet."""
    return [f for f in NEEDS.get(case.id, ()) if _FIELDS[f][1] not in _FIELDS[f][0].model_fields]


_D: dict[str, Any] = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=96)
_QWEN = dict(_D, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)

FAMILY_CASES = [
    Case(
        "qwen2-window", "Qwen2ForCausalLM", dict(_QWEN, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    ),
    Case(
        "qwen2-mixed", "Qwen2ForCausalLM", dict(_QWEN, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    ),
    Case("qwen2-tied", "Qwen2ForCausalLM", dict(_QWEN, num_key_value_heads=1, tie_word_embeddings=True)),
    Case(
        "qwen2moe-shared",
        "Qwen2MoeForCausalLM",
        dict(_QWEN, **_MOE, shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[1]),
    ),
    Case(
        "qwen2moe-step",
        "Qwen2MoeForCausalLM",
        dict(_QWEN, **_MOE, shared_expert_intermediate_size=40, decoder_sparse_step=2, norm_topk_prob=True),
    ),
    Case("qwen3-qknorm", "Qwen3ForCausalLM", dict(_QWEN, head_dim=24, rope_theta=1000000.0)),
    Case("qwen3moe-topk", "Qwen3MoeForCausalLM", dict(_QWEN, **_MOE, head_dim=16, norm_topk_prob=True)),
    Case("phi3-fused", "Phi3ForCausalLM", dict(_QWEN, sliding_window=5, pad_token_id=0)),
]
FAMILY_BY_ID = {c.id: c for c in FAMILY_CASES}

# spec features each case needs (a case whose features are missing is skipped, naming them)
NEEDS: dict[str, tuple[str, ...]] = {
    "qwen2-mixed": ("layer_kinds",),
    "qwen2moe-shared": ("shared_expert", "layer_kinds"),
    "qwen2moe-step": ("shared_expert", "layer_kinds"),
    "qwen3-qknorm": ("qk_norm",),
    "qwen3moe-topk": ("qk_norm",),
}
