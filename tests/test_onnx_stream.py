"""Streamed ONNX export: weights go from their source to the file a chunk at a time, the result equals the torch
backend's model, and the peak memory stays a fixed amount above the interpreter's whatever the model's size
(RLIMIT_AS smaller than the model's fp32 bytes included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from test_hf_zoo import BY_ID, build

import specc
import specc.backends.onnx.recipes as recipes
import specc.backends.onnx.sources as sources
from specc.backends.onnx.export import export_peak_bytes
from specc.interop.hf_import import import_hf

ort = pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[1]
TINY = ["blocks=2", "d_model=64", "attention.heads=4", "vocab_size=300", "context=32", "mlp.hidden=128"]


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 1 KiB: every tensor of a tiny model crosses several (and seeded ones are drawn in pieces)."""
    monkeypatch.setattr(recipes, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(sources, "CHUNK_BYTES", 1024)


def _tensors(path: Path) -> dict[str, bytes]:
    model = onnx.load(str(path))
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
def test_chunks_change_no_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quantize: str | None) -> None:
    """Casting, drawing the seeded init and quantizing in 1 KiB pieces writes the bytes of one-piece runs."""
    spec = specc.load_spec("llama2-7b", [*TINY, "attention.kv_heads=2", "dtype=fp32"])
    whole = specc.export_onnx(spec, tmp_path / "whole.onnx", quantize=quantize)
    monkeypatch.setattr(recipes, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(sources, "CHUNK_BYTES", 1024)
    pieces = specc.export_onnx(spec, tmp_path / "pieces.onnx", quantize=quantize)
    assert _tensors(whole) == _tensors(pieces)
    if quantize is None:
        ids = np.array([[1, 7, 299, 3]], np.int64)
        want = specc.build_torch(spec)(torch.from_numpy(ids)).detach().numpy()
        np.testing.assert_allclose(_logits(pieces, ids), want, atol=1e-5)


@pytest.mark.parametrize("case", ["llama-gqa", "gpt2-tied", "mixtral-4x2"])
def test_bf16_sharded_checkpoint_streams(tmp_path: Path, small_chunks: None, case: str) -> None:
    """A bf16 save_pretrained folder (sharded: read through its index) exports in fp32 and in fp16 to the
    torch backend's logits, its tensors read row range by row range (concatenated q/k/v, stacked experts) or
    built whole where the layout needs it (GPT-2's Conv1D transposes)."""
    folder = tmp_path / "hf"
    build(BY_ID[case]).to(torch.bfloat16).save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    spec = import_hf(folder).spec
    ids = np.array([[1, 5, 9, 2, 40]], np.int64)
    for dtype in ("fp32", "fp16"):  # (onnxruntime's CPU provider has no bf16 MatMul)
        path = specc.export_onnx(spec, tmp_path / f"{dtype}.onnx", weights=folder, dtype=dtype)
        model = specc.build_torch(spec, weights=folder, dtype=dtype)
        want = model(torch.from_numpy(ids)).detach().float().numpy()
        got = _logits(path, ids).astype(np.float32)
        np.testing.assert_allclose(got, want, atol=1e-4 if dtype == "fp32" else 2e-2)


def test_bf16_parameters_are_written_as_read(tmp_path: Path) -> None:
    """A bf16 source exported as bf16: each chunk written is the buffer read from the file (no fp32 copy)."""
    folder = tmp_path / "hf"
    build(BY_ID["llama-gqa"]).to(torch.bfloat16).save_pretrained(folder)
    spec = import_hf(folder).spec
    g = specc.lower(spec)
    src = sources.file_source(g, str(folder / "model.safetensors"))
    name = "blocks.0.mlp.up.weight"
    recipe = recipes.Cast(name, recipes.Out(name, ml_dtypes.bfloat16, tuple(g.params()[name].shape)))
    seen: list[np.ndarray] = []

    class Spy:
        def __init__(self, p):
            self.p, self.shape, self.dtype = p, p.shape, p.dtype

        def rows(self, a: int, b: int) -> np.ndarray:
            seen.append(self.p.rows(a, b))
            return seen[-1]

    chunks = [c for _, c in recipe.produce(lambda n: Spy(src.params[n]))]
    assert chunks and all(np.shares_memory(c, s) for c, s in zip(chunks, seen, strict=True))


PEAK = """
import json, sys
import torch, onnx, onnxruntime, specc
import specc.backends.onnx.export, specc.backends.onnx.quantize, onnxruntime.capi._pybind_state
def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))
spec = specc.load_spec("gpt2", ["blocks=1", "vocab_size=120000", "context=64"])
base = status("VmRSS:")
specc.export_onnx(spec, sys.argv[1], quantize=None if sys.argv[2] == "none" else sys.argv[2])
print(json.dumps({"base": base, "peak": status("VmHWM:"), "params": specc.lower(spec).num_params()}))
"""


@pytest.mark.parametrize("quantize", ["none", "int4"])
def test_peak_rss_is_a_fraction_of_the_model(tmp_path: Path, quantize: str) -> None:
    """The issue's target, peak RSS ≤ 0.5 GB + 0.25 × the fp32 model's bytes, on a 0.4 GB (fp32) model whose
    largest tensor alone is 0.37 GB: the whole-model export peaked at 4x the model's bytes above the
    interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "m.onnx"), quantize], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout.splitlines()[-1])
    fp32 = 4 * m["params"]
    assert m["peak"] <= 0.5e9 + 0.25 * fp32, m
    assert m["peak"] - m["base"] < 0.75 * fp32, m  # never the whole model (measured: 0.15-0.18 GB above)


LIMITED = """
import json, resource, sys
import torch, onnx, onnxruntime, specc
import specc.backends.onnx.export, specc.backends.onnx.quantize, onnxruntime.capi._pybind_state
import specc.backends.onnx.save
specc.backends.onnx.save.PROTO_LIMIT = 1 << 30  # stands in for 2 GB: the weights go to external data
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
limit = vm + (3 << 28)  # 0.75 GiB of address space above the imports
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
spec = specc.load_spec("gpt2", json.loads(sys.argv[2]))
fp32 = 4 * specc.lower(spec).num_params()
assert fp32 > limit, (fp32, limit)  # the model does not fit the process at all
specc.export_onnx(spec, sys.argv[1])
print(json.dumps({"limit": limit, "fp32": fp32}))
"""
BIG = ["blocks=2", "d_model=1024", "attention.heads=16", "mlp.hidden=4096", "vocab_size=380000", "context=64"]


def test_export_larger_than_the_address_space_limit(tmp_path: Path) -> None:
    """A 1.66 GB (fp32) model exported by a process that may map only 0.75 GiB more than its imports: the
    memory check lets it through and the graph computes the torch backend's logits."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    path = tmp_path / "big.onnx"
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(path), json.dumps(BIG)], capture_output=True,
                          text=True, env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout.splitlines()[-1])
    assert facts["fp32"] > facts["limit"]
    assert (tmp_path / "big.onnx.data").stat().st_size >= facts["fp32"]
    ids = np.array([[1, 379999, 5, 42]], np.int64)
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.disable_prepacking", "1")  # no packed copy of the tied head
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    del sess
    spec = specc.load_spec("gpt2", BIG)
    with torch.no_grad():
        want = specc.build_torch(spec)(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_the_estimate_is_the_streamed_peak() -> None:
    """Streamed, the estimate does not grow with the model; only the whole-model (dynamic int8) path does."""
    assert export_peak_bytes(7_000_000_000, "fp32") == export_peak_bytes(1_000_000, "fp32") < 1 << 30
    assert export_peak_bytes(1_000_000, "fp32", whole=True) >= 16.9e6  # measured on gpt2: 16.9 B/param
    assert export_peak_bytes(1_000_000, "fp32", held=1 << 30) > 2 << 30


def test_dynamic_int8_takes_the_whole_model_path(tmp_path: Path) -> None:
    """quantize_dynamic rewrites a whole model in memory: the weights are materialised for it, and the result
    tracks the float graph."""
    from specc.backends.onnx.quantize import Quantization

    spec = specc.load_spec("gpt2", ["blocks=1", "d_model=64", "attention.heads=4", "vocab_size=100", "context=32",
                                    "mlp.hidden=128"])  # fmt: skip
    q = specc.export_onnx(spec, tmp_path / "q.onnx", quantize=Quantization("int8", 32, method="dynamic"))
    f = specc.export_onnx(spec, tmp_path / "f.onnx")
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= {n.op_type for n in onnx.load(str(q)).graph.node}
    ids = np.array([[1, 2, 3, 99]], np.int64)
    got, want = _logits(q, ids), _logits(f, ids)
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.99


def test_specc_checkpoint_streams(tmp_path: Path, small_chunks: None) -> None:
    """A `specc compile --target torch` checkpoint (bf16, specc names) exports chunk by chunk to the logits of
    the torch model loaded from it."""
    spec = specc.load_spec("llama2-7b", [*TINY, "attention.kv_heads=2", "dtype=fp32"])
    from specc.backends.torch.checkpoint import compile_checkpoint

    ckpt = compile_checkpoint(spec, tmp_path / "m.safetensors", dtype="bf16")
    path = specc.export_onnx(spec, tmp_path / "m.onnx", weights=ckpt, dtype="fp32")
    ids = np.array([[3, 1, 4, 1, 5]], np.int64)
    with torch.no_grad():
        want = specc.build_torch(spec, weights=ckpt, dtype="fp32")(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(_logits(path, ids), want, atol=1e-5)
