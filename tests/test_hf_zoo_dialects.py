"""The importer-only families of issue 26 read from both config dialects: the hub's (``rope_theta``,
``sliding_window_pattern``, no ``layer_types``) and transformers 5's (``rope_parameters``, ``layer_types``) give
the same spec; and the fields of theirs specc cannot express are refused at their line, naming the feature."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specc import SpecError
from specc.interop import import_hf

transformers = pytest.importorskip("transformers")

_D: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=96,
    max_position_embeddings=64,
)
# the hub's dialect: rope_theta beside the sizes, per-layer rules as transformers 4 wrote them
HUB: dict[str, tuple[str, str, dict[str, Any]]] = {
    "starcoder2": ("Starcoder2ForCausalLM", "Starcoder2Config", dict(_D, rope_theta=100000.0, sliding_window=8)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(_D, num_experts=4, num_experts_per_tok=2, rope_theta=1e4)),
    "smollm3": ("SmolLM3ForCausalLM", "SmolLM3Config", dict(_D, no_rope_layer_interval=2)),  # theta: 2e6
    "exaone4": ("Exaone4ForCausalLM", "Exaone4Config", dict(_D, sliding_window=8, sliding_window_pattern=2)),
    "cohere": ("CohereForCausalLM", "CohereConfig", dict(_D, logit_scale=0.125)),  # theta: 5e5
    "cohere2": ("Cohere2ForCausalLM", "Cohere2Config", dict(_D, sliding_window=8, sliding_window_pattern=2)),
    "llama4_text": (  # RoPE and NoPE layers alternating, MoE every other layer; theta: 5e5
        "Llama4ForCausalLM",
        "Llama4TextConfig",
        dict(
            _D,
            head_dim=16,
            num_local_experts=4,
            interleave_moe_layer_step=2,
            no_rope_layer_interval=2,
            attention_chunk_size=8,
            floor_scale=8,
        ),
    ),
    "granite": (
        "GraniteForCausalLM",
        "GraniteConfig",
        dict(_D, rope_theta=1e5, residual_multiplier=0.22, logits_scaling=8.0, embedding_multiplier=12.0),
    ),
}


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path / "config.json"


@pytest.mark.parametrize("model_type", sorted(HUB))
def test_both_dialects_give_one_spec(tmp_path: Path, model_type: str) -> None:
    arch, config_cls, fields = HUB[model_type]
    hub = _write(tmp_path / "hub", {"architectures": [arch], "model_type": model_type, **fields})
    # transformers 5 reads the hub's file and saves its own dialect (rope_parameters, layer_types)
    getattr(transformers, config_cls).from_pretrained(hub.parent).save_pretrained(tmp_path / "v5")
    saved = json.loads((tmp_path / "v5" / "config.json").read_text())
    assert "rope_parameters" in saved and "rope_theta" not in fields.get("rope_parameters", {})
    a, b = import_hf(hub).document, import_hf(tmp_path / "v5").document
    for doc in (a, b):
        doc.pop("source"), doc.pop("name")
    assert a == b
    if model_type in ("smollm3", "exaone4", "cohere2", "llama4_text"):  # NoPE layers: some layer kinds have no RoPE
        assert any(k.get("position", {}).get("type") == "none" for k in a["layer_kinds"].values())
        assert len(a["layer_pattern"]) == 2
    if model_type in ("smollm3", "cohere"):  # the family's own default base
        assert a["position"]["theta"] == {"smollm3": 2e6, "cohere": 5e5}[model_type]


@pytest.mark.parametrize(
    ("model_type", "fields", "key", "feature"),
    [
        ("olmoe", {"clip_qkv": 8.0}, "clip_qkv", "clamping q, k and v"),
        ("cohere", {"use_qk_norm": True}, "use_qk_norm", "per-head LayerNorm on q and k"),
        ("smollm3", {"no_rope_layers": [1, 0]}, "no_rope_layers", "one per layer"),
        ("llama4_text", {"layer_types": ["sliding_attention"] * 4}, "layer_types", "chunked or full"),
        ("llama4_text", {"moe_layers": "all"}, "moe_layers", "layer indices"),
    ],
)
def test_what_these_families_cannot_express_is_refused_at_its_line(
    tmp_path: Path, model_type: str, fields: dict[str, Any], key: str, feature: str
) -> None:
    arch, _, base = HUB[model_type]
    path = _write(tmp_path, {"architectures": [arch], "model_type": model_type, **base, **fields})
    with pytest.raises(SpecError) as e:
        import_hf(path)
    d = e.value.diagnostics[0]
    assert feature in d.message and key in d.message
    assert d.line == 1 + next(i for i, line in enumerate(path.read_text().splitlines()) if f'"{key}"' in line)
