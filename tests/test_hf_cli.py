"""The CLI end to end with a Hugging Face checkpoint: import-hf, compile --weights, generate --weights; and the
runnable example in examples/hf."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_hf_zoo import BY_ID, save

ort = pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def imported(cli, tmp_path: Path):
    model, folder = save(BY_ID["llama-gqa"], tmp_path, std=0.3)
    spec = tmp_path / "llama.yaml"
    code, _, stderr = cli("import-hf", folder, "-o", spec)
    assert code == 0, stderr
    return model, folder / "model.safetensors", spec


def test_compile_onnx_with_hf_weights(cli, imported, tmp_path: Path) -> None:
    model, weights, spec = imported
    onnx = tmp_path / "m.onnx"
    code, _, stderr = cli("compile", spec, "--target", "onnx", "--weights", weights, "-o", onnx)
    assert code == 0, stderr
    ids = np.random.default_rng(0).integers(0, 96, (2, 9))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    got = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert np.abs(got - ref).max() < 1e-4


def _hf_tokens(model, prompt: list[int], n: int) -> list[int]:
    model.generation_config.update(eos_token_id=None, pad_token_id=0, do_sample=False)
    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n)[0].tolist()


def test_generate_with_hf_weights_and_from_a_compiled_checkpoint(cli, imported, tmp_path: Path) -> None:
    model, weights, spec = imported
    prompt = [5, 17, 42, 8]
    want = " ".join(map(str, _hf_tokens(model, prompt, 8)))
    code, out, stderr = cli("generate", spec, "--weights", weights, "-p", "5 17 42 8", "-n", 8)
    assert code == 0, stderr
    assert out.strip() == want
    ckpt = tmp_path / "llama.safetensors"
    assert cli("compile", spec, "--target", "torch", "--weights", weights, "-o", ckpt)[0] == 0
    code, out, _ = cli("generate", ckpt, "-p", "5 17 42 8", "-n", 8)
    assert code == 0 and out.strip() == want


def test_weights_of_a_different_size_are_refused_by_name(cli, imported, tmp_path: Path) -> None:
    _, weights, spec = imported
    code, _, stderr = cli("compile", spec, "--weights", weights, "--set", "blocks=1", "-o", tmp_path / "x.safetensors")
    assert code == 2
    assert "unexpected tensor: model.layers.1." in stderr


def test_the_example_runs(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples" / "hf"))
    try:
        import bring_your_model
    finally:
        sys.path.pop(0)
    result = bring_your_model.main(["--family", "gpt2", "--out", str(tmp_path)])
    assert result["torch"] < 1e-4 and result["onnx"] < 1e-4 and result["generate_mismatches"] == 0
    assert (tmp_path / "spec.yaml").is_file() and (tmp_path / "model.onnx").is_file()
