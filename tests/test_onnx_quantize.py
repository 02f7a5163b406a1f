"""`--quantize int8|int4`: onnxruntime's MatMulNBits on every linear, the checker, metadata, `specc run`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import specc
from specc.backends.onnx.export import export_onnx
from specc.runtime.generate import _empty_past, greedy
from specc.runtime.onnx_model import OrtModel

GPT = ["blocks=2", "d_model=64", "attention.heads=4", "context=32", "vocab_size=96", "mlp.hidden=256"]
CLI = Callable[..., tuple[int, str, str]]
LINEARS = 2 * 4 + 1  # qkv, out, fc1, fc2 per block + lm_head


@pytest.fixture(scope="module")
def spec():
    return specc.load_spec("gpt2", GPT)


@pytest.fixture(scope="module")
def ref(spec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(spec, tmp_path_factory.mktemp("q") / "fp32.onnx", kv_cache=True)


def _logits(path: Path, ids: np.ndarray) -> np.ndarray:
    m = OrtModel.open(path, "cpu", 1)
    feeds = {"input_ids": ids, "attention_mask": np.ones(ids.shape, np.int64), **_empty_past(m, ids.shape[0])}
    return m.run(feeds)["logits"].astype(np.float32)


def _ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


IDS = np.random.default_rng(0).integers(0, 96, (2, 12))


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_every_linear_quantized_with_metadata(spec, ref: Path, tmp_path: Path, scheme: str) -> None:
    path = export_onnx(spec, tmp_path / f"{scheme}.onnx", kv_cache=True, quantize=scheme, block_size=16)
    ops = _ops(path)
    assert ops.count("MatMulNBits") == LINEARS and "MatMul" not in ops
    model = onnx.load(str(path))
    bits = {a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"}
    assert bits == {4 if scheme == "int4" else 8}
    # the token embedding's Gather too, on the tied head's weight (tests/test_onnx_quantize_embed.py)
    assert ops.count("GatherBlockQuantized") == 1
    onnx.checker.check_model(str(path), full_check=True)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["specc.quantize"] == scheme and meta["specc.quantize_block_size"] == "16"
    assert (
        meta["specc.quantize_head"] == "1" and f"bits={4 if scheme == 'int4' else 8}" in meta["specc.quantize_method"]
    )
    assert json.loads(meta["specc.spec"])["d_model"] == 64
    assert path.stat().st_size < (0.4 if scheme == "int4" else 0.6) * ref.stat().st_size


def test_error_shrinks_with_bits_and_block_size(spec, ref: Path, tmp_path: Path) -> None:
    base = _logits(ref, IDS)
    err = {}
    for scheme, block in [("int4", 128), ("int4", 16), ("int8", 32)]:
        p = export_onnx(spec, tmp_path / f"{scheme}{block}.onnx", kv_cache=True, quantize=scheme, block_size=block)
        err[scheme, block] = float(np.abs(_logits(p, IDS) - base).mean())
    assert err["int8", 32] < err["int4", 16] < err["int4", 128]
    assert err["int8", 32] > 0  # the weights really changed
    assert err["int4", 128] < 0.25 * float(base.std())


def test_no_quantize_head_keeps_head_and_tied_table(spec, tmp_path: Path) -> None:
    path = export_onnx(spec, tmp_path / "nohead.onnx", quantize="int4", quantize_head=False)
    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == LINEARS - 1 and ops.count("MatMul") == 1
    assert "GatherBlockQuantized" not in ops  # the table stays float for the head, stored once
    head = next(n for n in model.graph.node if n.op_type == "MatMul")
    assert head.name.startswith("lm_head/")
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["specc.quantize_head"] == "0" and meta["specc.quantize_embedding"] == "0"


def test_api_refuses_quantization_settings_that_would_do_nothing(spec, tmp_path: Path) -> None:
    """As the CLI does: a block size or head setting without ``quantize``, or beside a ``Quantization`` that
    holds its own, is an error before anything is written."""
    from specc.backends.onnx.quantize import Quantization
    from specc.errors import SpecError

    cases = [
        ({"block_size": 64}, "block_size given with quantize=None"),
        ({"quantize_head": False, "quantize_embedding": False}, "quantize_head, quantize_embedding given"),
        ({"quantize": Quantization("int4"), "block_size": 16}, "the Quantization given holds them"),
    ]
    for options, message in cases:
        with pytest.raises(SpecError, match=message):
            export_onnx(spec, tmp_path / "x.onnx", **options)
        assert not (tmp_path / "x.onnx").exists()


def test_weights_compose_and_cache_agrees(spec, tmp_path: Path) -> None:
    """--weights are the ones quantized (logits near torch's on those weights), and the KV-cache graph decodes
    the same tokens as recomputing the whole context with the quantized cache-less graph."""
    from specc.backends.torch.build import build_torch
    from specc.backends.torch.checkpoint import compile_checkpoint

    w = tmp_path / "w.safetensors"
    compile_checkpoint(specc.load_spec("gpt2", [*GPT, "init.seed=7"]), w)
    kv = export_onnx(spec, tmp_path / "kv.onnx", weights=w, kv_cache=True, quantize="int8")
    plain = export_onnx(spec, tmp_path / "plain.onnx", weights=w, quantize="int8")
    torch_model = build_torch(spec, weights=w).eval()
    with torch.no_grad():
        expect = torch_model(torch.from_numpy(IDS)).numpy()
    got = _logits(kv, IDS)
    assert np.abs(got - expect).max() < 0.05 * np.abs(expect).max()
    feeds = {"input_ids": IDS[:, :4], "attention_mask": np.ones((2, 4), np.int64)}
    a = greedy(OrtModel.open(kv, "cpu", 1), feeds, 6)
    b = greedy(OrtModel.open(plain, "cpu", 1), feeds, 6)
    assert np.array_equal(a, b)


def test_cli_quantize_then_run(cli: CLI, tmp_path: Path) -> None:
    path = tmp_path / "q.onnx"
    sets = [a for s in GPT for a in ("--set", s)]
    code, _, err = cli("compile", "gpt2", "-t", "onnx", "--quantize", "int4", "--block-size", "32", "--kv-cache",
                       "--no-quantize-head", "-o", path, *sets)  # fmt: skip
    assert code == 0, err
    code, out, err = cli("run", path, "--input-ids", "1 2 3", "--generate", "4", "--provider", "cpu")
    assert code == 0, err
    assert "generated 4 tokens per row" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-t", "onnx", "--quantize", "int4", "--block-size", "48"], "--block-size 48 is not supported"),
        (["-t", "onnx", "--quantize", "int4", "--dtype", "bf16"], "needs fp32 or fp16 activations"),
        (["-t", "torch", "--quantize", "int8"], "--quantize applies to --target onnx"),
        # options that would do nothing are refused, not ignored
        (["-t", "onnx", "--no-quantize-head"], "--no-quantize-head applies with --quantize"),
        (["-t", "onnx", "--block-size", "64"], "--block-size applies with --quantize"),
        (["-t", "torch", "--opset", "24"], "--opset applies to --target onnx"),
        (["-t", "python", "--kv-cache"], "--kv-cache applies to --target onnx"),
        (["-t", "torch", "--attention", "contrib"], "--attention applies to --target onnx"),
        (["-t", "python", "--moe", "dense"], "--moe applies to --target onnx"),
        (["-t", "onnx", "--quantize", "int3"], "int3"),
    ],
)
def test_cli_errors_one_line(cli: CLI, tmp_path: Path, args: list[str], message: str) -> None:
    sets = [a for s in GPT for a in ("--set", s)]
    code, _, err = cli("compile", "gpt2", *args, "-o", tmp_path / "x.out", *sets)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x.out").exists()


def test_rnn_refused(cli: CLI, tmp_path: Path) -> None:
    code, _, err = cli("compile", "gru-bahdanau", "-t", "onnx", "--quantize", "int8", "-o", tmp_path / "r.onnx",
                       "--set", "rnn.hidden=16", "--set", "rnn.embed=8", "--set", "vocab_size=20")  # fmt: skip
    assert code == 2 and "--quantize applies to Transformer models" in err
