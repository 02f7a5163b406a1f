"""Block features through ONNX (onnxruntime CPU EP): logits equal the torch backend's, with and without left
padding and with the KV cache; exactly one fused attention node per attention layer (QK-norm and the logit
transforms are ordinary nodes around it; the score softcap is the Attention op's ``softcap`` attribute)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from test_onnx_parity import inputs, run, session, torch_reference

import specc
from specc.backends.onnx.export import export_onnx
from specc.errors import SpecError

TEXT = ["blocks=2", "d_model=32", "attention.heads=4", "context=24", "vocab_size=61", "dtype=fp32", "init.std=0.3"]
RMS = ["norm.type=rmsnorm", "position=rotary", "mlp={type: swiglu, hidden: 48}"]
CASES: dict[str, list[str]] = {
    "sandwich_offset_softcaps_scale": [
        *RMS,
        "attention.kv_heads=2",
        "attention.qk_norm=head",
        "attention.softcap=1.5",
        "attention.scale=0.2",
        "norm.unit_offset=true",
        "norm.placement=sandwich",
        "output={softcap: 2.0, scale: 0.5}",
        "embedding_scale=sqrt_d_model",
        "mlp.activation=gelu_tanh",
    ],
    "output_norms_full_qk_norm": [*RMS, "attention.kv_heads=2", "attention.qk_norm=full", "norm.placement=output"],
    "parallel_shared_norm": ["mlp.hidden=40", "parallel=shared_norm", "position={type: rotary, fraction: 0.5}"],
    "parallel_separate_norms": ["mlp.hidden=40", "parallel=separate_norms", "bias={norm: false, head: true}"],
    "moe_sigmoid_shared_expert": [
        *RMS,
        "mlp={type: moe, experts: 4, active: 2, hidden: 24, router: {normalize: false}, "
        "shared: {hidden: 40, gate: sigmoid}}",
    ],
    "moe_classic_shared_expert": [
        "mlp={type: moe, experts: 3, active: 1, expert: classic, hidden: 20, shared: {hidden: 36}}"
    ],
}
B = 3


def _random_weights(spec: Any) -> dict[str, torch.Tensor]:
    """Every parameter redrawn (norm weights and unit offsets included, so that they matter)."""
    gen = torch.Generator().manual_seed(0)
    sd = specc.build_torch(spec).state_dict()
    return {k: torch.randn(v.shape, generator=gen) * 0.3 for k, v in sd.items()}


def _export(tmp_path: Path, name: str, **options: Any) -> tuple[Any, Any, Path]:
    spec = specc.load_spec("gpt2", TEXT + CASES[name])
    weights = _random_weights(spec)
    model = specc.build_torch(spec, weights=weights)
    return spec, model, export_onnx(spec, tmp_path / "m.onnx", weights=weights, **options)


PARITY = [(n, p) for n in CASES for p in (False, True)]


@pytest.mark.parametrize("name,padded", PARITY, ids=[f"{n}-{'padded' if p else 'no_pad'}" for n, p in PARITY])
def test_logits_match_torch(tmp_path: Path, name: str, padded: bool) -> None:
    spec, model, path = _export(tmp_path, name)
    feeds, valid = inputs(spec, padded, np.random.default_rng(0))
    want = torch_reference(model, spec, feeds)["logits"]
    got = run(session(path), feeds)["logits"]
    assert np.abs(got - want)[valid].max() <= 1e-4 * max(1.0, np.abs(want).max())
    assert np.abs(want[valid]).max() > 1e-2
    nodes = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert nodes.count("Attention") == spec.blocks  # one fused node per layer, whatever surrounds it


def test_softcap_is_the_attention_attribute(tmp_path: Path) -> None:
    _, _, path = _export(tmp_path, "sandwich_offset_softcaps_scale")
    attention = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Attention"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in attention]
    assert [round(a["softcap"], 6) for a in attrs] == [1.5, 1.5]
    assert [round(a["scale"], 6) for a in attrs] == [0.2, 0.2]


@pytest.mark.parametrize("name", ["sandwich_offset_softcaps_scale", "parallel_separate_norms"])
def test_kv_cache_steps_match_torch(tmp_path: Path, name: str) -> None:
    """Prefill 6 tokens, then 3 single-token steps through present/past: the torch model's last logits."""
    spec, model, path = _export(tmp_path, name, kv_cache=True)
    sess = session(path)
    ids = np.random.default_rng(1).integers(0, spec.vocab_size, (B, 9))
    past_names = [i.name for i in sess.get_inputs() if i.name.startswith("past_key_values")]
    kv_heads = spec.attention.kv_heads or spec.attention.heads
    head_dim = spec.d_model // spec.attention.heads
    feeds = {n: np.zeros((B, kv_heads, 0, head_dim), np.float32) for n in past_names}
    with torch.inference_mode():
        want = model(torch.from_numpy(ids)).numpy()
    start = 0
    for end in (6, 7, 8, 9):
        out = run(sess, {**feeds, "input_ids": ids[:, start:end], "attention_mask": np.ones((B, end), np.int64)})
        assert np.abs(out["logits"][:, -1] - want[:, end - 1]).max() <= 1e-4 * max(1.0, np.abs(want).max())
        feeds = {n: out[n.replace("past_key_values", "present")] for n in past_names}
        start = end


def test_contrib_multi_head_attention_refuses_softcap(tmp_path: Path) -> None:
    """fp16 graphs with kv_heads == heads keep MultiHeadAttention (the CUDA EP's fused op), which has no softcap."""
    spec = specc.load_spec("gpt2", [*TEXT, *RMS, "attention.softcap=5.0"])
    with pytest.raises(SpecError, match="MultiHeadAttention has no softcap"):
        export_onnx(spec, tmp_path / "m.onnx", attention="contrib", dtype="fp16")


@pytest.mark.parametrize("padded", [False, True], ids=["no_pad", "padded"])
def test_contrib_fp32_softcap_runs_as_group_query_attention(tmp_path: Path, padded: bool) -> None:
    """fp32 causal self-attention is GroupQueryAttention in the contrib graph, whose softcap attribute caps."""
    spec = specc.load_spec("gpt2", [*TEXT, *RMS, "attention.softcap=1.5"])
    weights = _random_weights(spec)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=weights, attention="contrib")
    nodes = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert nodes.count("GroupQueryAttention") == spec.blocks
    feeds, valid = inputs(spec, padded, np.random.default_rng(0))
    want = torch_reference(specc.build_torch(spec, weights=weights), spec, feeds)["logits"]
    got = run(session(path), feeds)["logits"]
    assert np.abs(got - want)[valid].max() <= 1e-4 * max(1.0, np.abs(want).max())


HF_CASES = [
    "gemma2_sandwich_softcaps_scale",
    "gemma3_offset_qk_norm_local_global_kinds",
    "olmo2_output_norms_full_qk_norm",
    "qwen2_moe_dense_layer_kind",
    "falcon40b_parallel_separate_norms_gqa",
    "gptj_parallel_shared_norm_interleaved_rope",
]


@pytest.mark.parametrize("case", HF_CASES)
def test_onnx_logits_equal_hf(tmp_path: Path, case: str) -> None:
    """The HF modules of tests/hf_block_cases.py, their weights copied by name, against onnxruntime."""
    from hf_block_cases import CASES, V, hf_model, spec_of

    arch, config, fields, mapping = CASES[case]
    hf = hf_model(arch, **config)
    spec = spec_of(**fields)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=mapping(hf.state_dict()))
    ids = np.random.default_rng(5).integers(0, V, (2, 11))
    with torch.no_grad():
        want = hf(torch.from_numpy(ids)).logits.numpy()
    got = session(path).run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, np.abs(want).max())


def test_encoder_decoder_qk_norm_on_self_and_cross_attention(tmp_path: Path) -> None:
    sets = [*TEXT, "mlp.hidden=48", "norm={type: rmsnorm, placement: pre}", "attention.qk_norm=full"]
    spec = specc.load_spec("transformer-base", sets)
    g = specc.lower(spec)
    assert {"decoder.blocks.0.cross_attn.q_norm", "decoder.blocks.0.cross_attn.k_norm"} <= {op.name for op in g.ops()}
    assert g.params()["decoder.blocks.0.cross_attn.k_norm.weight"].shape == (32,)  # k of the packed [k | v]
    weights = _random_weights(spec)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=weights)
    feeds, valid = inputs(spec, True, np.random.default_rng(6))
    want = torch_reference(specc.build_torch(spec, weights=weights), spec, feeds)["logits"]
    got = run(session(path), feeds)["logits"]
    assert np.abs(got - want)[valid].max() <= 1e-4 * max(1.0, np.abs(want).max())
