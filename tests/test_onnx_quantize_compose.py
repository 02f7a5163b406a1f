"""`--quantize` with the other export forms: the encoder-decoder pair (`--kv-cache`), sparse and dense MoE,
and `--weights` from the CLI."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import specc
from specc.backends.onnx.export import export_onnx
from specc.backends.onnx.quantize_fold import all_nodes
from specc.runtime.generate import _empty_past, greedy
from specc.runtime.inputs import check, complete
from specc.runtime.onnx_model import OrtModel

CLI = Callable[..., tuple[int, str, str]]
ED = ["blocks=2", "d_model=32", "attention.heads=4", "context=32", "vocab_size=61", "init.std=0.2", "mlp.hidden=64"]
MOE = ["blocks=2", "d_model=32", "attention.heads=4", "attention.kv_heads=2", "context=24", "vocab_size=61",
       "dtype=fp32", "mlp={type: moe, experts: 4, active: 2, expert: swiglu, hidden: 32}"]  # fmt: skip


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in all_nodes(model.graph))


def _float_tables(model: onnx.ModelProto, shape: list[int]) -> list[str]:
    return [t.name for t in model.graph.initializer if list(t.dims) == shape and t.data_type == onnx.TensorProto.FLOAT]


def test_encoder_decoder_pair(cli: CLI, tmp_path: Path) -> None:
    """Both files quantized (the decoder's cross K/V projections inside its If branch too), the shared table
    quantized in each file (stored once in the decoder, with the head); the pair generates the tokens the
    quantized single graph recomputes, and `specc run` drives it."""
    spec = specc.load_spec("transformer-base", ED)
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=True, quantize="int4", block_size=16)
    enc, dec = onnx.load(str(path)), onnx.load(str(tmp_path / "m.decoder.onnx"))
    assert _ops(enc)["MatMulNBits"] == 2 * 4 and _ops(enc)["GatherBlockQuantized"] == 1  # qkv, out, fc1, fc2
    # self qkv, out; cross q, kv, out; fc1, fc2; the head
    assert _ops(dec)["MatMulNBits"] == 2 * 7 + 1 and _ops(dec)["GatherBlockQuantized"] == 1
    assert "MatMul" not in _ops(enc) and "MatMul" not in _ops(dec)
    assert not _float_tables(enc, [61, 32]) and not _float_tables(dec, [61, 32])
    head = next(n for n in dec.graph.node if n.op_type == "MatMulNBits" and n.name.startswith("lm_head/"))
    reshape = next(n for n in dec.graph.node if n.op_type == "Reshape" and n.input[0] == head.input[1])
    assert any(n.op_type == "GatherBlockQuantized" and n.input[0] == reshape.output[0] for n in dec.graph.node)
    for m in (enc, dec):
        meta = {p.key: p.value for p in m.metadata_props}
        assert meta["specc.quantize"] == "int4" and meta["specc.quantize_embedding"] == "1"
    full = export_onnx(spec, tmp_path / "full.onnx", quantize="int4", block_size=16)
    ids = np.random.default_rng(0).integers(0, 61, (2, 6))
    runs = []
    for p in (path, full):
        m = OrtModel.open(p, "cpu", threads=1)
        runs.append(greedy(m, check(m, complete(m, {"input_ids": ids, "attention_mask": np.ones_like(ids)})), 6))
    np.testing.assert_array_equal(runs[0], runs[1])
    code, out, err = cli("run", path, "--input-ids", "3 4 5", "--generate", "4", "--provider", "cpu")
    assert code == 0 and "generated 4 tokens per row" in out, err


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    m = OrtModel.open(path, "cpu", 1)
    return m.run({"input_ids": ids, "attention_mask": np.ones_like(ids), **_empty_past(m, ids.shape[0])})["logits"]


@pytest.mark.parametrize("form", ["sparse", "dense"])
def test_moe(tmp_path: Path, form: str) -> None:
    """Sparse form: every expert's weight quantized (folded out of the stacked [E, out, in] initializer);
    dense form: the batched expert MatMuls stay float (MatMulNBits takes one 2-D weight). Routers stay float
    in both. Logits near the float graph's; the KV-cache graph decodes what the cache-less one recomputes."""
    spec = specc.load_spec("mixtral-8x7b", MOE)
    kv = export_onnx(spec, tmp_path / "kv.onnx", kv_cache=True, quantize="int8", moe=form)
    model = onnx.load(str(kv))
    ops = _ops(model)
    experts = 2 * 4 * 3 if form == "sparse" else 0
    assert ops["MatMulNBits"] == 2 * 2 + experts + 1  # qkv, out per block, the experts, the head
    float_mm = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert sum(".router/" in n.name for n in float_mm) == 2
    assert len(float_mm) == 2 + (0 if form == "sparse" else 2 * 3)
    stacked = [t.name for t in model.graph.initializer if len(t.dims) == 3 and t.data_type == onnx.TensorProto.FLOAT]
    assert (not stacked) if form == "sparse" else len(stacked) == 2 * 3
    ids = np.random.default_rng(1).integers(0, 61, (2, 7))
    ref = export_onnx(spec, tmp_path / "ref.onnx", kv_cache=True, moe=form)
    got, want = _logits(kv, ids), _logits(ref, ids)
    assert np.abs(got - want).mean() < 0.02 * want.std()  # int8: weights within one step of absmax/128
    plain = export_onnx(spec, tmp_path / "plain.onnx", quantize="int8", moe=form)
    feeds = {"input_ids": ids[:, :3], "attention_mask": np.ones((2, 3), np.int64)}
    a, b = (greedy(OrtModel.open(p, "cpu", 1), feeds, 5) for p in (kv, plain))
    np.testing.assert_array_equal(a, b)


def test_cli_weights_kv_cache_int4(cli: CLI, tmp_path: Path) -> None:
    """`--weights` are what gets quantized: the quantized head's weight dequantizes to the given table."""
    from specc.backends.torch.checkpoint import compile_checkpoint

    sets = ["blocks=1", "d_model=32", "attention.heads=4", "context=32", "vocab_size=64", "mlp.hidden=64"]
    w = tmp_path / "w.safetensors"
    compile_checkpoint(specc.load_spec("gpt2", [*sets, "init.seed=11"]), w)
    path = tmp_path / "q.onnx"
    code, _, err = cli("compile", "gpt2", "-t", "onnx", "--weights", w, "--quantize", "int4", "--block-size", "32",
                       "--kv-cache", "-o", path, *[a for s in sets for a in ("--set", s)])  # fmt: skip
    assert code == 0, err
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    codes = inits["lm_head.weight_Q4"].reshape(64, -1)
    levels = np.stack([codes & 15, codes >> 4], -1).reshape(64, 32).astype(np.float32) - 8
    table = np.asarray(specc.build_torch(specc.load_spec("gpt2", sets), weights=w).state_dict()["embed.weight"])
    seeded = np.asarray(specc.build_torch(specc.load_spec("gpt2", sets)).state_dict()["embed.weight"])
    deq = levels * inits["lm_head.weight_scales"]  # one block of 32 per row
    step = np.abs(inits["lm_head.weight_scales"])
    assert np.all(np.abs(deq - table) <= step * (1 + 1e-5)) and not np.all(np.abs(deq - seeded) <= step)
    code, out, err = cli("run", path, "--input-ids", "1 2 3", "--generate", "3", "--provider", "cpu")
    assert code == 0 and "generated 3 tokens per row" in out, err
