"""Small random HF models and the hand-written specc specs that compute the same function, with the weight
mappings between them: the block-feature parity cases of tests/test_block_features.py."""

from __future__ import annotations

import os
from typing import Any

import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import transformers

from specc.spec.schema import SPEC_ADAPTER

V, D, L = 64, 32, 2
STD = 0.2
BASE = dict(hidden_size=D, intermediate_size=48, num_hidden_layers=L, vocab_size=V, max_position_embeddings=64)
ROTARY = {"type": "rotary", "theta": 10000.0}


def spec_of(**fields: Any) -> Any:
    doc = {"name": "t", "kind": "decoder", "vocab_size": V, "context": 64, "d_model": D, "blocks": L, **fields}
    return SPEC_ADAPTER.validate_python(doc)


def hf_model(arch: str, **config: Any) -> Any:
    cls = getattr(transformers, f"{arch}ForCausalLM")
    model = cls._from_config(cls.config_class(**config), attn_implementation="eager")  # Gemma3: Gemma3TextConfig
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * STD)
    return model.eval()


def _llama_like(sd: dict[str, Any], norms: dict[str, str], tied: bool = False) -> dict[str, Any]:
    """HF LLaMA-style names → specc names (q/k/v packed into qkv)."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "norm_f.weight": sd["model.norm.weight"]}
    if not tied:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(L):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        for kind in ("weight", "bias"):
            if f"{a}q_proj.{kind}" in sd:
                out[f"{q}attn.qkv.{kind}"] = torch.cat([sd[f"{a}{n}_proj.{kind}"] for n in "qkv"])
        out[q + "attn.out.weight"] = sd[a + "o_proj.weight"]
        for n in ("q_norm", "k_norm"):
            if f"{a}{n}.weight" in sd:
                out[f"{q}attn.{n}.weight"] = sd[f"{a}{n}.weight"]
        for hf, ours in norms.items():
            out[f"{q}{ours}.weight"] = sd[f"{p}{hf}.weight"]
        for hf, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            if f"{p}mlp.{hf}.weight" in sd:
                out[f"{q}mlp.{ours}.weight"] = sd[f"{p}mlp.{hf}.weight"]
    return out


def _neox(sd: dict[str, Any]) -> dict[str, Any]:
    """GPT-NeoX packs q/k/v per head ([H, 3, D_H] rows); specc packs [q heads | k heads | v heads]."""
    out = {"embed.weight": sd["gpt_neox.embed_in.weight"], "lm_head.weight": sd["lm_head.weight"]}
    for k in ("weight", "bias"):
        out[f"norm_f.{k}"] = sd[f"gpt_neox.final_layer_norm.{k}"]
    for i in range(L):
        p, q = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        for k in ("weight", "bias"):
            w = sd[f"{p}attention.query_key_value.{k}"]
            out[f"{q}attn.qkv.{k}"] = w.reshape(4, 3, -1, *w.shape[1:]).transpose(0, 1).reshape(w.shape)
            out[f"{q}attn.out.{k}"] = sd[f"{p}attention.dense.{k}"]
            out[f"{q}norm1.{k}"] = sd[f"{p}input_layernorm.{k}"]
            out[f"{q}norm2.{k}"] = sd[f"{p}post_attention_layernorm.{k}"]
            out[f"{q}mlp.fc1.{k}"] = sd[f"{p}mlp.dense_h_to_4h.{k}"]
            out[f"{q}mlp.fc2.{k}"] = sd[f"{p}mlp.dense_4h_to_h.{k}"]
    return out


def _phi(sd: dict[str, Any]) -> dict[str, Any]:
    out = {"embed.weight": sd["model.embed_tokens.weight"]}
    for k in ("weight", "bias"):
        out[f"norm_f.{k}"] = sd[f"model.final_layernorm.{k}"]
        out[f"lm_head.{k}"] = sd[f"lm_head.{k}"]
        for i in range(L):
            p, q = f"model.layers.{i}.", f"blocks.{i}."
            out[f"{q}attn.qkv.{k}"] = torch.cat([sd[f"{p}self_attn.{n}_proj.{k}"] for n in "qkv"])
            out[f"{q}attn.out.{k}"] = sd[f"{p}self_attn.dense.{k}"]
            out[f"{q}norm1.{k}"] = sd[f"{p}input_layernorm.{k}"]
            out[f"{q}mlp.fc1.{k}"] = sd[f"{p}mlp.fc1.{k}"]
            out[f"{q}mlp.fc2.{k}"] = sd[f"{p}mlp.fc2.{k}"]
    return out


def _falcon(sd: dict[str, Any], heads: int, kv: int) -> dict[str, Any]:
    """Falcon: multi-query [q heads | k | v] rows (7B) are specc's packing already; the new decoder
    architecture (40B) groups them per KV head, [kv, heads/kv q heads + k + v, D_H], regrouped here."""
    t = "transformer."
    out = {"embed.weight": sd[t + "word_embeddings.weight"]}
    for k in ("weight", "bias"):
        out[f"norm_f.{k}"] = sd[f"{t}ln_f.{k}"]
    for i in range(L):
        p, q = f"{t}h.{i}.", f"blocks.{i}."
        w = sd[p + "self_attention.query_key_value.weight"]
        if kv > 1:
            g = w.reshape(kv, heads // kv + 2, -1, w.shape[-1])
            w = torch.cat(
                [
                    g[:, :-2].reshape(-1, w.shape[-1]),
                    g[:, -2].reshape(-1, w.shape[-1]),
                    g[:, -1].reshape(-1, w.shape[-1]),
                ]
            )
        out[q + "attn.qkv.weight"] = w
        out[q + "attn.out.weight"] = sd[p + "self_attention.dense.weight"]
        out[q + "mlp.fc1.weight"] = sd[p + "mlp.dense_h_to_4h.weight"]
        out[q + "mlp.fc2.weight"] = sd[p + "mlp.dense_4h_to_h.weight"]
        norms = {"ln_attn": "norm1", "ln_mlp": "norm2"} if kv > 1 else {"input_layernorm": "norm1"}
        for hf, ours in norms.items():
            for k in ("weight", "bias"):
                out[f"{q}{ours}.{k}"] = sd[f"{p}{hf}.{k}"]
    return out


def _gptj(sd: dict[str, Any]) -> dict[str, Any]:
    t = "transformer."
    out = {
        "embed.weight": sd[t + "wte.weight"],
        "lm_head.weight": sd["lm_head.weight"],
        "lm_head.bias": sd["lm_head.bias"],
    }
    for i in range(L):
        p, q = f"{t}h.{i}.", f"blocks.{i}."
        out[q + "attn.qkv.weight"] = torch.cat([sd[f"{p}attn.{n}_proj.weight"] for n in "qkv"])
        out[q + "attn.out.weight"] = sd[p + "attn.out_proj.weight"]
        for k in ("weight", "bias"):
            out[f"{q}norm1.{k}"] = sd[f"{p}ln_1.{k}"]
            out[f"{q}mlp.fc1.{k}"] = sd[f"{p}mlp.fc_in.{k}"]
            out[f"{q}mlp.fc2.{k}"] = sd[f"{p}mlp.fc_out.{k}"]
            out[f"norm_f.{k}"] = sd[f"{t}ln_f.{k}"]
    return out


def _qwen2_moe(sd: dict[str, Any]) -> dict[str, Any]:
    out = _llama_like(sd, {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"})
    for i in range(L):
        p, q = f"model.layers.{i}.mlp.", f"blocks.{i}.mlp."
        if p + "gate.weight" not in sd:  # a dense layer (mlp_only_layers): mapped as a LLaMA MLP
            continue
        gate, up = sd[p + "experts.gate_up_proj"].chunk(2, dim=1)  # [E, 2·I, D]: gate rows, then up rows
        out.update({q + "router.weight": sd[p + "gate.weight"], q + "experts.w_gate": gate, q + "experts.w_up": up})
        out[q + "experts.w_down"] = sd[p + "experts.down_proj"]
        for hf, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            out[f"{q}shared.{ours}.weight"] = sd[f"{p}shared_expert.{hf}.weight"]
        out[q + "shared_gate.weight"] = sd[p + "shared_expert_gate.weight"]
    return out


QWEN2_MOE = dict(
    BASE,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
)
MOE_SPEC = {
    "type": "moe",
    "experts": 4,
    "active": 2,
    "hidden": 24,
    "router": {"normalize": False},
    "shared": {"hidden": 40, "gate": "sigmoid"},
}
QWEN2_MOE_SPEC = dict(
    attention={"heads": 4, "kv_heads": 2},
    norm={"type": "rmsnorm", "eps": 1e-6},
    mlp=MOE_SPEC,
    position=ROTARY,
    bias={"qkv": True, "out": False, "mlp": False, "norm": False, "head": False},
    tie_embeddings=False,
)
FALCON_SPEC = dict(
    mlp={"type": "classic", "hidden": 128, "activation": "gelu"},
    position=ROTARY,
    bias={"qkv": False, "out": False, "mlp": False, "norm": True, "head": False},
)
SANDWICH = {
    "input_layernorm": "norm1",
    "post_attention_layernorm": "norm1_post",
    "pre_feedforward_layernorm": "norm2",
    "post_feedforward_layernorm": "norm2_post",
}
GEMMA_SPEC = dict(
    attention={"heads": 4, "kv_heads": 2, "head_dim": 16},
    norm={"type": "rmsnorm", "eps": 1e-6, "unit_offset": True},
    mlp={"type": "swiglu", "hidden": 48, "activation": "gelu_tanh"},
    position=ROTARY,
    bias=False,
    embedding_scale="sqrt_d_model",
)
GEMMA2 = dict(head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=1.5, final_logit_softcapping=2.0)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], Any]] = {
    "gemma_offset_norm_geglu_embed_scale": (
        "Gemma",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        GEMMA_SPEC,
        lambda sd: _llama_like(sd, {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}, tied=True),
    ),
    "gemma2_sandwich_softcaps_scale": (
        "Gemma2",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2, sliding_window=64, **GEMMA2),
        dict(
            GEMMA_SPEC,
            attention={"heads": 4, "kv_heads": 2, "head_dim": 16, "scale": 24**-0.5, "softcap": 1.5},
            norm={"type": "rmsnorm", "eps": 1e-6, "unit_offset": True, "placement": "sandwich"},
            output={"softcap": 2.0},
        ),
        lambda sd: _llama_like(sd, SANDWICH, tied=True),
    ),
    "gemma3_offset_qk_norm_local_global_kinds": (
        "Gemma3",
        dict(
            BASE,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        ),
        dict(
            GEMMA_SPEC,
            attention={"heads": 4, "kv_heads": 2, "head_dim": 16, "scale": 24**-0.5, "qk_norm": "head"},
            norm={"type": "rmsnorm", "eps": 1e-6, "unit_offset": True, "placement": "sandwich"},
            position={"type": "rotary", "theta": 1e6},
            layer_kinds={
                "local": {"attention": {"mask": "sliding_window", "window": 4}, "position": {"theta": 10000.0}},
                "global": {},
            },
            layer_pattern=["local", "global"],
        ),
        lambda sd: _llama_like(sd, SANDWICH, tied=True),
    ),
    "qwen3_head_qk_norm": (
        "Qwen3",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2, head_dim=8),
        dict(
            attention={"heads": 4, "kv_heads": 2, "qk_norm": "head"},
            norm={"type": "rmsnorm", "eps": 1e-6},
            mlp={"type": "swiglu", "hidden": 48},
            position=ROTARY,
            bias=False,
            tie_embeddings=False,
        ),
        lambda sd: _llama_like(sd, {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}),
    ),
    "olmo2_output_norms_full_qk_norm": (
        "Olmo2",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2),
        dict(
            attention={"heads": 4, "kv_heads": 2, "qk_norm": "full"},
            norm={"type": "rmsnorm", "eps": 1e-5, "placement": "output"},
            mlp={"type": "swiglu", "hidden": 48},
            position=ROTARY,
            bias=False,
            tie_embeddings=False,
        ),
        lambda sd: _llama_like(
            sd, {"post_attention_layernorm": "norm1_post", "post_feedforward_layernorm": "norm2_post"}
        ),
    ),
    "neox_parallel_separate_norms": (
        "GPTNeoX",
        dict(
            BASE,
            num_attention_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
        dict(
            attention={"heads": 4},
            mlp={"type": "classic", "hidden": 48, "activation": "gelu"},
            position={**ROTARY, "fraction": 0.5},
            parallel="separate_norms",
            tie_embeddings=False,
        ),
        _neox,
    ),
    "phi_parallel_shared_norm_head_bias": (
        "Phi",
        dict(BASE, num_attention_heads=4),
        dict(
            attention={"heads": 4},
            mlp={"type": "classic", "hidden": 48, "activation": "gelu_tanh"},
            position={**ROTARY, "fraction": 0.5},
            parallel="shared_norm",
            bias={"qkv": True, "out": True, "mlp": True, "norm": True, "head": True},
            tie_embeddings=False,
        ),
        _phi,
    ),
    "qwen2_moe_sigmoid_shared_expert": ("Qwen2Moe", QWEN2_MOE, QWEN2_MOE_SPEC, _qwen2_moe),
    "qwen2_moe_dense_layer_kind": (  # mlp_only_layers: a dense MLP of another size than the experts'
        "Qwen2Moe",
        dict(QWEN2_MOE, mlp_only_layers=[1]),
        dict(
            QWEN2_MOE_SPEC,
            layer_kinds={"sparse": {}, "dense": {"mlp": {"type": "swiglu", "hidden": 48}}},
            layer_pattern=["sparse", "dense"],
        ),
        _qwen2_moe,
    ),
    "gptj_parallel_shared_norm_interleaved_rope": (
        "GPTJ",
        dict(n_embd=D, n_layer=L, n_head=4, vocab_size=V, n_positions=64, rotary_dim=4, n_inner=48),
        dict(
            attention={"heads": 4},
            mlp={"type": "classic", "hidden": 48, "activation": "gelu_tanh"},
            position={**ROTARY, "fraction": 0.5, "rotation": "interleaved"},
            parallel="shared_norm",
            bias={"qkv": False, "out": False, "mlp": True, "norm": True, "head": True},
            tie_embeddings=False,
        ),
        _gptj,
    ),
    "falcon7b_parallel_shared_norm_mqa": (
        "Falcon",
        dict(BASE, ffn_hidden_size=128, num_attention_heads=4, multi_query=True, parallel_attn=True, bias=False),
        dict(FALCON_SPEC, attention={"heads": 4, "kv_heads": 1}, parallel="shared_norm"),
        lambda sd: _falcon(sd, 4, 1),
    ),
    "falcon40b_parallel_separate_norms_gqa": (
        "Falcon",
        dict(
            BASE,
            ffn_hidden_size=128,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            num_ln_in_parallel_attn=2,
            bias=False,
        ),
        dict(FALCON_SPEC, attention={"heads": 4, "kv_heads": 2}, parallel="separate_norms"),
        lambda sd: _falcon(sd, 4, 2),
    ),
}
