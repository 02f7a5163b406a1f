"""Fuzzing what ``specc run`` reads: an exported model's metadata_props (specc's keys given any text or JSON)
and .npy/.npz inputs (numpy arrays of any dtype and shape, their bytes corrupted). Each run prints a result or
exits 2 with one line; never a traceback, a hang, or a file left behind."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_fuzz_safetensors import SECONDS, cli, json_value, listing
from test_read_files import one_line

import specc

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FUZZ = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
TINY = ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=32", "context=16", "mlp.hidden=32"]
KEYS = [
    "specc.spec",
    "specc.ir_meta",
    "specc.role",
    "specc.family",
    "specc.decoder_step",
    "specc.encoder",
    "specc.task",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The folder with g.onnx, and the metadata specc wrote into it."""
    d = tmp_path_factory.mktemp("fuzz_onnx")
    path = specc.export_onnx(specc.load_spec("gpt2", TINY), d / "g.onnx")
    return d, {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def _outcome(result: tuple[int, str, str]) -> None:
    code, _, err = result
    if code == 0:
        assert "Traceback" not in err and "error:" not in err, err
    else:
        one_line(result)


# ---------------------------------------------------------------------------------------------- metadata


@st.composite
def metadata_props(draw: Any, current: dict[str, str]) -> dict[str, str]:
    props = dict(current)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(KEYS))
        how = draw(st.sampled_from(["json", "text", "mutate", "delete"]))
        if how == "json":
            props[key] = json.dumps(draw(json_value))
        elif how == "text":
            props[key] = draw(st.text(max_size=30))
        elif how == "mutate" and key in ("specc.spec", "specc.ir_meta") and key in current:
            doc = json.loads(current[key])
            field = draw(st.sampled_from(sorted(doc)))
            doc[field] = draw(json_value)
            props[key] = json.dumps(doc)
        else:
            props.pop(key, None)
    return props


@FUZZ
@given(data=st.data())
def test_fuzz_onnx_metadata(exported: tuple[Path, dict[str, str]], data: Any) -> None:
    folder, written = exported
    props = data.draw(metadata_props(written))
    model = onnx.load(str(folder / "g.onnx"))
    del model.metadata_props[:]
    for k, v in props.items():
        model.metadata_props.add(key=k, value=v)
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    before = listing(folder)
    start = time.perf_counter()
    _outcome(cli("run", path, "--input-ids", "1 2 3", "--provider", "cpu", "--threads", "1"))
    assert time.perf_counter() - start < SECONDS
    assert listing(folder) == before


# ---------------------------------------------------------------------------------------------- .npy / .npz

DTYPES = st.one_of(
    hnp.integer_dtypes(endianness="="),
    hnp.unsigned_integer_dtypes(endianness="="),
    hnp.floating_dtypes(endianness="=", sizes=(16, 32, 64)),
    hnp.boolean_dtypes(),
    hnp.complex_number_dtypes(endianness="="),
    hnp.unicode_string_dtypes(max_len=3),
    hnp.byte_string_dtypes(max_len=3),
)
ARRAYS = hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))


@st.composite
def npy_bytes(draw: Any) -> tuple[str, bytes]:
    buf = io.BytesIO()
    if draw(st.booleans()):
        np.save(buf, draw(ARRAYS))
        suffix = ".npy"
    else:
        names = draw(st.lists(st.sampled_from(["input_ids", "attention_mask", "x", "past"]), min_size=1, max_size=3,
                              unique=True))  # fmt: skip
        np.savez(buf, **{n: draw(ARRAYS) for n in names})
        suffix = ".npz"
    raw = bytearray(buf.getvalue())
    how = draw(st.sampled_from(["plain", "plain", "truncate", "flip", "object", "junk"]))
    if how == "truncate":
        del raw[draw(st.integers(0, len(raw))) :]
    elif how == "flip" and raw:
        i = draw(st.integers(0, min(len(raw) - 1, 160)))  # mostly the header
        raw[i] = draw(st.integers(0, 255))
    elif how == "object":
        buf = io.BytesIO()
        np.save(buf, np.array([[1, "a"]], dtype=object), allow_pickle=True)
        raw = bytearray(buf.getvalue())
    elif how == "junk":
        raw = bytearray(draw(st.binary(max_size=200)))
    return suffix, bytes(raw)


@FUZZ
@given(item=npy_bytes(), named=st.booleans())
def test_fuzz_npy_inputs(exported: tuple[Path, dict[str, str]], item: tuple[str, bytes], named: bool) -> None:
    folder, _ = exported
    path = folder / "g.onnx"
    suffix, raw = item
    data = folder / f"x{suffix}"
    data.write_bytes(raw)
    before = listing(folder)
    start = time.perf_counter()
    arg = f"input_ids={data}" if named else str(data)
    _outcome(cli("run", path, "--input", arg, "--provider", "cpu", "--threads", "1"))
    assert time.perf_counter() - start < SECONDS
    assert listing(folder) == before
    data.unlink()
