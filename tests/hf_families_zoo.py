"""Tiny random configs of today's decoder families (Llama 3, Qwen2/3 (+MoE), Gemma 1/2/3, Phi-2/3, GPT-NeoX, GPT-J,
Falcon, OLMo-2), each with its family's features switched on; shared by the test_hf_families_* files.

Every config is 2 layers (Llama 4: 4, for its NoPE and MoE patterns) of width 64 with sequences (11 tokens, 16 when
generating) longer than any sliding window or chunk used, so that windows, per-layer kinds and caches all matter.
Weights are redrawn at test_hf_zoo.STD.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
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


def _has(feature: str) -> bool:
    if feature == "sinks":
        return "sinks" in schema.Attention.model_fields
    if feature == "temperature":  # Llama 4's temperature tuning, L2 QK-norm and input-weighted experts
        return "temperature" in schema.Attention.model_fields
    if feature == "alibi":
        return "max_bias" in schema.Position.model_fields
    if feature == "rope_import":  # RoPE variants and partial rotary read from config.json
        return importlib.util.find_spec("specc.interop.rope_config") is not None
    where, name = _FIELDS[feature]
    return name in where.model_fields


def missing_features(case: Case) -> list[str]:
    """The spec features ``case`` needs that this specc does not have yet."""
    return [f for f in NEEDS.get(case.id, ()) if not _has(f)]


_D: dict[str, Any] = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=96)
_QWEN = dict(_D, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
_FALCON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=96,
    max_position_embeddings=64,
    ffn_hidden_size=96,
    alibi=False,
)
_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}
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
    # LongRoPE: short factors while every sequence (11, 16 tokens) fits original_max_position_embeddings, long ones
    # from the first step when none does, and a generation that crosses it (HF recomputes the cache there)
    Case(
        "phi3-longrope",
        "Phi3ForCausalLM",
        dict(
            _QWEN,
            original_max_position_embeddings=32,
            pad_token_id=0,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [2.0, 4.0, 6.0, 12.0],
            },
        ),
    ),
    Case(
        "phi3-longrope-long",
        "Phi3ForCausalLM",
        dict(
            _QWEN,
            original_max_position_embeddings=4,
            pad_token_id=0,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [2.0, 4.0, 6.0, 12.0],
            },
        ),
    ),
    Case(
        "phi3-longrope-switch",
        "Phi3ForCausalLM",
        dict(
            _QWEN,
            original_max_position_embeddings=8,
            pad_token_id=0,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [2.0, 4.0, 6.0, 12.0],
            },
        ),
    ),
    Case("llama3-rope", "LlamaForCausalLM", dict(_QWEN, rope_parameters=_LLAMA3)),
    Case(
        "llama-linear",
        "LlamaForCausalLM",
        dict(_QWEN, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ),
    Case(
        "llama-dynamic",
        "LlamaForCausalLM",
        dict(
            _QWEN,
            max_position_embeddings=8,
            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        ),
    ),
    Case(
        "llama-yarn",
        "LlamaForCausalLM",
        dict(
            _QWEN,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "beta_fast": 8.0,
                "beta_slow": 1.0,
            },
        ),
    ),
    Case("gemma-geglu", "GemmaForCausalLM", dict(_QWEN, num_key_value_heads=1, head_dim=32)),
    Case(
        "gemma2-sandwich",
        "Gemma2ForCausalLM",
        dict(
            _QWEN,
            head_dim=32,
            sliding_window=4,
            query_pre_attn_scalar=20,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            tie_word_embeddings=False,  # tied, these random models only ever repeat the last token
        ),
    ),
    Case(
        "gemma3-local",
        "Gemma3ForCausalLM",
        dict(
            _QWEN,
            head_dim=24,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=24,
            tie_word_embeddings=False,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ),
    Case(
        "olmo2-post", "Olmo2ForCausalLM", dict(_QWEN, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    ),
    Case(
        "phi-parallel",
        "PhiForCausalLM",
        dict(_D, num_attention_heads=4, max_position_embeddings=64, partial_rotary_factor=0.5),
    ),
    Case(
        "neox-parallel",
        "GPTNeoXForCausalLM",
        dict(_D, intermediate_size=128, num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.25),
    ),
    Case(
        "neox-sequential",
        "GPTNeoXForCausalLM",
        dict(_D, num_attention_heads=4, max_position_embeddings=64, rotary_pct=0.5, use_parallel_residual=False),
    ),
    Case(
        "gptj-interleaved",
        "GPTJForCausalLM",
        dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_inner=96, vocab_size=96, n_positions=64),
    ),
    Case("falcon-7b-style", "FalconForCausalLM", dict(_FALCON, multi_query=True, parallel_attn=True)),
    Case(
        "falcon-40b-style", "FalconForCausalLM", dict(_FALCON, new_decoder_architecture=True, num_kv_heads=2, bias=True)
    ),
    Case("falcon-mha-seq", "FalconForCausalLM", dict(_FALCON, multi_query=False, parallel_attn=False, bias=True)),
    # importer-only families of issue 26
    Case(
        "starcoder2-window",
        "Starcoder2ForCausalLM",
        dict(_QWEN, sliding_window=4, bos_token_id=0, eos_token_id=0, residual_dropout=0.1, embedding_dropout=0.1),
    ),
    Case("olmoe-topk", "OlmoeForCausalLM", dict(_QWEN, num_experts=4, num_experts_per_tok=2, pad_token_id=0)),
    Case(
        "smollm3-nope",
        "SmolLM3ForCausalLM",
        dict(_QWEN, no_rope_layers=[1, 0], pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    ),
    Case(
        "exaone4-hybrid",
        "Exaone4ForCausalLM",
        dict(_QWEN, head_dim=24, sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    ),
    Case(
        "cohere-parallel",
        "CohereForCausalLM",
        dict(_QWEN, logit_scale=0.5, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    ),
    Case(
        "cohere2-nope",
        "Cohere2ForCausalLM",
        dict(
            _QWEN,
            logit_scale=0.5,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
            tie_word_embeddings=False,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # ALiBi: Falcon-RW (scaled with the scores, slopes and slope · position rounded to bf16: 32 heads make the
    # slopes 2^(-h/4), which bf16 rounds), BLOOM (6 heads: not a power of 2), MPT
    Case(
        "falcon-rw-alibi",
        "FalconForCausalLM",
        dict(
            _FALCON,
            num_attention_heads=32,
            alibi=True,
            multi_query=False,
            parallel_attn=False,
            bias=True,
            tie_word_embeddings=False,
        ),
    ),
    Case(
        "bloom-alibi",
        "BloomForCausalLM",
        dict(hidden_size=48, n_layer=2, n_head=6, vocab_size=96, tie_word_embeddings=False),
    ),
    # GPT-OSS: sinks, clamped SwiGLU (a limit the activations reach), biased router and experts, sliding / full
    Case(
        "gptoss-sinks",
        "GptOssForCausalLM",
        dict(
            _QWEN,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=32,
            sliding_window=4,
            swiglu_limit=1.5,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
        ),
    ),
    Case("mpt-alibi", "MptForCausalLM", dict(d_model=64, n_layers=2, n_heads=4, vocab_size=96, max_seq_len=64)),
    Case(
        "opt-pre",
        "OPTForCausalLM",
        dict(
            hidden_size=64,
            ffn_dim=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=96,
            max_position_embeddings=64,
            word_embed_proj_dim=64,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        ),
    ),
    Case(
        "opt-post",
        "OPTForCausalLM",
        dict(
            hidden_size=64,
            ffn_dim=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=96,
            max_position_embeddings=64,
            word_embed_proj_dim=64,
            do_layer_norm_before=False,
            enable_bias=False,
            tie_word_embeddings=False,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        ),
    ),
    Case(
        "granite-multipliers",
        "GraniteForCausalLM",
        dict(
            _QWEN,
            embedding_multiplier=2.0,
            attention_multiplier=0.25,
            residual_multiplier=0.5,
            logits_scaling=4.0,
            pad_token_id=0,
        ),
    ),
    # Llama 4: RoPE layers chunked by 4 with the weightless QK-norm, a NoPE layer (every 4th) with temperature
    # tuning whose factor steps every 4 positions, MoE (top-1 sigmoid gates on the experts' inputs, a shared
    # expert) every other layer, dense layers of intermediate_size_mlp between them, llama3 RoPE scaling
    Case(
        "llama4-chunked",
        "Llama4ForCausalLM",
        dict(
            _QWEN,
            num_hidden_layers=4,
            head_dim=16,
            intermediate_size=32,
            intermediate_size_mlp=96,
            num_local_experts=4,
            interleave_moe_layer_step=2,
            attention_chunk_size=4,
            floor_scale=4,
            attn_scale=0.5,
            no_rope_layer_interval=4,
            rope_parameters=_LLAMA3,
        ),
    ),
]
FAMILY_BY_ID = {c.id: c for c in FAMILY_CASES}

# spec features each case needs (a case whose features are missing is skipped, naming them)
NEEDS: dict[str, tuple[str, ...]] = {
    "qwen2-mixed": ("layer_kinds",),
    "qwen2moe-shared": ("shared_expert", "layer_kinds"),
    "qwen2moe-step": ("shared_expert", "layer_kinds"),
    "qwen3-qknorm": ("qk_norm",),
    "qwen3moe-topk": ("qk_norm",),
    "phi3-longrope": ("rope_scaling", "rope_import"),
    "phi3-longrope-long": ("rope_scaling", "rope_import"),
    "phi3-longrope-switch": ("rope_scaling", "rope_import"),
    "llama3-rope": ("rope_scaling", "rope_import"),
    "llama-linear": ("rope_scaling", "rope_import"),
    "llama-dynamic": ("rope_scaling", "rope_import"),
    "llama-yarn": ("rope_scaling", "rope_import"),
    "gemma-geglu": ("unit_offset",),
    "gemma2-sandwich": ("unit_offset", "softcap", "output", "layer_kinds"),
    "gemma3-local": ("unit_offset", "qk_norm", "layer_kinds", "rope_scaling", "rope_import"),
    "olmo2-post": ("qk_norm",),
    "phi-parallel": ("parallel", "rope_import"),
    "neox-parallel": ("parallel", "rope_import"),
    "neox-sequential": ("rope_import",),
    "gptj-interleaved": ("parallel", "rotation"),
    "falcon-7b-style": ("parallel",),
    "falcon-40b-style": ("parallel",),
    "falcon-rw-alibi": ("alibi",),
    "bloom-alibi": ("alibi",),
    "mpt-alibi": ("alibi",),
    "gptoss-sinks": ("sinks",),
    "llama4-chunked": ("temperature", "rope_scaling", "rope_import"),
}


def needs(*features: str) -> pytest.MarkDecorator:
    """Skip a test, naming them, while spec features it relies on are missing from this specc."""
    gone = [f for f in features if not _has(f)]
    return pytest.mark.skipif(bool(gone), reason=f"needs spec fields specc does not have yet: {', '.join(gone)}")
