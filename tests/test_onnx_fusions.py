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
from test_onnx_parity import inputs, run, torch_reference

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


ENCDEC = ("transformer-base", [*TEXT, "mlp.hidden=64", "target_vocab_size=61"])


@pytest.mark.parametrize("case", ["bert", "encdec", "gpt2_fp16"])
def test_qkv_bias_is_the_multi_head_attention_bias_input(tmp_path: Path, case: str) -> None:
    """MultiHeadAttention adds the projection bias itself (its ``bias`` input, [q | k | v]): no Add is left for
    it; a cross-attention's q and kv biases are concatenated into one."""
    preset, sets = {"bert": ("bert-base", [*TEXT, "mlp.hidden=64"]), "encdec": ENCDEC,
                    "gpt2_fp16": CASES["gpt2_prenorm_layernorm"][:2]}[case]  # fmt: skip
    dtype = "fp16" if case == "gpt2_fp16" else "fp32"
    spec = specc.load_spec(preset, sets)
    weights = _perturbed(spec)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=weights, attention="contrib", dtype=dtype)
    model = onnx.load(path)
    mha = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert mha and all(len(n.input) > 3 and n.input[3] for n in mha)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in mha:
        assert inits[n.input[3]].shape == (3 * spec.d_model,)
    layers = {n.name.split("/")[0].removesuffix(".core") for n in mha}
    biases = {f"{layer}.{p}.bias" for layer in layers for p in ("qkv", "q", "kv")}
    assert not any(i in biases for n in model.graph.node if n.op_type == "Add" for i in n.input)
    feeds, valid = inputs(spec, True, np.random.default_rng(0))
    want = torch_reference(specc.build_torch(spec, weights=weights), spec, feeds)["logits"]
    if dtype == "fp16":
        feeds = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    got = run(_session(path), feeds)["logits"].astype(np.float32)
    tol = 2e-2 * max(1.0, np.abs(want).max()) if dtype == "fp16" else 1e-4
    assert np.abs(got - want)[valid].max() <= tol


def test_fp32_causal_attention_is_packed_group_query_attention(tmp_path: Path) -> None:
    """fp32 GPT-2: GroupQueryAttention reads the biased packed projection directly (no Split), with and without
    the KV cache; the KV-cache graph's steps equal torch."""
    preset, sets, _ = CASES["gpt2_prenorm_layernorm"]
    spec = specc.load_spec(preset, sets)
    weights = _perturbed(spec)
    for kv in (False, True):
        path = export_onnx(spec, tmp_path / f"m{kv}.onnx", weights=weights, attention="contrib", kv_cache=kv)
        ops = Counter(n.op_type for n in onnx.load(path).graph.node)
        assert ops["GroupQueryAttention"] == spec.blocks
        assert ops["Split"] == ops["MultiHeadAttention"] == 0
    sess = _session(path)
    ids = np.random.default_rng(1).integers(0, spec.vocab_size, (2, 9))
    with torch.inference_mode():
        want = specc.build_torch(spec, weights=weights)(torch.from_numpy(ids)).numpy()
    names = [o.name for o in sess.get_outputs()]
    past = {i.name: np.zeros((2, 4, 0, 8), np.float32) for i in sess.get_inputs() if i.name.startswith("past_")}
    start = 0
    for end in (6, 7, 8, 9):
        feeds = {"input_ids": ids[:, start:end], "attention_mask": np.ones((2, end), np.int64), **past}
        out = dict(zip(names, sess.run(None, feeds), strict=True))
        assert np.abs(out["logits"] - want[:, start:end]).max() <= 1e-4
        past = {k: out[k.replace("past_key_values", "present")] for k in past}
        start = end
