"""Encoder-decoder `--kv-cache` exports: encoder + decoder files with optimum's I/O names, cross K/V projected
once, greedy tokens equal to torch (HF BART / Marian: tests/test_hf_equivalence.py), `specc run` drives both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import specc
from specc.backends.onnx.export import export_onnx
from specc.runtime.generate import greedy
from specc.runtime.inputs import check, complete
from specc.runtime.onnx_model import OrtModel

SMALL = ["blocks=2", "d_model=32", "attention.heads=4", "context=32", "vocab_size=61", "init.std=0.2", "mlp.hidden=64"]
CLI = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def spec():
    return specc.load_spec("transformer-base", SMALL)


@pytest.fixture(scope="module")
def pair(spec, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_onnx(spec, tmp_path_factory.mktemp("ed") / "m.onnx", kv_cache=True)


def _dims(values) -> dict[str, list]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def test_two_files_with_optimum_names(pair: Path) -> None:
    enc, dec = onnx.load(str(pair)), onnx.load(str(pair.with_name("m.decoder.onnx")))
    assert _dims(enc.graph.input) == {"input_ids": ["batch", "encoder_sequence"],
                                      "attention_mask": ["batch", "encoder_sequence"]}  # fmt: skip
    assert _dims(enc.graph.output) == {"last_hidden_state": ["batch", "encoder_sequence", 32]}
    ins, outs = _dims(dec.graph.input), _dims(dec.graph.output)
    past = [f"past_key_values.{i}.{s}.{p}" for i in range(2) for s in ("decoder", "encoder") for p in ("key", "value")]
    assert set(ins) == {"input_ids", "encoder_hidden_states", "encoder_attention_mask", *past}
    assert ins["input_ids"] == ["batch", "decoder_sequence"]
    assert ins["past_key_values.1.decoder.key"] == ["batch", 4, "past_sequence", 8]
    assert ins["past_key_values.1.encoder.value"] == ["batch", 4, "past_encoder_sequence", 8]
    assert set(outs) == {"logits", *(p.replace("past_key_values", "present") for p in past)}
    assert outs["present.0.decoder.key"] == ["batch", 4, "total_sequence", 8]
    assert outs["present.0.encoder.key"] == ["batch", 4, "encoder_sequence", 8]
    meta = {p.key: p.value for p in enc.metadata_props}
    assert meta["specc.role"] == "encoder" and meta["specc.decoder"] == "m.decoder.onnx"
    assert {p.key: p.value for p in dec.metadata_props}["specc.encoder"] == "m.onnx"
    # one fused attention node per attention layer: 2 encoder self, 2 decoder self + 2 cross
    assert sum(n.op_type == "Attention" for n in enc.graph.node) == 2
    assert sum(n.op_type == "Attention" for n in dec.graph.node) == 4


def test_cross_projection_only_in_the_first_step_branch(pair: Path) -> None:
    dec = onnx.load(str(pair.with_name("m.decoder.onnx")))
    (node,) = [n for n in dec.graph.node if n.op_type == "If"]
    branches = {a.name: a.g for a in node.attribute}
    project = [n.name for n in branches["then_branch"].node if n.op_type == "MatMul"]
    assert sorted(project) == [f"decoder.blocks.{i}.cross_attn.kv/MatMul#node" for i in range(2)]
    assert not [n for n in branches["else_branch"].node if n.op_type != "Identity"]
    assert not [n for n in dec.graph.node if n.name.startswith("decoder.blocks.0.cross_attn.kv/")]


def _decode(path: Path, ids: np.ndarray, mask: np.ndarray, tokens: np.ndarray, spoil: bool) -> np.ndarray:
    """Per-step logits through the pair; ``spoil``: later steps get zeros for encoder_hidden_states."""
    enc = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(path.with_name("m.decoder.onnx")), providers=["CPUExecutionProvider"])
    names = [o.name for o in dec.get_outputs()]
    hidden = enc.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    feeds = {i.name: np.zeros((ids.shape[0], 4, 0, 8), np.float32) for i in dec.get_inputs() if "past" in i.name}
    steps = []
    for t in range(tokens.shape[1]):
        feeds.update(input_ids=tokens[:, t : t + 1], encoder_hidden_states=hidden, encoder_attention_mask=mask)
        if spoil and t:
            feeds["encoder_hidden_states"] = np.zeros_like(hidden)
        out = dict(zip(names, dec.run(None, feeds), strict=True))
        steps.append(out["logits"])
        feeds.update({"past_key_values." + k[len("present.") :]: v for k, v in out.items() if k != "logits"})
    return np.concatenate(steps, 1)


def test_steps_match_the_full_graph_and_reuse_the_cross_cache(spec, pair: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 61, (2, 7))
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    tokens = rng.integers(0, 61, (2, 5))
    full = ort.InferenceSession(str(export_onnx(spec, tmp_path / "full.onnx")), providers=["CPUExecutionProvider"])
    want = full.run(None, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": tokens})[0]
    got = _decode(pair, ids, mask, tokens, spoil=False)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    # after the first step the encoder states are not read again: the cached cross K/V are used
    np.testing.assert_array_equal(_decode(pair, ids, mask, tokens, spoil=True), got)


@pytest.mark.parametrize("attention", ["standard", "contrib"])
def test_generation_matches_torch(tmp_path: Path, attention: str) -> None:
    spec = specc.load_spec("transformer-base", [*SMALL, "shared_embeddings=false", "tie_embeddings=false"])
    model = specc.build_torch(spec)  # untied: these random weights generate varied tokens
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 61, (2, 7))
    mask = np.ones_like(ids)
    mask[1, -3:] = 0
    want = model.generate(torch.from_numpy(ids), 10, attention_mask=torch.from_numpy(mask), decoder_start_token_id=1)
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=True, attention=attention)
    m = OrtModel.open(path, "cpu", threads=1)
    got = greedy(m, check(m, complete(m, {"input_ids": ids, "attention_mask": mask})), 10, start_id=1)
    np.testing.assert_array_equal(got, want[:, -10:].numpy())
    assert len(set(got[0].tolist())) > 1


def test_quantized_pair(spec, tmp_path: Path) -> None:
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=True, quantize="int4", block_size=16)
    dec = onnx.load(str(tmp_path / "m.decoder.onnx"))
    (node,) = [n for n in dec.graph.node if n.op_type == "If"]
    then = next(a.g for a in node.attribute if a.name == "then_branch")
    assert sum(n.op_type == "MatMulNBits" for n in then.node) == 2  # the cross K/V projections
    assert "MatMul" not in {n.op_type for n in dec.graph.node} | {n.op_type for n in then.node}
    for p in (path, tmp_path / "m.decoder.onnx"):
        assert {m.key: m.value for m in onnx.load(str(p)).metadata_props}["specc.quantize"] == "int4"
    m = OrtModel.open(path, "cpu", threads=1)
    assert greedy(m, check(m, complete(m, {"input_ids": np.array([[3, 4, 5]])})), 4).shape == (1, 4)


def test_cli_pair(cli: CLI, tmp_path: Path) -> None:
    path = tmp_path / "t.onnx"
    code, out, err = cli("compile", "transformer-base", "-t", "onnx", "--kv-cache", "-o", path,
                         *[a for s in SMALL for a in ("--set", s)])  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "t.decoder.onnx").is_file()
    code, out, err = cli("run", path, "--input-ids", "3 4 5; 6 7 8", "--generate", "6", "--provider", "cpu")
    assert code == 0, err
    assert "generated 6 tokens per row" in out
    code, out, err = cli("run", path, "--input-ids", "3 4 5", "--provider", "cpu")
    assert code == 0 and "last_hidden_state" in out and "logits" in out
    code, _, err = cli("run", tmp_path / "t.decoder.onnx", "--provider", "cpu")
    assert code == 2 and "is the decoder of an encoder-decoder export" in err and "t.onnx" in err
    (tmp_path / "t.decoder.onnx").unlink()
    code, _, err = cli("run", path, "--provider", "cpu")
    assert code == 2 and "t.decoder.onnx is missing" in err


def test_decoder_target_checked_before_writing(cli: CLI, tmp_path: Path) -> None:
    (tmp_path / "t.decoder.onnx").mkdir()
    code, _, err = cli("compile", "transformer-base", "-t", "onnx", "--kv-cache", "-o", tmp_path / "t.onnx",
                       *[a for s in SMALL for a in ("--set", s)])  # fmt: skip
    assert code == 2 and "t.decoder.onnx" in err and "Traceback" not in err
    assert not (tmp_path / "t.onnx").exists()


def test_mismatched_decoder_file_is_a_user_error(cli: CLI, pair: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copy(pair, tmp_path / "m.onnx")
    gpt = specc.load_spec("gpt2", ["blocks=1", "d_model=32", "attention.heads=4", "vocab_size=61", "context=32"])
    export_onnx(gpt, tmp_path / "m.decoder.onnx")  # a decoder-only model where the decoder graph belongs
    code, _, err = cli("run", tmp_path / "m.onnx", "--input-ids", "3 4", "--generate", "2", "--provider", "cpu")
    assert code == 2 and "not an encoder-decoder pair" in err and "Traceback" not in err
