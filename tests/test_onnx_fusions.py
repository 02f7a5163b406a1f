"""Fused contrib ops in the onnxruntime-specific graph (``--attention contrib``): residual Add (+ the linear's
bias) + LayerNorm / RMSNorm → SkipLayerNormalization / SkipSimplifiedLayerNormalization, which onnxruntime
does not fuse by itself on the dynamic-shape graph; logits equal torch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import specc
from specc.backends.onnx.export import export_onnx

TEXT = ["blocks=3", "d_model=32", "attention.heads=4", "context=24", "vocab_size=61"]
CASES = {
    "gpt2_prenorm_layernorm": ("gpt2", [*TEXT, "mlp.hidden=64"], "SkipLayerNormalization"),
    "llama_rmsnorm": ("llama2-7b", [*TEXT, "attention.kv_heads=2", "mlp.hidden=48", "dtype=fp32"],
                      "SkipSimplifiedLayerNormalization"),
}  # fmt: skip


def _session(path: Path, optimized: Path | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    if optimized:
        so.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _perturbed(spec) -> dict[str, torch.Tensor]:
    """Seeded init plus noise: biases and norm shifts are not zero."""
    g = torch.Generator().manual_seed(0)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in specc.build_torch(spec).state_dict().items()}


@pytest.mark.parametrize("name", list(CASES))
def test_contrib_graph_fuses_residual_norms_and_matches_torch(tmp_path: Path, name: str) -> None:
    preset, sets, fused_op = CASES[name]
    spec = specc.load_spec(preset, sets)
    weights = _perturbed(spec)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=weights, attention="contrib")
    ops = Counter(n.op_type for n in onnx.load(path).graph.node)
    # per block: the norm after the attention residual and the one after the MLP residual (the next block's
    # first norm, or the final norm); the first block's first norm reads the embedding, not a residual
    assert ops[fused_op] == 2 * spec.blocks
    assert ops["LayerNormalization"] + ops["RMSNormalization"] == 1
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, (2, 7))
    mask = np.ones_like(ids)
    got = _session(path).run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]
    with torch.inference_mode():
        want = specc.build_torch(spec, weights=weights)(torch.from_numpy(ids)).numpy()
    assert np.abs(got - want).max() <= 1e-4


def test_linear_biases_fold_into_the_fused_norm(tmp_path: Path) -> None:
    """GPT-2's attention-out and fc2 biases become the fused op's bias input: no Add is left for them."""
    preset, sets, _ = CASES["gpt2_prenorm_layernorm"]
    spec = specc.load_spec(preset, sets)
    model = onnx.load(export_onnx(spec, tmp_path / "m.onnx", attention="contrib"))
    fused = [n for n in model.graph.node if n.op_type == "SkipLayerNormalization"]
    biases = {n.input[4] for n in fused if len(n.input) > 4}
    assert biases == {f"blocks.{i}.{p}.bias" for i in range(spec.blocks) for p in ("attn.out", "mlp.fc2")}
    adds = [n for n in model.graph.node if n.op_type == "Add"]
    assert not any(i in biases for n in adds for i in n.input)


def test_standard_graph_is_not_fused_by_onnxruntime_itself(tmp_path: Path) -> None:
    """Why the contrib graph emits the fusion: ORT (ORT_ENABLE_ALL) leaves the standard graph's norms alone."""
    preset, sets, _ = CASES["gpt2_prenorm_layernorm"]
    spec = specc.load_spec(preset, sets)
    path = export_onnx(spec, tmp_path / "m.onnx")
    _session(path, optimized=tmp_path / "opt.onnx")
    ops = Counter(n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node)
    assert ops["SkipLayerNormalization"] == 0
    assert ops["LayerNormalization"] == 2 * spec.blocks + 1


def test_fused_fp16_graph_runs_within_half_precision_tolerance(tmp_path: Path) -> None:
    preset, sets, fused_op = CASES["gpt2_prenorm_layernorm"]
    spec = specc.load_spec(preset, sets)
    path = export_onnx(spec, tmp_path / "m.onnx", attention="contrib", dtype="fp16")
    assert fused_op in {n.op_type for n in onnx.load(path).graph.node}
    ids = np.random.default_rng(1).integers(0, spec.vocab_size, (2, 7))
    got = _session(path).run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    with torch.inference_mode():
        want = specc.build_torch(spec)(torch.from_numpy(ids)).numpy()
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float32) - want).max() <= 2e-2 * max(1.0, np.abs(want).max())
