"""Fuzzing config.json through ``specc import-hf``: supported configs with fields replaced, removed or added
(any JSON value), and their text truncated, re-encoded or corrupted. Each either imports (and writes the spec)
or exits 2 with one located line, writes nothing, leaves no temporary file, and finishes quickly."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_safetensors import SECONDS, cli, json_value, listing
from test_read_files import one_line

from specc import SpecError
from specc.interop import import_hf

FUZZ = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)

CONFIGS = {
    "gpt2": {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2,
        "vocab_size": 32, "n_positions": 16, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
        "tie_word_embeddings": True, "scale_attn_weights": True,
    },
    "llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 32,
        "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "attention_bias": False,
    },
    "bert": {
        "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 32, "max_position_embeddings": 16,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute",
    },
    "vit": {
        "architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": 16,
        "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 16,
        "patch_size": 8, "num_channels": 3, "id2label": {"0": "a", "1": "b"}, "qkv_bias": True,
    },
    "bart": {
        "architectures": ["BartForConditionalGeneration"], "model_type": "bart", "d_model": 16, "encoder_layers": 1,
        "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 24,
        "decoder_ffn_dim": 24, "vocab_size": 32, "max_position_embeddings": 16, "activation_function": "gelu",
        "scale_embedding": False,
    },
}  # fmt: skip


@st.composite
def config_text(draw: Any) -> bytes:
    base = dict(CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))])
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["replace", "replace", "delete", "add", "nest"]))
        key = draw(st.sampled_from(sorted(base))) if base else "x"
        if how == "replace":
            base[key] = draw(json_value)
        elif how == "delete":
            base.pop(key, None)
        elif how == "add":
            base[draw(st.text(max_size=12))] = draw(json_value)
        else:
            base[key] = {"a": base.get(key)} if draw(st.booleans()) else [base.get(key)]
    text = json.dumps(base, indent=2).encode()
    how = draw(st.sampled_from(["plain", "plain", "plain", "truncate", "flip", "utf16", "deep", "dup", "constant"]))
    if how == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif how == "flip" and text:
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + bytes([draw(st.integers(0, 255))]) + text[i + 1 :]
    elif how == "utf16":
        text = text.decode().encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32"])))
    elif how == "deep":
        n = draw(st.integers(20, 20_000))
        text = b'{"x": ' + b"[" * n + b"]" * n + b", " + text[1:]
    elif how == "dup":
        text = text[:-2] + b',\n  "' + draw(st.sampled_from(sorted(base) or ["x"])).encode() + b'": 1\n}'
    elif how == "constant":
        text = (
            text[:-2] + b',\n  "eps": ' + draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999"])) + b"\n}"
        )
    return text


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz_config")


@FUZZ
@given(raw=config_text())
def test_fuzz_config_json(work: Path, raw: bytes) -> None:
    model = work / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_bytes(raw)
    out = work / "spec.yaml"
    before = listing(work)
    start = time.perf_counter()
    try:
        import_hf(model)
    except SpecError as e:
        assert all(d.file and d.file.endswith("config.json") for d in e.diagnostics), e.format()
    code, o, err = cli("import-hf", model, "-o", out)
    assert time.perf_counter() - start < SECONDS
    if code == 0:
        assert out.is_file() and "Traceback" not in err
        out.unlink()
    else:
        line = one_line((code, o, err))
        assert str(model / "config.json") in line
    assert listing(work) == before
