"""HF Llama with every RoPE scaling type imports (both config dialects) and computes HF's logits in torch and
through ONNX; Llama 3.1-style generation with the KV cache gives HF's tokens; unknown RoPE fields are located."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_hf_zoo import Case, save

import specc
from specc.errors import SpecError
from specc.interop import import_hf

ort = pytest.importorskip("onnxruntime")

ATOL = 1e-4
MAX = 16  # max_position_embeddings; the inputs below are 20 tokens long
_LLAMA = dict(
    hidden_size=32, intermediate_size=48, num_hidden_layers=2, vocab_size=96, max_position_embeddings=MAX,
    num_attention_heads=4, num_key_value_heads=2,
)  # fmt: skip
ROPES: dict[str, dict[str, Any]] = {
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 4},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 3.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4,
             "beta_fast": 8.0},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 8,
                 "short_factor": [1.0, 1.1, 1.3, 1.7], "long_factor": [1.5, 2.5, 6.0, 11.0]},
}  # fmt: skip


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[Any, Path]] = {}

    def get(name: str) -> tuple[Any, Path]:
        if name not in cache:
            case = Case(f"llama-{name}", "LlamaForCausalLM", dict(_LLAMA, rope_parameters=dict(ROPES[name])))
            cache[name] = save(case, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


def _legacy(folder: Path, dest: Path) -> Path:
    """The same checkpoint with the hub's 4.x dialect: rope_theta + rope_scaling {type, ...}."""
    dest.mkdir()
    cfg = json.loads((folder / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    kind = params.pop("rope_type")
    key = "type" if kind in ("linear", "dynamic") else "rope_type"  # as the hub's files spell them
    cfg["rope_scaling"] = {key: kind, **params} if kind != "default" else None
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    (dest / "model.safetensors").symlink_to(folder / "model.safetensors")
    return dest


def _inputs() -> dict[str, torch.Tensor]:
    ids = torch.randint(3, 95, (2, 20), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0  # right padding
    return {"input_ids": ids, "attention_mask": mask}


def _compare(got: Any, want: torch.Tensor, mask: torch.Tensor) -> None:
    keep = mask.bool()
    torch.testing.assert_close(torch.as_tensor(np.asarray(got))[keep], want[keep], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(ROPES))
@pytest.mark.parametrize("dialect", ["rope_parameters", "rope_scaling"])
def test_logits_equal_hf_in_torch_and_onnx(saved, name: str, dialect: str, tmp_path: Path) -> None:
    hf, folder = saved(name)
    if dialect == "rope_scaling":
        folder = _legacy(folder, tmp_path / "legacy")
    spec = import_hf(folder).spec
    assert spec.position.scaling is not None and spec.position.scaling.type == name
    weights = str(folder / "model.safetensors")
    x = _inputs()
    with torch.no_grad():
        want = hf(**x).logits
        got = specc.build_torch(spec, weights=weights).run(dict(x))["logits"]
    _compare(got, want, x["attention_mask"])
    if dialect == "rope_scaling":
        return  # the same spec: ONNX is checked once per type
    path = specc.export_onnx(spec, tmp_path / "m.onnx", weights=weights)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    out = sess.run(["logits"], {k: v.numpy() for k, v in x.items()})[0]
    _compare(out, want, x["attention_mask"])


@pytest.mark.parametrize("name", ["llama3", "dynamic", "longrope"])
def test_without_the_scaling_the_logits_differ(saved, name: str) -> None:
    """The comparisons are not vacuous: plain RoPE with the same weights is far from HF."""
    hf, folder = saved(name)
    doc = import_hf(folder).document
    doc["position"].pop("scaling")
    x = _inputs()
    with torch.no_grad():
        got = specc.build_torch(specc.load_spec(doc), weights=str(folder / "model.safetensors")).run(dict(x))
        want = hf(**x).logits
    assert (got["logits"] - want).abs().max() > 100 * ATOL


@pytest.mark.parametrize("name", ["llama3", "dynamic", "longrope"])
def test_greedy_generation_with_kv_cache_equals_hf(saved, name: str, tmp_path: Path) -> None:
    """Generation crosses the original context (longrope: 8, dynamic: 16): keys cached before the switch keep
    their rotation, as in HF's generate."""
    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    hf, folder = saved(name)
    spec = import_hf(folder).spec
    ids = torch.randint(3, 95, (1, 5), generator=torch.Generator().manual_seed(2))
    n = 14
    gc = hf.generation_config
    gc.update(eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=n, min_new_tokens=n)[:, ids.shape[1] :]
    weights = str(folder / "model.safetensors")
    got = specc.build_torch(spec, weights=weights).generate(ids, n, use_cache=True)
    assert got[:, -n:].tolist() == want.tolist()
    path = specc.export_onnx(spec, tmp_path / "m.onnx", weights=weights, kv_cache=True)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    assert greedy(OrtModel.open(path, provider="cpu", threads=1), feeds, n).tolist() == want.tolist()


def _config(tmp_path: Path, **fields: Any) -> Path:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_LLAMA, **fields}
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=2))
    return tmp_path


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 4, "smoothing": 2.0}}, "rope_scaling.smoothing"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0, "magic": 1}},
         "rope_parameters.magic"),
        ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, "rope_parameters.rope_type"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "high_freq_factor": 4.0}},
         "rope_parameters.low_freq_factor"),
    ],
)  # fmt: skip
def test_unknown_rope_fields_are_located_errors(tmp_path: Path, fields: dict[str, Any], key: str) -> None:
    folder = _config(tmp_path, **fields)
    with pytest.raises(SpecError) as e:
        import_hf(folder)
    d = e.value.diagnostics[0]
    text = (folder / "config.json").read_text()
    line = text[: text.index(f'"{key.split(".")[0]}"')].count("\n") + 1
    assert d.message.startswith(f"{key}:") and d.line == line, d


def test_per_layer_type_rope_parameters(tmp_path: Path) -> None:
    """transformers 5's per-layer-type form: each layer type gets its own position mapping."""
    from specc.interop.hf_config import HFConfig
    from specc.interop.rope_config import rope_position

    folder = _config(
        tmp_path,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        },
    )
    cfg = HFConfig.read(folder)
    assert rope_position(cfg, "sliding_attention") == {"type": "rotary", "theta": 10000.0}
    assert rope_position(cfg, "full_attention") == {
        "type": "rotary",
        "theta": 1e6,
        "scaling": {"type": "linear", "factor": 8.0},
    }
    with pytest.raises(SpecError, match="per layer type"):
        rope_position(cfg)
