"""import-hf of today's families from config.json alone (both dialects): which spec fields each HF field becomes,
and located refusals of what specc cannot express."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hf_families_zoo import needs

import specc
from specc import SpecError
from specc.interop import import_hf

_BASE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 96,
    "max_position_embeddings": 64,
}


def _cfg(tmp_path: Path, arch: str, model_type: str, **fields: Any) -> Path:
    p = tmp_path / "config.json"
    data = {"architectures": [arch], "model_type": model_type, **_BASE, **fields}
    p.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return p


def _doc(tmp_path: Path, arch: str, model_type: str, **fields: Any) -> dict[str, Any]:
    return import_hf(_cfg(tmp_path, arch, model_type, **fields)).document


def test_qwen2_hub_sliding_rule_makes_layer_kinds(tmp_path: Path) -> None:
    """Without layer_types, Qwen2 slides on the layers from max_window_layers on (transformers 5's rule)."""
    doc = _doc(tmp_path, "Qwen2ForCausalLM", "qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert doc["layer_pattern"] == ["full", "sliding", "sliding"]
    assert doc["layer_kinds"] == {"full": {}, "sliding": {"attention": {"mask": "sliding_window", "window": 8}}}
    assert doc["bias"]["qkv"] and not doc["bias"]["out"]
    off = _doc(tmp_path, "Qwen2ForCausalLM", "qwen2", use_sliding_window=False, sliding_window=8)
    assert "layer_kinds" not in off and "mask" not in off["attention"]


@needs("shared_expert")
def test_qwen2_moe_dense_layers_and_shared_expert(tmp_path: Path) -> None:
    doc = _doc(
        tmp_path,
        "Qwen2MoeForCausalLM",
        "qwen2_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    )
    assert doc["mlp"]["type"] == "moe" and doc["mlp"]["hidden"] == 32
    assert doc["mlp"]["shared"] == {"hidden": 48, "gate": "sigmoid"}
    assert doc["mlp"]["router"]["normalize"] is False  # norm_topk_prob defaults to false
    assert doc["layer_pattern"] == ["block", "dense"]  # cyclic: block, dense, block
    assert doc["layer_kinds"]["dense"] == {"mlp": {"type": "swiglu", "hidden": 96, "activation": "silu"}}


@needs("unit_offset", "qk_norm")
def test_gemma3_hub_dialect_gives_sliding_layers_the_local_base(tmp_path: Path) -> None:
    doc = _doc(
        tmp_path,
        "Gemma3ForCausalLM",
        "gemma3_text",
        head_dim=32,
        sliding_window=4,
        sliding_window_pattern=3,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        query_pre_attn_scalar=32,
    )
    assert doc["position"] == {"type": "rotary", "theta": 1000000.0, "scaling": {"type": "linear", "factor": 8.0}}
    assert doc["layer_pattern"] == ["sliding", "sliding", "full"]
    sliding = doc["layer_kinds"]["sliding"]
    assert sliding["position"] == {"theta": 10000.0, "scaling": None}  # the local layers are not scaled
    assert sliding["attention"] == {"mask": "sliding_window", "window": 4}
    assert doc["attention"]["scale"] == 32**-0.5 and doc["norm"]["placement"] == "sandwich"


@needs("unit_offset")
def test_gemma1_legacy_gelu_is_the_tanh_approximation(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "GemmaForCausalLM", "gemma", head_dim=32, hidden_act="gelu")
    assert doc["mlp"]["activation"] == "gelu_tanh" and doc["embedding_scale"] == "sqrt_d_model"
    assert doc["norm"]["unit_offset"] is True and doc["attention"]["head_dim"] == 32
    absent = _doc(tmp_path, "GemmaForCausalLM", "gemma", head_dim=32)  # transformers' default: gelu_pytorch_tanh
    assert absent["mlp"]["activation"] == "gelu_tanh"


@needs("parallel")
def test_neox_hub_dialect_rotary_pct_and_base(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "GPTNeoXForCausalLM", "gpt_neox", rotary_pct=0.25, rotary_emb_base=20000)
    assert doc["position"] == {"type": "rotary", "theta": 20000.0, "fraction": 0.25}
    assert doc["parallel"] == "separate_norms"


@needs("parallel")
def test_falcon_layouts(tmp_path: Path) -> None:
    seven = _doc(tmp_path, "FalconForCausalLM", "falcon", multi_query=True, parallel_attn=True)
    assert seven["attention"]["kv_heads"] == 1 and seven["parallel"] == "shared_norm"
    forty = _doc(tmp_path, "FalconForCausalLM", "falcon", new_decoder_architecture=True, num_kv_heads=2)
    assert forty["attention"]["kv_heads"] == 2 and forty["parallel"] == "separate_norms"


def test_falcon_rw_alibi_is_scaled_alibi(tmp_path: Path) -> None:
    imported = import_hf(_cfg(tmp_path, "FalconForCausalLM", "falcon", alibi=True, multi_query=False, bias=True))
    assert imported.document["position"] == {"type": "alibi", "scaled": True, "bias_dtype": "bf16"}


@pytest.mark.parametrize(
    ("arch", "model_type", "fields", "key"),
    [
        (
            "MptForCausalLM",
            "mpt",
            {"d_model": 64, "n_heads": 4, "n_layers": 1, "attn_config": {"alibi_bias_max": 16}},
            "attn_config",
        ),
        (
            "MptForCausalLM",
            "mpt",
            {"d_model": 64, "n_heads": 4, "n_layers": 1, "expansion_ratio": 2},
            "expansion_ratio",
        ),
        (
            "BloomForCausalLM",
            "bloom",
            {"n_head": 4, "apply_residual_connection_post_layernorm": True},
            "apply_residual_connection_post_layernorm",
        ),
        ("FalconForCausalLM", "falcon", {"new_decoder_architecture": True, "parallel_attn": False}, "parallel_attn"),
        ("FalconForCausalLM", "falcon", {"multi_query": False, "num_kv_heads": 2}, "num_kv_heads"),
        ("PhiForCausalLM", "phi", {"qk_layernorm": True}, "qk_layernorm"),  # refused before the spec is built
        ("Qwen2ForCausalLM", "qwen2", {"layer_types": ["full_attention"]}, "layer_types"),
        ("Qwen2ForCausalLM", "qwen2", {"use_mrope": True}, "use_mrope"),
        ("Qwen2ForCausalLM", "qwen2", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ("Gemma2ForCausalLM", "gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        (
            "GPTJForCausalLM",
            "gptj",
            {"n_embd": 64, "n_head": 4, "n_layer": 1, "n_positions": 32, "rotary_dim": 20},
            "rotary_dim",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and "For" not in v else None,
)
def test_unexpressible_fields_are_located_errors(
    tmp_path: Path, arch: str, model_type: str, fields: dict, key: str
) -> None:
    path = _cfg(tmp_path, arch, model_type, **fields)
    with pytest.raises(SpecError) as e:
        import_hf(path)
    d = e.value.diagnostics[0]
    assert key in d.message and d.file == str(path)
    assert d.line == 1 + next(i for i, line in enumerate(path.read_text().splitlines()) if f'"{key}"' in line)


_FALCON_7B = {  # tiiuae/falcon-7b config.json as the hub serves it (no max_position_embeddings, no RoPE fields)
    "alibi": False,
    "apply_residual_connection_post_layernorm": False,
    "architectures": ["FalconForCausalLM"],
    "attention_dropout": 0.0,
    "bias": False,
    "bos_token_id": 11,
    "eos_token_id": 11,
    "hidden_dropout": 0.0,
    "hidden_size": 4544,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "falcon",
    "multi_query": True,
    "new_decoder_architecture": False,
    "num_attention_heads": 71,
    "num_hidden_layers": 32,
    "parallel_attn": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.0.dev0",
    "use_cache": True,
    "vocab_size": 65024,
}


@needs("parallel")
def test_falcon_7b_hub_config_counts_what_hf_builds(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_FALCON_7B, indent=2), encoding="utf-8")
    imported = import_hf(path)
    s = imported.spec
    assert (s.context, s.attention.kv_heads, s.parallel, s.position.theta) == (2048, 1, "shared_norm", 10000.0)
    assert any("apply_residual_connection_post_layernorm" in n for n in imported.notes)  # unread by transformers
    skip = {"architectures", "model_type", "transformers_version", "torch_dtype"}
    with torch.device("meta"):
        hf = transformers.FalconForCausalLM(
            transformers.FalconConfig(**{k: v for k, v in _FALCON_7B.items() if k not in skip})
        )
    assert specc.lower(s).num_params() == hf.num_parameters()


@pytest.mark.parametrize("heads", [1, 4, 6, 12, 32, 112])
def test_alibi_slopes_are_bloom_and_mpt_slopes(heads: int) -> None:
    """One slope rule, ALiBi's with max_bias: BLOOM's (and Falcon's) is max_bias 8, MPT's takes alibi_bias_max."""
    torch = pytest.importorskip("torch")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    from specc.backends.torch.layers.attention import alibi_slopes

    ours = torch.tensor(alibi_slopes(heads))
    torch.testing.assert_close(ours, _get_alibi_slopes(heads, torch.device("cpu")), rtol=1e-6, atol=0)
    for max_bias in (8, 16):  # MPT's tensor holds slope · (1 - N .. 0): its row at N = 2 is -slope
        mpt = -build_mpt_alibi_tensor(heads, 2, max_bias)[:, 0, 0]
        torch.testing.assert_close(torch.tensor(alibi_slopes(heads, max_bias)), mpt.float(), rtol=1e-6, atol=0)
