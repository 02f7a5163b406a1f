"""Torch backend outputs: checkpoints with the spec inside, weight checks, the standalone model.py, the memory
guard, and tracing (torch.export / torch.compile without graph breaks)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_torch_cases import (
    model_of,
    one_thread,  # noqa: F401  (autouse fixture)
    tiny,
)

from specc.backends.torch import build_torch, compile_checkpoint, example_inputs, load_checkpoint, write_model_py
from specc.backends.torch.checkpoint import read_spec
from specc.errors import SpecError

ARTIFACT_CASES = ["gpt2", "mixtral_moe", "bert_pooled", "transformer", "vit_mean_learned_2d", "gru_bahdanau"]


def _trained(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Weights unlike the seeded init, so a loader that silently re-initialises is caught."""
    gen = torch.Generator().manual_seed(7)
    return {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def _outputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every output by name through forward (model.py's models have no ``run``)."""
    with torch.no_grad():
        out = model(**inputs, **({"return_all": True} if "return_all" in model.forward.__code__.co_varnames else {}))
    return out if isinstance(out, dict) else {"logits": out}


def _same_outputs(a: torch.nn.Module, b: torch.nn.Module) -> None:
    inputs = example_inputs(a.graph, batch=2, length=5)
    out_a, out_b = _outputs(a, inputs), _outputs(b, inputs)
    assert out_a.keys() == out_b.keys()
    for name, value in out_a.items():
        torch.testing.assert_close(out_b[name], value, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("case", ARTIFACT_CASES)
def test_checkpoint_round_trip(case: str, tmp_path: Path) -> None:
    spec = tiny(case)
    weights = _trained(build_torch(spec))
    path = compile_checkpoint(spec, tmp_path / "m.safetensors", weights=weights)
    assert read_spec(path) == spec
    loaded = load_checkpoint(path)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, weights[k]), k
    _same_outputs(build_torch(spec, weights=weights), loaded)
    _same_outputs(loaded, build_torch(spec, weights=path))  # a checkpoint also serves as plain --weights


def test_checkpoint_dtype_is_recorded(tmp_path: Path) -> None:
    path = compile_checkpoint(tiny("llama_gqa_rope"), tmp_path / "m.safetensors", dtype="bf16")
    assert {t.dtype for t in load_file(path).values()} == {torch.bfloat16}
    assert read_spec(path).dtype == "bf16"
    assert load_checkpoint(path).embed.weight.dtype == torch.bfloat16


def test_weights_are_checked_by_name(tmp_path: Path) -> None:
    spec = tiny("gpt2")
    good = build_torch(spec).state_dict()
    bad = dict(good)
    del bad["blocks.1.mlp.fc1.bias"]
    bad["blocks.9.attn.qkv.weight"] = torch.zeros(3)
    bad["pos.weight"] = torch.zeros(16, 32)
    with pytest.raises(SpecError) as e:
        build_torch(spec, weights=bad)
    text = str(e.value)
    for expected in ("missing (1): blocks.1.mlp.fc1.bias", "unexpected (1): blocks.9.attn.qkv.weight",
                     "pos.weight: [16, 32] (expected [32, 32])"):  # fmt: skip
        assert expected in text
    save_file({k: v.contiguous() for k, v in bad.items()}, tmp_path / "bad.safetensors")
    with pytest.raises(SpecError, match=r"bad\.safetensors"):
        build_torch(spec, weights=tmp_path / "bad.safetensors")
    with pytest.raises(SpecError, match="no such weights file"):
        build_torch(spec, weights=tmp_path / "absent.safetensors")


def test_cli_compile_torch_and_refusal_of_gpt3(cli, tmp_path: Path) -> None:
    code, _, err = cli("compile", "gpt2", "--set", "blocks=1", "-o", tmp_path / "g.safetensors", "--dtype", "fp16")
    assert code == 0, err
    assert read_spec(tmp_path / "g.safetensors").blocks == 1
    start = time.perf_counter()
    code, _, err = cli("compile", "gpt3-175b", "--target", "torch", "-o", tmp_path / "big.safetensors")
    assert code == 2 and time.perf_counter() - start < 20
    assert "gpt3-175b needs 325.2 GiB" in err and "174,604,259,328 float16 parameters" in err
    assert not (tmp_path / "big.safetensors").exists()


# ------------------------------------------------------------------------------ standalone model.py


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"standalone_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_standalone_with_weights_runs_without_specc(tmp_path: Path) -> None:
    spec = tiny("gpt2")
    weights = _trained(build_torch(spec))
    path = write_model_py(spec, tmp_path / "model.py", weights=weights)
    assert (tmp_path / "model.safetensors").is_file()
    # -I: isolated mode, so the repository (and specc) is not importable from the child.
    check = "import model; m = model.build(); assert 'specc' not in sys.modules; print(m.embed.weight.sum().item())"
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, '.'); {check}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) == pytest.approx(weights["embed.weight"].sum().item(), rel=1e-5)
    assert _import(path).build().state_dict()["pos.weight"].equal(weights["pos.weight"])


# ------------------------------------------------------------------------------ tracing


@pytest.mark.parametrize("padded", [False, True], ids=["causal_kernel", "padding_mask"])
def test_torch_export_of_a_tiny_decoder_with_dynamic_length(padded: bool) -> None:
    model = model_of("llama_gqa_rope")
    n = torch.export.Dim("n", min=2, max=32)

    def args(length: int) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, 64, (2, length))
        return (ids, torch.ones_like(ids).index_fill(1, torch.tensor([0]), 0)) if padded else (ids,)

    shapes = {"input_ids": {1: n}, **({"attention_mask": {1: n}} if padded else {})}
    program = torch.export.export(model, args(7), dynamic_shapes=shapes)
    other = args(11)
    torch.testing.assert_close(program.module()(*other), model(*other), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["gpt2", "mixtral_moe"])
def test_torch_compile_has_no_graph_breaks(case: str) -> None:
    model = model_of(case)
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # fullgraph: any graph break raises
    ids, mask = torch.randint(0, 64, (2, 6)), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids, mask), model(ids, mask), atol=1e-5, rtol=1e-5)
