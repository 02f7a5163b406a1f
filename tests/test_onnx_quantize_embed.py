"""Quantized token embeddings (com.microsoft GatherBlockQuantized): a tied table stored once for the Gather
and the head's MatMulNBits, untied tables quantized alone, the rows within one quantization step of the
weights, `--no-quantize-embedding` and the cases that rule it out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import specc
from specc.backends.onnx import quantize_embed
from specc.backends.onnx.export import export_onnx
from specc.runtime.generate import greedy
from specc.runtime.onnx_model import OrtModel

V, D = 96, 64
GPT = ["blocks=2", f"d_model={D}", "attention.heads=4", "context=32", f"vocab_size={V}", "mlp.hidden=128"]
CLI = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specc.backends.torch.checkpoint import compile_checkpoint

    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    compile_checkpoint(specc.load_spec("gpt2", [*GPT, "init.seed=3"]), path)
    return path


def _inits(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


def _meta(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def _ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def _rows(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(every vocabulary row as the GatherBlockQuantized node dequantizes it [V, D], its scales [V, D/block])."""
    model = onnx.load(str(path))
    (node,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    scales = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == node.input[2])
    model.graph.output.append(helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    rows = []
    for start in range(0, V, 32):  # the context is 32
        ids = np.arange(start, min(start + 32, V))[None]
        out = dict(zip(names, sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)}), strict=True))
        rows.append(out[node.output[0]][0])
    return np.concatenate(rows), scales


@pytest.mark.parametrize(("scheme", "block"), [("int4", 16), ("int8", 32)])
def test_tied_table_stored_once_and_rows_within_a_step(weights: Path, tmp_path: Path, scheme: str, block: int) -> None:
    spec = specc.load_spec("gpt2", GPT)
    q = export_onnx(spec, tmp_path / "q.onnx", weights=weights, quantize=scheme, block_size=block)
    kept = export_onnx(spec, tmp_path / "k.onnx", weights=weights, quantize=scheme, block_size=block,
                       quantize_embedding=False)  # fmt: skip
    assert _ops(q).count("GatherBlockQuantized") == 1
    assert not [n for n in onnx.load(str(q)).graph.node if n.op_type == "Gather" and n.input[0] == "embed.weight"]
    assert _ops(kept).count("GatherBlockQuantized") == 0
    inits, kept_inits = _inits(q), _inits(kept)
    # one [V, ...] weight in the file, the head's: the Gather reads it through a Reshape
    assert sorted(n for n, a in inits.items() if a.shape[:1] == (V,)) == [
        f"lm_head.weight_Q{scheme[3]}",
        "lm_head.weight_scales",
    ]
    # the float table is all the unquantized-embedding file has in addition (its shape constant aside)
    extra = sum(a.nbytes for a in kept_inits.values()) - sum(a.nbytes for a in inits.values())
    assert extra == V * D * 4 - 16
    assert (tmp_path / "q.onnx").stat().st_size < (tmp_path / "k.onnx").stat().st_size - V * D * 4 + 1024
    meta = _meta(q)
    assert meta["specc.quantize_embedding"] == "1" and f"bits={scheme[3]}" in meta["specc.quantize_embedding_method"]
    assert _meta(kept)["specc.quantize_embedding"] == "0"
    # the rows are the --weights' table within one quantization step: symmetric round-to-nearest is half a
    # step, and the largest magnitude of a block sits on -2^(bits-1), so the opposite end clips by up to one
    table = np.asarray(specc.build_torch(spec, weights=weights).state_dict()["embed.weight"])
    rows, scales = _rows(q)
    step = np.repeat(np.abs(scales), block, axis=1)
    assert np.all(np.abs(rows - table) <= step * (1 + 1e-5))
    assert np.abs(rows - table).max() > 0.1 * step.max()  # quantized, not the float table


def test_untied_table_quantized_alone(tmp_path: Path) -> None:
    spec = specc.load_spec("gpt2", [*GPT, "tie_embeddings=false"])
    path = export_onnx(spec, tmp_path / "u.onnx", quantize="int4", block_size=32)
    model = onnx.load(str(path))
    (gbq,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    (head,) = [n for n in model.graph.node if n.name.startswith("lm_head/") and n.op_type == "MatMulNBits"]
    reshape = next(n for n in model.graph.node if n.output[0] == gbq.input[0])
    assert reshape.input[0] == "embed.weight_Q4" and head.input[1] != reshape.input[0]
    inits = _inits(path)
    assert "embed.weight" not in inits and inits["embed.weight_Q4"].dtype == np.uint8
    assert inits["embed.weight_Q4"].nbytes == V * D // 2
    table = np.asarray(specc.build_torch(spec).state_dict()["embed.weight"])
    rows, scales = _rows(path)
    assert np.all(np.abs(rows - table) <= np.repeat(np.abs(scales), 32, axis=1) * (1 + 1e-5))


def test_kv_cache_generation_and_cli_run(cli: CLI, tmp_path: Path) -> None:
    """The KV-cache graph with a quantized embedding decodes what the cache-less graph recomputes; `specc run`
    generates from it; the logits stay near the float graph's."""
    spec = specc.load_spec("gpt2", [*GPT, "init.std=0.1"])
    kv = export_onnx(spec, tmp_path / "kv.onnx", kv_cache=True, quantize="int8")
    plain = export_onnx(spec, tmp_path / "plain.onnx", quantize="int8")
    ref = export_onnx(spec, tmp_path / "ref.onnx")
    ids = np.random.default_rng(0).integers(0, V, (2, 5))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    a = greedy(OrtModel.open(kv, "cpu", 1), feeds, 6)
    assert np.array_equal(a, greedy(OrtModel.open(plain, "cpu", 1), feeds, 6))
    got = OrtModel.open(plain, "cpu", 1).run(feeds)["logits"]
    want = OrtModel.open(ref, "cpu", 1).run(feeds)["logits"]
    # int8 blocks of 32: each weight within one step of absmax/128, about 0.5% rms of the weights
    assert np.abs(got - want).mean() < 0.02 * want.std()
    code, out, err = cli("run", kv, "--input-ids", "1 2 3", "--generate", "4", "--provider", "cpu")
    assert code == 0 and "generated 4 tokens per row" in out, err


def test_ruled_out_cases(cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sets = [a for s in GPT for a in ("--set", s)]
    # a tied head left float: quantizing the Gather would store the table twice -> float by default, else an error
    code, _, err = cli("compile", "gpt2", "-t", "onnx", "--quantize", "int4", "--no-quantize-head",
                       "--quantize-embedding", "-o", tmp_path / "a.onnx", *sets)  # fmt: skip
    assert code == 2 and "would be stored twice" in err and "Traceback" not in err
    assert not (tmp_path / "a.onnx").exists()
    # a width that is not a multiple of the block: MatMulNBits pads the last block, the Gather cannot share it
    spec = specc.load_spec("gpt2", [*GPT, "d_model=48", "attention.heads=4"])
    path = export_onnx(spec, tmp_path / "w.onnx", quantize="int4", block_size=32)
    assert _meta(path)["specc.quantize_embedding"] == "0" and "GatherBlockQuantized" not in _ops(path)
    # an onnxruntime without the kernel: float by default, an error naming the versions when asked for
    monkeypatch.setattr(quantize_embed, "supported", lambda bits, dtype: False)
    path = export_onnx(specc.load_spec("gpt2", GPT), tmp_path / "o.onnx", quantize="int8")
    assert _meta(path)["specc.quantize_embedding"] == "0" and "GatherBlockQuantized" not in _ops(path)
    code, _, err = cli("compile", "gpt2", "-t", "onnx", "--quantize", "int8", "--quantize-embedding",
                       "-o", tmp_path / "b.onnx", *sets)  # fmt: skip
    assert code == 2 and "1.23" in err and "Traceback" not in err
    code, _, err = cli("compile", "gpt2", "-t", "onnx", "--no-quantize-embedding", "-o", tmp_path / "c.onnx", *sets)
    assert code == 2 and "--no-quantize-embedding applies with --quantize" in err


def test_support_probe_runs_the_kernel() -> None:
    assert quantize_embed.supported(4, "fp32") and quantize_embed.supported(8, "fp16")


def test_fp16_export(tmp_path: Path) -> None:
    """fp16 activations: the Gather dequantizes to fp16 (the scales' dtype), the logits stay near fp16's."""
    spec = specc.load_spec("gpt2", [*GPT, "init.std=0.1"])
    q = export_onnx(spec, tmp_path / "h.onnx", dtype="fp16", quantize="int8")
    assert "GatherBlockQuantized" in _ops(q)
    ids = np.random.default_rng(4).integers(0, V, (1, 9))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    got = OrtModel.open(q, "cpu", 1).run(feeds)["logits"].astype(np.float32)
    want = OrtModel.open(export_onnx(spec, tmp_path / "r.onnx"), "cpu", 1).run(feeds)["logits"]
    assert np.abs(got - want).mean() < 0.02 * want.std()
