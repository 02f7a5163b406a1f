"""Refusals name what is missing: each widely used HF class specc does not import yet (tiny configs written by
transformers itself, no weights) is refused at the line of the first config field specc cannot express, with a
message naming the feature, never only the class. A class whose family has landed imports instead, and its rows
are gone from the detector table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specc import SpecError
from specc.interop import import_hf
from specc.interop.missing import ROWS
from specc.interop.registry import supported_architectures

transformers = pytest.importorskip("transformers")

_DEC = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=96, intermediate_size=96)
_MLA = dict(_DEC, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=16)
_MLA.update(q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
_T5 = dict(d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, vocab_size=96)
_TOWER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
_IMAGE = dict(_TOWER, image_size=32, patch_size=8)
_SWIGLU = ("swiglu_alpha", "swiglu_limit")
_WHISPER = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4)
_WHISPER.update(vocab_size=96, num_mel_bins=16, max_source_positions=32, max_target_positions=32)
_WHISPER.update(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3)

# class → (config class, tiny config, words the message must hold, the field whose line it must point at)
ZOO: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "GptOssForCausalLM": (
        "GptOssConfig",
        dict(_DEC, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, head_dim=16),
        "clamped SwiGLU",
        "swiglu_alpha",
    ),
    "DeepseekV2ForCausalLM": ("DeepseekV2Config", _MLA, "multi-head latent attention", "kv_lora_rank"),
    "DeepseekV3ForCausalLM": (
        "DeepseekV3Config",
        dict(_MLA, n_group=2, topk_group=1),
        "multi-head latent attention",
        "kv_lora_rank",
    ),
    "BloomForCausalLM": (
        "BloomConfig",
        dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=96),
        "ALiBi",
        "model_type",
    ),
    "MptForCausalLM": (
        "MptConfig",
        dict(d_model=64, n_layers=2, n_heads=4, vocab_size=96, max_seq_len=64),
        "ALiBi positions are not supported",
        "attn_config.alibi",
    ),
    "FalconForCausalLM": (  # Falcon-RW
        "FalconConfig",
        dict(_DEC, alibi=True, multi_query=False, parallel_attn=False, bias=True),
        "ALiBi",
        "alibi",
    ),
    "T5ForConditionalGeneration": ("T5Config", _T5, "relative position bias", "relative_attention_max_distance"),
    "MT5ForConditionalGeneration": ("MT5Config", _T5, "relative position bias", "relative_attention_max_distance"),
    "UMT5ForConditionalGeneration": ("UMT5Config", _T5, "relative position bias", "relative_attention_max_distance"),
    "Llama4ForCausalLM": (
        "Llama4TextConfig",
        dict(_DEC, num_key_value_heads=2, intermediate_size_mlp=96, num_local_experts=2, head_dim=16),
        "attention temperature tuning",
        "attn_scale",
    ),
    "Llama4VisionModel": (  # a Llama4ForConditionalGeneration config imports its text model
        "Llama4VisionConfig",
        dict(_TOWER, image_size=28, patch_size=14, vision_output_dim=32, projector_input_dim=32),
        "vision encoder",
        "pixel_shuffle_ratio",
    ),
    "GraniteForCausalLM": (
        "GraniteConfig",
        dict(_DEC, residual_multiplier=0.5),
        "residual multiplier",
        "residual_multiplier",
    ),
    "ModernBertModel": (
        "ModernBertConfig",
        dict(_DEC, num_hidden_layers=3, local_attention=8, global_attn_every_n_layers=3, pad_token_id=0),
        "",
        "",
    ),
    "CLIPTextModel": ("CLIPTextConfig", dict(_TOWER, vocab_size=96, eos_token_id=95), "", ""),
    "CLIPTextModelWithProjection": ("CLIPTextConfig", dict(_TOWER, vocab_size=96, eos_token_id=95), "", ""),
    "CLIPVisionModel": ("CLIPVisionConfig", _IMAGE, "", ""),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", _IMAGE, "", ""),
    "SiglipVisionModel": ("SiglipVisionConfig", _IMAGE, "", ""),
    "WhisperForConditionalGeneration": ("WhisperConfig", _WHISPER, "", ""),
    "WhisperModel": ("WhisperConfig", _WHISPER, "", ""),
}
# the same classes with the feature switched off: the next missing feature is named
VARIANTS: dict[str, tuple[str, dict[str, Any], str, str]] = {
    "GptOssForCausalLM": (  # without the SwiGLU fields (HF's defaults): the feature no field states, at model_type
        "GptOssConfig",
        dict(_DEC, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, head_dim=16, _drop=_SWIGLU),
        "attention sinks are not supported",
        "model_type",
    ),
    "SiglipVisionModel": ("SiglipVisionConfig", dict(_IMAGE, vision_use_head=False), "", ""),
    "Llama4ForCausalLM": (
        "Llama4TextConfig",
        dict(_DEC, num_key_value_heads=2, num_local_experts=2, head_dim=16, attn_temperature_tuning=False),
        "top-1 sigmoid router",
        "interleave_moe_layer_step",
    ),
}


def _saved(tmp_path: Path, arch: str, config_cls: str, fields: dict[str, Any]) -> Path:
    """config.json as transformers saves it (less the fields in ``_drop``, as older files lack them)."""
    fields = dict(fields)
    drop = fields.pop("_drop", ())
    config = getattr(transformers, config_cls)(**fields)
    config.architectures = [arch]
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    if drop:
        data = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in data.items() if k not in drop}, indent=2), encoding="utf-8")
    return path


def _line(path: Path, dotted: str) -> int:
    """The line of the field at a dotted path, as a reader of the file finds it."""
    lines = path.read_text().splitlines()
    at = 0
    for key in dotted.split("."):
        at = next(i for i in range(at, len(lines)) if f'"{key}":' in lines[i])
    return at + 1


@pytest.mark.parametrize(
    ("arch", "case"),
    [*ZOO.items(), *((a, c) for a, c in VARIANTS.items())],
    ids=[*ZOO, *(f"{a}-off" for a in VARIANTS)],
)
def test_an_unsupported_class_is_refused_naming_the_missing_feature_at_its_line(
    tmp_path: Path, arch: str, case: tuple[str, dict[str, Any], str, str]
) -> None:
    config_cls, fields, words, key = case
    path = _saved(tmp_path, arch, config_cls, fields)
    if arch in supported_architectures():
        import_hf(path)  # its family has landed: it imports, and the table has no row for it left
        assert not [r for r in ROWS if arch in r.architectures]
        return
    with pytest.raises(SpecError) as e:
        import_hf(path)
    d = e.value.diagnostics[0]
    assert words in d.message and f"{arch} is not supported" not in d.message
    assert d.file == str(path) and d.line == _line(path, key)
    assert key.split(".")[-1] in d.message


def test_every_row_of_the_table_is_exercised_by_a_zoo_class() -> None:
    for row in ROWS:
        assert set(row.architectures) & set(ZOO), f"no zoo class has {row.feature!r}"


def test_the_command_prints_one_located_line_and_exits_2(cli, tmp_path: Path) -> None:
    config_cls, fields, words, key = ZOO["Llama4VisionModel"]
    path = _saved(tmp_path, "Llama4VisionModel", config_cls, fields)
    code, _, err = cli("import-hf", path, "-o", tmp_path / "spec.yaml")
    assert code == 2 and "Traceback" not in err and not (tmp_path / "spec.yaml").exists()
    first = err.strip().splitlines()[0]
    assert first.startswith(f"{path}:{_line(path, key)}:") and f"error: {key}: " in first and words in first
