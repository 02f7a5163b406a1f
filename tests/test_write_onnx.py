"""ONNX outputs: a model and its external data are replaced as a pair that a reader never sees half-updated;
the data file gets the model's mode; a failed export replaces nothing and leaves nothing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest

import specc
import specc.backends.onnx.save as save_mod
from specc.backends.onnx.export import export_onnx, export_peak_bytes

SETS = ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=50", "context=16", "mlp.hidden=32"]


def _spec(seed: int):
    return specc.load_spec("gpt2", [*SETS, f"init.seed={seed}"])


def _logits(path: Path) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 2, 3]], np.int64)
    return sess.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]


def _data_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".data"))


def _location(path: Path) -> str:
    model = onnx.load(str(path), load_external_data=False)
    locs = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert len(locs) == 1
    return locs.pop()


@pytest.fixture
def external(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(save_mod, "PROTO_LIMIT", 1000)  # stands in for 2 GB


def test_replacing_an_external_data_model_never_pairs_it_with_other_data(
    tmp_path: Path, external: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.onnx"
    export_onnx(_spec(0), path)
    assert _data_files(tmp_path) == ["m.onnx.data"] and _location(path) == "m.onnx.data"
    first = _logits(path)

    seen: list[str] = []
    real_replace = os.replace

    def watching(src, dst, *a, **k):
        # every moment between two renames of the group: the model on disk must still load with its own data
        if Path(dst).parent == tmp_path:
            np.testing.assert_array_equal(_logits(path), first)
            seen.append(Path(dst).name)
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", watching)
    export_onnx(_spec(1), path)
    monkeypatch.setattr(os, "replace", real_replace)
    assert seen[-1] == "m.onnx" and len(seen) == 2  # the data file first, the model that names it last
    second = _logits(path)
    assert not np.array_equal(first, second)
    new_data = _location(path)
    assert new_data != "m.onnx.data" and _data_files(tmp_path) == [new_data]  # the old data is gone
    export_onnx(_spec(2), path)  # and the name alternates back
    assert _location(path) == "m.onnx.data" and _data_files(tmp_path) == ["m.onnx.data"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_data_file_takes_the_models_mode(tmp_path: Path, external: None) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    export_onnx(_spec(0), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "m.onnx.data").stat().st_mode) == 0o640
    old = os.umask(0o022)
    try:
        export_onnx(_spec(0), tmp_path / "fresh.onnx")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "fresh.onnx.data").stat().st_mode) == 0o644


def test_a_smaller_export_drops_the_old_data_only_after_the_model_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    save_mod.PROTO_LIMIT, limit = 1000, save_mod.PROTO_LIMIT
    try:
        export_onnx(_spec(0), path)
    finally:
        save_mod.PROTO_LIMIT = limit
    assert _data_files(tmp_path) == ["m.onnx.data"]
    export_onnx(_spec(1), path)  # inline now
    assert _data_files(tmp_path) == [] and _logits(path).shape == (1, 3, 50)


def test_a_failing_check_replaces_nothing(tmp_path: Path, external: None, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.onnx"
    export_onnx(_spec(0), path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(*a, **k):
        raise onnx.checker.ValidationError("injected")

    monkeypatch.setattr(onnx.checker, "check_model", broken)
    with pytest.raises(onnx.checker.ValidationError):
        export_onnx(_spec(1), path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_rnn_pair_is_written_as_one_group(tmp_path: Path) -> None:
    spec = specc.load_spec("gru-bahdanau", ["rnn.hidden=16", "rnn.embed=8", "vocab_size=20"])
    path = export_onnx(spec, tmp_path / "s2s.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s2s.decoder_step.onnx", "s2s.onnx"]
    assert path == tmp_path / "s2s.onnx"


def test_export_memory_estimate_counts_the_measured_peak() -> None:
    """Peak RSS of exporting gpt2 (124M) with the whole model in memory (the dynamic int8 quantizer's path) was
    16.9 B/param in fp32 and 12.2 in fp16; the check counts at least that, not the 4 (or 2) bytes of the weights
    alone. (Streamed exports: test_onnx_stream.py.)"""
    assert export_peak_bytes(1_000_000, "fp32", whole=True) >= 16.9e6
    assert export_peak_bytes(1_000_000, "fp16", whole=True) >= 12.2e6
    assert export_peak_bytes(1_000_000, "bf16", whole=True) >= 12.2e6
