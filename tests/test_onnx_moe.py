"""Mixture of experts in ONNX: the sparse form (experts run on their routed tokens) and the dense form
(every expert on every token) equal the torch backend for every router / expert variant, and the sparse form
really skips unrouted experts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import specc
from specc.backends.onnx.export import export_onnx
from specc.errors import SpecError

TEXT = ["blocks=2", "d_model=32", "attention.heads=4", "context=24", "vocab_size=61", "dtype=fp32"]
VARIANTS = {  # mlp settings over a Mixtral-like (rotary, RMSNorm, GQA) decoder
    "swiglu_top2_norm": "{type: moe, experts: 4, active: 2, expert: swiglu, hidden: 24}",
    "swiglu_top1_unnorm_bias": "{type: moe, experts: 5, active: 1, expert: swiglu, hidden: 24, "
    "router: {normalize: false}}",
    "classic_gelu_top3_bias": "{type: moe, experts: 6, active: 3, expert: classic, hidden: 20, activation: gelu}",
    "classic_relu_top2_unnorm": "{type: moe, experts: 3, active: 2, expert: classic, hidden: 20, activation: relu, "
    "router: {normalize: false}}",
}
BIASED = {"swiglu_top1_unnorm_bias", "classic_gelu_top3_bias"}


def _spec(variant: str):
    bias = "true" if variant in BIASED else "false"
    sets = [*TEXT, "attention.kv_heads=2", f"mlp={VARIANTS[variant]}", f"bias={bias}"]
    return specc.load_spec("mixtral-8x7b", sets)


def _weights(spec) -> dict[str, torch.Tensor]:
    """The seeded init, perturbed so that biases (zero at init) are not zero."""
    g = torch.Generator().manual_seed(0)
    init = specc.build_torch(spec).state_dict()
    return {k: v + 0.1 * torch.randn(v.shape, generator=g) for k, v in init.items()}


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _feeds(spec, b: int = 3, n: int = 7) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(1).integers(0, spec.vocab_size, (b, n))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def _torch_logits(spec, weights, feeds) -> np.ndarray:
    with torch.inference_mode():
        return specc.build_torch(spec, weights=weights)(torch.from_numpy(feeds["input_ids"])).float().numpy()


@pytest.mark.parametrize("form", ["sparse", "dense"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_moe_logits_match_torch(tmp_path: Path, variant: str, form: str) -> None:
    spec = _spec(variant)
    weights = _weights(spec)
    if variant in BIASED:
        assert any(k.endswith(".b_in") or k.endswith(".b_gate") for k in weights)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=weights, moe=form)
    feeds = _feeds(spec)
    want = _torch_logits(spec, weights, feeds)
    got = _session(path).run(["logits"], feeds)[0]
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(want).max() > 1e-2
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert ("NonZero" in ops) == (form == "sparse")
    assert {p.key: p.value for p in onnx.load(path).metadata_props}["specc.moe"] == form


def _routed_experts(spec, weights, feeds) -> set[int]:
    """Experts of layer 0 that the torch model routes at least one token to."""
    model = specc.build_torch(spec, weights=weights)
    seen: list[torch.Tensor] = []
    hook = model.blocks[0].mlp.router.register_forward_hook(lambda m, i, o: seen.append(o.detach()))
    with torch.inference_mode():
        model(torch.from_numpy(feeds["input_ids"]))
    hook.remove()
    k = spec.mlp.active
    return set(seen[0].reshape(-1, spec.mlp.experts).topk(k, -1).indices.flatten().tolist())


def test_sparse_form_does_not_compute_unrouted_experts(tmp_path: Path) -> None:
    """Scale the weights of every layer-0 expert that no token is routed to by 1e30 (finite; NaN weights are
    refused on load): the sparse graph's logits stay equal to torch's (those experts never run), the dense
    graph's turn NaN (they run, overflow to inf, and inf · gate 0 is NaN)."""
    spec = specc.load_spec(
        "mixtral-8x7b", [*TEXT, "attention.kv_heads=2", "mlp={type: moe, experts: 8, active: 1, hidden: 16}"]
    )
    weights = _weights(spec)
    feeds = _feeds(spec, b=1, n=3)  # 3 tokens, top-1 of 8: at least 5 experts get nothing
    unrouted = sorted(set(range(8)) - _routed_experts(spec, weights, feeds))
    assert len(unrouted) >= 5
    want = _torch_logits(spec, weights, feeds)
    poisoned = dict(weights)
    for name in ("w_gate", "w_up", "w_down"):
        w = weights[f"blocks.0.mlp.experts.{name}"].clone()
        w[unrouted] *= 1e30
        poisoned[f"blocks.0.mlp.experts.{name}"] = w
    sparse = _session(export_onnx(spec, tmp_path / "s.onnx", weights=poisoned)).run(["logits"], feeds)[0]
    dense = _session(export_onnx(spec, tmp_path / "d.onnx", weights=poisoned, moe="dense")).run(["logits"], feeds)[0]
    assert np.abs(sparse - want).max() <= 1e-4
    assert np.isnan(dense).all()


def test_sparse_moe_fp16_within_half_precision_tolerance(tmp_path: Path) -> None:
    spec = _spec("swiglu_top2_norm")
    weights = _weights(spec)
    feeds = _feeds(spec)
    want = _torch_logits(spec, weights, feeds)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=weights, dtype="fp16")
    got = _session(path).run(["logits"], feeds)[0]
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float32) - want).max() <= 2e-2 * max(1.0, np.abs(want).max())


def test_unknown_moe_form_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown MoE form"):
        export_onnx(_spec("swiglu_top2_norm"), tmp_path / "m.onnx", moe="grouped")


@pytest.mark.parametrize("form", ["sparse", "dense"])
def test_compile_moe_flag(cli, tmp_path: Path, form: str) -> None:
    out = tmp_path / "m.onnx"
    sets = [x for s in [*TEXT, "attention.kv_heads=2", f"mlp={VARIANTS['swiglu_top2_norm']}"] for x in ("--set", s)]
    code, _, err = cli("compile", "mixtral-8x7b", "--target", "onnx", "--moe", form, "-o", str(out), *sets)
    assert code == 0, err
    model = onnx.load(out)
    assert {p.key: p.value for p in model.metadata_props}["specc.moe"] == form
    assert ("NonZero" in {n.op_type for n in model.graph.node}) == (form == "sparse")
