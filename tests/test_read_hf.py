"""Hostile or careless Hugging Face folders: config.json, model.safetensors and sharded indexes are each read
strictly, and every problem is one located line (exit 2 in the CLI, SpecError in the API), never a traceback,
a hang or a silent guess."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_read_files import CLI, fifo, one_line

import specc
from specc import SpecError
from specc.interop import import_hf
from specc.interop import safetensors_read as checkpoint

GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_embd": 16,
    "n_layer": 1,
    "n_head": 2,
    "vocab_size": 32,
    "n_positions": 16,
}
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 32,
    "max_position_embeddings": 16,
    "rope_theta": 10000.0,
}


def folder(tmp_path: Path, config: dict | str | bytes, name: str = "m") -> Path:
    d = tmp_path / name
    d.mkdir()
    raw = config if isinstance(config, bytes) else (config if isinstance(config, str) else json.dumps(config, indent=2))
    (d / "config.json").write_bytes(raw if isinstance(raw, bytes) else raw.encode())
    return d


def test_the_probe_configs_import(tmp_path: Path) -> None:
    assert import_hf(folder(tmp_path, GPT2, "g")).spec.d_model == 16
    assert import_hf(folder(tmp_path, LLAMA, "l")).spec.position.theta == 10000.0


# ---------------------------------------------------------------------------------------------- config.json bytes

_VALID = json.dumps(GPT2).encode()


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"", "config.json is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary data (NUL byte) in config.json"),
        (json.dumps(GPT2).encode("utf-16"), "UTF-16 text; config.json must be UTF-8"),
        (json.dumps(GPT2).encode("utf-16-le"), "UTF-16 text"),
        (_VALID[: len(_VALID) // 2], "not valid JSON"),
        (bytes(range(200, 256)) * 4, "not UTF-8 text"),
        (b'["GPT2LMHeadModel"]', "config.json must be a JSON object, not a list of 1 items"),
        (b'"gpt2"', "must be a JSON object, not the string 'gpt2'"),
        (b"[" * 50_000 + b"]" * 50_000, "nested deeper than 32 levels"),
        (b'{"model_type": "gpt2", "model_type": "llama"}', "1:24: error: duplicate key 'model_type'"),
        (_VALID[:-1] + b', "layer_norm_epsilon": NaN}', "NaN is not a JSON number"),
        (_VALID[:-1] + b', "layer_norm_epsilon": 1e999}', "1e999 overflows to infinity"),
    ],
    ids=[
        "empty",
        "binary",
        "utf16-bom",
        "utf16-le",
        "truncated",
        "random",
        "list",
        "string",
        "deep",
        "dup-key",
        "nan",
        "overflow",
    ],
)
def test_bad_config_bytes_are_one_located_line(cli: CLI, tmp_path: Path, raw: bytes, needle: str) -> None:
    d = folder(tmp_path, raw)
    start = time.perf_counter()
    line = one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), needle)
    assert time.perf_counter() - start < 5
    assert line.startswith(str(d / "config.json") + ":")
    assert not (tmp_path / "s.yaml").exists()
    with pytest.raises(SpecError):
        import_hf(d)


def test_config_that_is_not_a_regular_file(cli: CLI, tmp_path: Path) -> None:
    d = tmp_path / "m"
    d.mkdir()
    fifo(d / "config.json")
    one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), "is a FIFO")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "config.json").symlink_to("/dev/zero")
    one_line(cli("import-hf", tmp_path / "dev", "-o", tmp_path / "s.yaml"), "character device")
    one_line(cli("import-hf", "/dev/null", "-o", tmp_path / "s.yaml"), "character device")


# ---------------------------------------------------------------------------------------------- config.json types


@pytest.mark.parametrize(
    ("base", "field", "value", "needle"),
    [
        (GPT2, "tie_word_embeddings", "yes", "tie_word_embeddings: expected true or false, got 'yes'"),
        (GPT2, "scale_attn_weights", 0, "scale_attn_weights: expected true or false, got the number 0"),
        (GPT2, "layer_norm_epsilon", "1e-5", "layer_norm_epsilon: expected a number, got '1e-5'"),
        (GPT2, "activation_function", ["gelu"], "activation_function: expected an activation name, got a list"),
        (GPT2, "architectures", {"0": "GPT2LMHeadModel"}, "architectures: expected a list of class names"),
        (GPT2, "architectures", "GPT2LMHeadModel", "architectures: expected a list of class names"),
        (GPT2, "model_type", 2, "model_type: expected a name, got the number 2"),
        (GPT2, "dtype", "int8", "dtype: 'int8' is not a dtype specc builds models in"),
        (GPT2, "torch_dtype", "float64", "torch_dtype: 'float64' is not a dtype specc builds models in"),
        (GPT2, "dtype", 16, "dtype: the number 16 is not a dtype"),
        (GPT2, "n_inner", "64", "n_inner: expected a positive whole number, got '64'"),
        (GPT2, "n_embd", 16.0, "n_embd: expected a positive whole number, got the number 16.0"),
        (GPT2, "n_layer", True, "n_layer: expected a positive whole number, got the boolean true"),
        (GPT2, "attn_pdrop", "0.1", "attn_pdrop: expected a probability between 0 and 1"),
        (GPT2, "initializer_range", None, "initializer_range: expected a number, got null"),
        (LLAMA, "rope_parameters", "abc", "rope_parameters: expected an object, got 'abc'"),
        (LLAMA, "rope_scaling", [1, 2], "rope_scaling: expected an object, got a list of 2 items"),
        (LLAMA, "rope_theta", "10000", "rope_theta: expected a number, got '10000'"),
        (LLAMA, "rope_parameters", {"rope_theta": "1e4", "rope_type": "default"}, "rope_parameters.rope_theta"),
        (LLAMA, "rope_parameters", {"rope_theta": 1e4, "rope_type": 3}, "rope_parameters.rope_type: expected a name"),
        (LLAMA, "rms_norm_eps", "1e-6", "rms_norm_eps: expected a number"),
        (LLAMA, "head_dim", "8", "head_dim: expected a positive whole number"),
        (LLAMA, "sliding_window", "4", "sliding_window: expected a positive whole number"),
        (LLAMA, "use_sliding_window", "false", "use_sliding_window: expected true or false"),
        (LLAMA, "attention_bias", "false", "attention_bias: expected true or false"),
        (LLAMA, "hidden_act", {"name": "silu"}, "hidden_act: expected an activation name, got an object"),
    ],
)
def test_wrong_types_are_located_never_guessed(cli: CLI, tmp_path: Path, base, field, value, needle) -> None:
    d = folder(tmp_path, {**base, field: value})
    line = one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), needle)
    text = (d / "config.json").read_text()
    want = text[: text.index(f'"{field}"')].count("\n") + 1
    assert line.startswith(f"{d / 'config.json'}:{want}:"), line  # at the field's own line
    assert not (tmp_path / "s.yaml").exists()


def test_dtype_names_that_are_weights_dtypes_import(tmp_path: Path) -> None:
    assert import_hf(folder(tmp_path, {**GPT2, "torch_dtype": "torch.bfloat16"}, "a")).spec.dtype == "bf16"
    assert import_hf(folder(tmp_path, {**GPT2, "dtype": "float16"}, "b")).spec.dtype == "fp16"
    assert import_hf(folder(tmp_path, {**GPT2, "dtype": None}, "c")).spec.dtype == "fp32"


# ---------------------------------------------------------------------------------------------- model.safetensors


def _weights_beside(tmp_path: Path, content: bytes | None, name: str) -> Path:
    d = folder(tmp_path, GPT2, name)
    if content is not None:
        (d / "model.safetensors").write_bytes(content)
    return d


def _good_bytes() -> bytes:
    import safetensors.torch

    return safetensors.torch.save({"wte.weight": torch.zeros(32, 16)})


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "not a safetensors file: the file is empty"),
        (b"\x01\x02\x03", "3 bytes, shorter than the 8-byte header length"),
        (os.urandom(64), "not a safetensors file"),
        ((10**12).to_bytes(8, "little") + b"{}", "header claims 1,000,000,000,000 bytes"),
        ((400).to_bytes(8, "little") + b'{"a":', "header claims 400 bytes but the file has 5"),
        (_good_bytes()[:-100], "truncated"),
        (_good_bytes() + b"junk", "4 bytes follow the last tensor"),
        ((2).to_bytes(8, "little") + b"[]", "header is not a JSON object"),
    ],
    ids=["empty", "short", "random", "huge-header", "truncated-header", "truncated-data", "trailing", "list"],
)
def test_damaged_checkpoint_beside_config(cli: CLI, tmp_path: Path, content: bytes, needle: str) -> None:
    d = _weights_beside(tmp_path, content, "m")
    line = one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), needle)
    assert str(d / "model.safetensors") in line
    spec = import_hf(d).spec
    with pytest.raises(SpecError, match="not a safetensors file"):
        specc.build_torch(spec, weights=d / "model.safetensors")


def test_checkpoint_that_is_a_device_fifo_or_dangling_link(cli: CLI, tmp_path: Path) -> None:
    d = _weights_beside(tmp_path, None, "a")
    (d / "model.safetensors").symlink_to("/dev/zero")
    one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), "character device")
    d = _weights_beside(tmp_path, None, "b")
    fifo(d / "model.safetensors")
    start = time.perf_counter()
    one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), "FIFO")
    assert time.perf_counter() - start < 5
    d = _weights_beside(tmp_path, None, "c")
    (d / "model.safetensors").symlink_to(tmp_path / "nowhere.safetensors")
    one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), "symbolic link", "does not exist")
    # a symbolic link to a real checkpoint (Hugging Face's cache layout) is followed
    d = _weights_beside(tmp_path, None, "d")
    blob = tmp_path / "blob"
    blob.write_bytes(_good_bytes())
    (d / "model.safetensors").symlink_to(blob)
    assert checkpoint.shapes(d / "model.safetensors") == {"wte.weight": (32, 16)}


# ---------------------------------------------------------------------------------------------- sharded indexes


def _sharded(tmp_path: Path, index: object, name: str = "s") -> Path:
    d = folder(tmp_path, GPT2, name)
    save_file({"wte.weight": torch.zeros(32, 16)}, d / "model-00001-of-00001.safetensors")
    raw = index if isinstance(index, str) else json.dumps(index)
    (d / checkpoint.INDEX).write_text(raw)
    return d


@pytest.mark.parametrize(
    ("index", "needle"),
    [
        ([1, 2], "a safetensors index must be a JSON object, not a list of 2 items"),
        (7, "a safetensors index must be a JSON object, not the number 7"),
        ({"weight_map": ["model-00001-of-00001.safetensors"]}, "weight_map must map tensor names to shard files"),
        ({"weight_map": 3}, "weight_map must map tensor names"),
        ({"weight_map": {}}, "weight_map is empty"),
        ({"weight_map": {"wte.weight": 1}}, "weight_map['wte.weight']: expected a file name, got 1"),
        ({"weight_map": {"wte.weight": "../x.safetensors"}}, "'../x.safetensors' is not a file name in the folder"),
        ({"weight_map": {"wte.weight": "/etc/passwd"}}, "'/etc/passwd' is not a file name in the folder"),
        ({"weight_map": {"wte.weight": "sub/../../x"}}, "is not a file name in the folder"),
        ({"weight_map": {"wte.weight": "absent.safetensors"}}, "no such file"),
        ({"weight_map": {"lm.weight": "model-00001-of-00001.safetensors"}}, "lacks 'lm.weight'"),
        ({"weight_map": {"wte.weight": "model-00001-of-00001.safetensors"}, "metadata": 3}, "metadata must be an obj"),
        ('{"weight_map": {"wte.weight": "a", "wte.weight": "b"}}', "duplicate key 'wte.weight'"),
    ],
)
def test_bad_index_is_one_line(cli: CLI, tmp_path: Path, index: object, needle: str) -> None:
    d = _sharded(tmp_path, index)
    one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), needle)
    spec = tmp_path / "spec.yaml"
    spec.write_text("extends: gpt2\nblocks: 1\nd_model: 16\nattention: {heads: 2}\nvocab_size: 32\ncontext: 16\n")
    one_line(cli("compile", spec, "--weights", d / checkpoint.INDEX, "-o", tmp_path / "o.safetensors"), needle)
    assert not (tmp_path / "o.safetensors").exists()


def test_index_shard_that_is_a_fifo_does_not_hang(cli: CLI, tmp_path: Path) -> None:
    d = _sharded(tmp_path, {"weight_map": {"wte.weight": "pipe.safetensors"}})
    fifo(d / "pipe.safetensors")
    start = time.perf_counter()
    one_line(cli("import-hf", d, "-o", tmp_path / "s.yaml"), "FIFO")
    assert time.perf_counter() - start < 5


def test_index_shard_may_be_a_link_into_a_blob_store(tmp_path: Path) -> None:
    """Hugging Face's cache: snapshots/<rev>/model-*.safetensors are links to ../../blobs/<hash>."""
    d = _sharded(tmp_path, {"weight_map": {"wte.weight": "linked.safetensors"}})
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    (d / "model-00001-of-00001.safetensors").rename(blob)
    (d / "linked.safetensors").symlink_to(blob)
    assert checkpoint.shapes(d) == {"wte.weight": (32, 16)}


# ---------------------------------------------------------------------------------------------- weight values


def _tiny():
    return specc.load_spec("gpt2", ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=32", "context=16"])


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.float64, torch.int64, torch.float8_e4m3fn])
def test_non_float_weights_are_refused_not_cast(tmp_path: Path, dtype: torch.dtype) -> None:
    spec = _tiny()
    state = specc.build_torch(spec).state_dict()
    state["blocks.0.mlp.fc1.weight"] = state["blocks.0.mlp.fc1.weight"].to(dtype)
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, path)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(SpecError, match=rf"blocks\.0\.mlp\.fc1\.weight \({name}\)"):
        specc.build_torch(spec, weights=path)
    with pytest.raises(SpecError, match="must be float32, float16 or bfloat16"):
        specc.build_torch(spec, weights=state)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_weights_name_the_tensor(cli: CLI, tmp_path: Path, bad: float) -> None:
    spec = _tiny()
    state = specc.build_torch(spec).state_dict()
    state["blocks.0.attn.qkv.weight"][3, 1] = bad
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, path)
    with pytest.raises(SpecError, match=r"weight blocks\.0\.attn\.qkv\.weight holds 1 (NaN|infinite) value"):
        specc.build_torch(spec, weights=path)
    ck = tmp_path / "ck.safetensors"
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        ck,
        metadata={"specc.spec": json.dumps(spec.model_dump(mode="json"))},
    )
    one_line(cli("generate", ck, "-p", "1 2", "-n", "2", "--temperature", "1"), "blocks.0.attn.qkv.weight")


def test_float_weights_in_bf16_and_fp16_load(tmp_path: Path) -> None:
    spec = _tiny()
    state = {k: v.to(torch.bfloat16) for k, v in specc.build_torch(spec).state_dict().items()}
    path = tmp_path / "w.safetensors"
    save_file(state, path)
    model = specc.build_torch(spec, weights=path)
    got = model.state_dict()["blocks.0.mlp.fc1.weight"]
    assert torch.equal(got, state["blocks.0.mlp.fc1.weight"].float())  # bf16 → fp32 is exact
