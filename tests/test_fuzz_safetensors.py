"""Fuzzing the safetensors surfaces: headers (length prefix, JSON table, byte ranges), metadata (the embedded
spec and training state) and sharded indexes. Every input is either read, or refused with a SpecError in the
API and exit 2 with one line in the CLI; never a traceback, a hang, or a file left behind."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_read_files import one_line

import specc
from specc import SpecError
from specc.backends.torch.checkpoint import compile_checkpoint, read_spec
from specc.cli import run
from specc.interop import safetensors_read as checkpoint
from specc.train import training_checkpoint as TC

FUZZ = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
SECONDS = 10  # per example, whatever it is
TINY = ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=32", "context=16", "mlp.hidden=32"]
DTYPES = [*checkpoint.DTYPES, "F4", "f32", "", "C64"]

json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_value = st.recursive(
    json_scalar,
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=8), c, max_size=4)),
    max_leaves=10,
)


def cli(*args: Any) -> tuple[int, str, str]:
    """The CLI in-process, its stdout and stderr captured (hypothesis runs many examples in one test)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def api_outcome(fn: Any, *args: Any) -> Any:
    """``fn(*args)``: a value, or a SpecError; anything else fails the test."""
    try:
        return fn(*args)
    except SpecError as e:
        assert e.diagnostics and all(d.file for d in e.diagnostics), e.format()
        return e


# ---------------------------------------------------------------------------------------------- headers


@st.composite
def tensor_entry(draw: Any) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(json_value)
    entry = {
        "dtype": draw(st.one_of(st.sampled_from(DTYPES), json_value)) if draw(st.booleans()) else "F32",
        "shape": draw(st.one_of(st.lists(st.integers(-1, 5), max_size=3), json_value)),
        "data_offsets": draw(st.one_of(st.lists(st.integers(-1, 120), min_size=2, max_size=2), json_value)),
    }
    if draw(st.integers(0, 4)) == 0:
        del entry[draw(st.sampled_from(sorted(entry)))]
    if draw(st.integers(0, 4)) == 0:
        entry[draw(st.text(max_size=6))] = draw(json_value)
    return entry


@st.composite
def safetensors_bytes(draw: Any) -> bytes:
    """A plausible file made wrong in one or more ways, or plain junk."""
    kind = draw(st.sampled_from(["table", "valid-mutated", "junk"]))
    if kind == "junk":
        return draw(st.binary(max_size=300))
    if kind == "valid-mutated":
        tensors = {
            f"t{i}": torch.zeros(draw(st.lists(st.integers(0, 4), max_size=3))) for i in range(draw(st.integers(0, 3)))
        }
        raw = bytearray(
            safetensors.torch.save(
                tensors,
                metadata=draw(st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=20), max_size=2)),
            )
        )
        for _ in range(draw(st.integers(1, 3))):
            how = draw(st.sampled_from(["flip", "truncate", "length", "append"]))
            if how == "flip" and raw:
                i = draw(st.integers(0, len(raw) - 1))
                raw[i] = draw(st.integers(0, 255))
            elif how == "truncate":
                del raw[draw(st.integers(0, len(raw))) :]
            elif how == "length" and len(raw) >= 8:
                raw[:8] = struct.pack("<Q", draw(st.sampled_from([0, 1, 7, len(raw), 2**40, 2**64 - 1])))
            else:
                raw += draw(st.binary(max_size=20))
        return bytes(raw)
    header: dict[str, Any] = draw(st.dictionaries(st.text(min_size=1, max_size=8), tensor_entry(), max_size=3))
    data = b""
    if draw(st.booleans()):  # consistent byte ranges, so the checks behind them are reached too
        at = 0
        for entry in header.values():
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if isinstance(shape, list) and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
            ):
                size = checkpoint.DTYPES.get(str(entry.get("dtype")), (4, ""))[0]
                n = size * int(torch.tensor(shape).prod()) if shape else size
                entry["data_offsets"] = [at, at + n]
                at += n
        data = bytes(at) if draw(st.integers(0, 3)) else bytes(max(0, at - 1))
    if draw(st.booleans()):
        header["__metadata__"] = draw(
            st.one_of(st.dictionaries(st.text(max_size=6), st.text(max_size=30), max_size=3), json_value)
        )
    text = json.dumps(header).encode()
    if draw(st.integers(0, 5)) == 0:
        text = b"[" * draw(st.integers(10, 3000)) + text
    length = len(text) if draw(st.integers(0, 3)) else draw(st.integers(0, 2**64 - 1))
    return struct.pack("<Q", length) + text + (data or draw(st.binary(max_size=150)))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fuzz_st")
    (d / "spec.yaml").write_text(
        "name: t\nkind: decoder\nvocab_size: 32\ncontext: 16\nd_model: 16\nblocks: 1\nattention: {heads: 2}\n"
    )
    return d


@FUZZ
@given(raw=safetensors_bytes())
def test_fuzz_safetensors_headers(work: Path, raw: bytes) -> None:
    path = work / "w.safetensors"
    path.write_bytes(raw)
    before = listing(work)
    start = time.perf_counter()
    for fn in (checkpoint.read_header, checkpoint.shapes, checkpoint.load, TC.load, read_spec):
        api_outcome(fn, path)
    out = work / "out.safetensors"
    one_line(cli("compile", work / "spec.yaml", "--weights", path, "-o", out))
    one_line(cli("generate", path, "-p", "1 2", "-n", "1"))
    assert time.perf_counter() - start < SECONDS
    assert listing(work) == before


def test_a_valid_header_reads_as_safetensors_wrote_it(tmp_path: Path) -> None:
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(0), "c": torch.tensor([1, 2])}
    path = tmp_path / "x.safetensors"
    path.write_bytes(safetensors.torch.save(tensors, metadata={"k": "v"}))
    h = checkpoint.read_header(path)
    assert h.metadata == {"k": "v"} and {n: t.shape for n, t in h.tensors.items()} == {
        "a": (2, 3),
        "b": (0,),
        "c": (2,),
    }
    got = checkpoint.load(path)
    assert all(torch.equal(got[k], v) for k, v in tensors.items())


# ---------------------------------------------------------------------------------------------- metadata


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    path = compile_checkpoint(specc.load_spec("gpt2", TINY), tmp_path_factory.mktemp("good") / "g.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
    return safetensors.torch.load_file(str(path)), json.loads(meta["specc.spec"])


def _mutate(doc: Any, draw: Any) -> Any:
    """Replace, delete or add one field somewhere in a JSON document."""
    if isinstance(doc, dict) and doc and draw(st.integers(0, 3)):
        key = draw(st.sampled_from(sorted(doc)))
        how = draw(st.sampled_from(["replace", "delete", "deeper", "add"]))
        out = dict(doc)
        if how == "replace":
            out[key] = draw(json_value)
        elif how == "delete":
            del out[key]
        elif how == "deeper":
            out[key] = _mutate(out[key], draw)
        else:
            out[draw(st.text(max_size=8))] = draw(json_value)
        return out
    return draw(json_value)


@st.composite
def metadata(draw: Any, spec: dict[str, Any]) -> dict[str, str]:
    meta: dict[str, str] = {"format": "pt"}
    choice = draw(st.sampled_from(["mutated", "text", "json", "extends", "none"]))
    if choice == "mutated":
        meta["specc.spec"] = json.dumps(_mutate(spec, draw))
    elif choice == "text":
        meta["specc.spec"] = draw(st.text(max_size=40))
    elif choice == "json":
        meta["specc.spec"] = json.dumps(draw(json_value))
    elif choice == "extends":
        meta["specc.spec"] = json.dumps(
            {**spec, "extends": draw(st.sampled_from(["gpt2", "/etc/passwd", "spec.yaml"]))}
        )
    if draw(st.booleans()):
        meta["specc.train"] = draw(st.one_of(st.text(max_size=30), json_value.map(json.dumps)))
    return meta


@FUZZ
@given(data=st.data())
def test_fuzz_checkpoint_metadata(work: Path, good: Any, data: Any) -> None:
    tensors, spec = good
    meta = data.draw(metadata(spec))
    path = work / "ck.safetensors"
    path.write_bytes(safetensors.torch.save(tensors, metadata=meta))
    before = listing(work)
    start = time.perf_counter()
    for fn in (read_spec, TC.load):
        api_outcome(fn, path)
    code, out, err = cli("generate", path, "-p", "1 2", "-n", "1")
    if code != 0:
        one_line((code, out, err))
    else:  # a mutation that left a valid spec the weights fit
        assert "extends" not in meta.get("specc.spec", "") or '"extends": null' in meta["specc.spec"]
    assert time.perf_counter() - start < SECONDS
    assert listing(work) == before


# ---------------------------------------------------------------------------------------------- sharded indexes

ENTRIES = [
    "good.safetensors",
    "pipe.safetensors",
    "zero.safetensors",
    "gone.safetensors",
    "dir.safetensors",
    "junk.safetensors",
    "../good.safetensors",
    "/etc/passwd",
    "sub/good.safetensors",
    "",
    ".",
    "..",
    "good.safetensors\x00",
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("shards")
    safetensors.torch.save_file({"embed.weight": torch.zeros(32, 16)}, d / "good.safetensors")
    os.mkfifo(d / "pipe.safetensors")
    (d / "zero.safetensors").symlink_to("/dev/zero")
    (d / "gone.safetensors").symlink_to(d / "nothing")
    (d / "dir.safetensors").mkdir()
    (d / "junk.safetensors").write_bytes(b"\x00" * 40)
    (d / "spec.yaml").write_text(
        "name: t\nkind: decoder\nvocab_size: 32\ncontext: 16\nd_model: 16\nblocks: 1\nattention: {heads: 2}\n"
    )
    return d


@st.composite
def index(draw: Any) -> str:
    names = st.one_of(st.sampled_from(["embed.weight", "pos.weight", "x"]), st.text(max_size=6))
    wmap = draw(
        st.one_of(
            st.dictionaries(names, st.one_of(st.sampled_from(ENTRIES), json_value), min_size=1, max_size=3),
            json_value,
        )
    )
    doc = draw(st.one_of(st.just({"weight_map": wmap}), st.just({"metadata": draw(json_value), "weight_map": wmap}),
                         json_value))  # fmt: skip
    text = json.dumps(doc)
    if draw(st.integers(0, 6)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text


@FUZZ
@given(text=index())
def test_fuzz_sharded_index(shards: Path, text: str) -> None:
    path = shards / checkpoint.INDEX
    path.write_text(text)
    before = listing(shards)
    start = time.perf_counter()
    result = api_outcome(checkpoint.shapes, path)
    if not isinstance(result, SpecError):  # only the good shard can ever be read
        assert set(result) <= {"embed.weight"}
    out = shards / "out.safetensors"
    code, o, e = cli("compile", shards / "spec.yaml", "--weights", path, "-o", out)
    one_line((code, o, e))
    assert time.perf_counter() - start < SECONDS
    assert listing(shards) == before
