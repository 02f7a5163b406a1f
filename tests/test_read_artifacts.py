"""specc's own artifacts read back strictly: checkpoints (embedded spec as data only, training state, optimizer
sidecar), ONNX metadata and inputs (.npy/.npz, ids), device profiles and training texts. Every problem is one
located line, exit 2, and happens before any work starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from test_read_files import CLI, fifo, one_line

import specc
from specc import SpecError
from specc.analysis.devices import load_device
from specc.backends.torch.checkpoint import compile_checkpoint, load_checkpoint, read_spec
from specc.train import training_checkpoint as TC

TINY = ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=32", "context=16", "mlp.hidden=32"]
RNN = """\
name: tiny-rnn
kind: rnn_seq2seq
vocab_size: 13
rnn: {cell: gru, hidden: 16, embed: 8, attention: bahdanau}
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_checkpoint(specc.load_spec("gpt2", TINY), tmp_path_factory.mktemp("ck") / "g.safetensors")


def rewrite(src: Path, dst: Path, **meta: str | None) -> Path:
    """A copy of a safetensors file with metadata keys replaced (None: removed)."""
    with safe_open(str(src), "pt") as f:
        old = dict(f.metadata() or {})
    for k, v in meta.items():
        key = k.replace("__", ".")
        if v is None:
            old.pop(key, None)
        else:
            old[key] = v
    save_file(load_file(str(src)), str(dst), metadata=old)
    return dst


# ---------------------------------------------------------------------------------------------- embedded spec


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ('"/etc/passwd"', "the spec in metadata 'specc.spec' must be a JSON object, not the string '/etc/passwd'"),
        ('"gpt3-175b"', "not the string 'gpt3-175b'"),
        ("[1, 2]", "not a list of 2 items"),
        ("{not json", "metadata 'specc.spec': not valid JSON"),
        ("[" * 5000 + "]" * 5000, "nested deeper than 32 levels"),
        ('{"extends": "gpt2", "blocks": 1}', "has extends: 'gpt2'"),
        ('{"extends": "/etc/passwd"}', "has extends: '/etc/passwd'"),
        ('{"kind": "decoder", "blocks": -1, "d_model": "x"}', "the spec in metadata 'specc.spec' is invalid:"),
        ('{"kind": "decoder", "name": "x", "blocks": 1, "blocks": 2}', "duplicate key 'blocks'"),
        ('{"kind": "decoder", "init": {"std": NaN}}', "NaN is not a JSON number"),
    ],
)
def test_embedded_spec_is_data_only(cli: CLI, ckpt: Path, tmp_path: Path, value: str, needle: str) -> None:
    bad = rewrite(ckpt, tmp_path / "bad.safetensors", specc__spec=value)
    start = time.perf_counter()
    one_line(cli("generate", bad, "-p", "1 2", "-n", "2"), needle, str(bad))
    assert time.perf_counter() - start < 10
    for read in (read_spec, load_checkpoint, TC.load):
        with pytest.raises(SpecError, match=r"metadata 'specc\.spec'"):
            read(bad)


def test_embedded_spec_never_opens_a_file(ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored spec naming a file (as a value or through extends) reads nothing beyond the checkpoint."""
    opened: list[str] = []
    real = Path.exists

    def spy(self: Path) -> bool:
        opened.append(str(self))
        return real(self)

    monkeypatch.setattr(Path, "exists", spy)
    for value in ('{"extends": "spec.yaml", "blocks": 1}', '"spec.yaml"'):
        (tmp_path / "spec.yaml").write_text("name: x\nkind: decoder\n")
        bad = rewrite(ckpt, tmp_path / "b.safetensors", specc__spec=value)
        opened.clear()
        with pytest.raises(SpecError):
            read_spec(bad)
        assert not [p for p in opened if p.endswith("spec.yaml")]


def test_checkpoint_without_a_spec_or_with_a_valid_one(cli: CLI, ckpt: Path, tmp_path: Path) -> None:
    none = rewrite(ckpt, tmp_path / "none.safetensors", specc__spec=None)
    one_line(cli("generate", none, "-p", "1 2", "-n", "2"), "no specc spec in its metadata")
    assert read_spec(ckpt).blocks == 1


# ---------------------------------------------------------------------------------------------- training state


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specc.cli import run

    d = tmp_path_factory.mktemp("train")
    (d / "rnn.yaml").write_text(RNN)
    ck = d / "rnn.safetensors"
    args = ["train", d / "rnn.yaml", "--task", "reverse", "--steps", "2", "--max-len", "4", "--eval-size", "4"]
    assert run([str(a) for a in [*args, "--device", "cpu", "-o", ck]]) == 0
    return ck


def _state(ck: Path) -> dict:
    with safe_open(str(ck), "pt") as f:
        return json.loads(f.metadata()[TC.TRAIN_KEY])


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda s: "not json", "metadata 'specc.train': not valid JSON"),
        (lambda s: "[1]", "the training state (metadata 'specc.train') must be a JSON object"),
        (lambda s: json.dumps({**s, "step": "2"}), "step must be a whole number ≥ 0, got the string '2'"),
        (lambda s: json.dumps({**s, "step": -1}), "step must be a whole number ≥ 0"),
        (lambda s: json.dumps({**s, "vocab": "abc"}), "vocab must be a list of symbols"),
        (lambda s: json.dumps({**s, "vocab": [1, 2]}), "vocab must be a list of symbols"),
        (lambda s: json.dumps({**s, "history": {"step": 1}}), "history must be a list of evaluation records"),
        (lambda s: json.dumps({**s, "config": []}), "config must be an object of training settings"),
        (lambda s: json.dumps({**s, "config": {**s["config"], "steps": "9"}}), "config.steps must be a whole number"),
        (lambda s: json.dumps({**s, "config": {**s["config"], "lr": "fast"}}), "config.lr must be a number"),
        (lambda s: json.dumps({**s, "config": {**s["config"], "max_len": 4.5}}), "config.max_len must be a whole"),
        (lambda s: json.dumps({**s, "config": {**s["config"], "text": 3}}), "config.text must be text or null"),
        (
            lambda s: json.dumps({**s, "config": {k: v for k, v in s["config"].items() if k != "task"}}),
            "config.task must be present",
        ),
        (lambda s: json.dumps({**s, "task": ["reverse"]}), "task must be a task name"),
    ],
)
def test_training_state_types_are_checked_before_training(
    cli: CLI, trained: Path, tmp_path: Path, change, needle: str
) -> None:
    bad = rewrite(trained, tmp_path / "bad.safetensors", specc__train=change(_state(trained)))
    out = tmp_path / "out.safetensors"
    one_line(cli("train", "--resume", bad, "--steps", "4", "--device", "cpu", "-o", out), needle, str(bad))
    assert not out.exists()
    with pytest.raises(SpecError, match=r"specc\.train"):
        TC.load(bad)


def test_a_diverged_loss_in_the_history_is_data() -> None:
    state = TC.check_train_state('{"step": 3, "history": [{"step": 3, "val_loss": NaN, "x": -Infinity}]}', "ck")
    assert state["step"] == 3
    with pytest.raises(SpecError, match=r"config\.lr must be a number, got the number nan"):
        TC.check_train_state('{"config": {"task": "copy", "steps": 4, "lr": NaN}}', "ck")


def test_optimizer_sidecar_must_fit_the_model(cli: CLI, trained: Path, tmp_path: Path) -> None:
    side = TC.optimizer_path(trained)
    moments = load_file(str(side))
    with safe_open(str(side), "pt") as f:
        meta = f.metadata()
    # without the sidecar's hash (as an older specc wrote it), so that the edited sidecar's contents are checked
    copy = rewrite(trained, tmp_path / "ck.safetensors", specc__optimizer__sha256=None)
    out = tmp_path / "out.safetensors"
    first = sorted(k for k in moments if k.endswith(".exp_avg"))[0]
    cases = {
        "has shape [3]": {**moments, first: torch.zeros(3)},
        "which is not <parameter>": {**moments, "nope.exp_avg": torch.zeros(1)},
        "holds NaN or infinite values": {**moments, first: torch.full_like(moments[first], float("nan"))},
        "is int64, not float": {**moments, first: moments[first].long()},
    }
    for needle, tensors in cases.items():
        save_file(tensors, str(TC.optimizer_path(copy)), metadata=meta)
        one_line(cli("train", "--resume", copy, "--steps", "4", "--device", "cpu", "-o", out), needle)
        assert not out.exists()
    TC.optimizer_path(copy).unlink()
    fifo(TC.optimizer_path(copy))
    start = time.perf_counter()
    one_line(cli("train", "--resume", copy, "--steps", "4", "--device", "cpu", "-o", out), "FIFO")
    assert time.perf_counter() - start < 10


# ---------------------------------------------------------------------------------------------- training text


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"", "empty"),
        ("hello world\n".encode("utf-16"), "UTF-16 text; a training text must be UTF-8"),
        (b"abc\xff\xfe", "not UTF-8 text"),
        (b"ab\x00cd", "binary data (NUL byte) in a training text"),
    ],
)
def test_training_text_is_utf8_and_not_empty(cli: CLI, tmp_path: Path, content: bytes, needle: str) -> None:
    spec = tmp_path / "lm.yaml"
    spec.write_text(
        "name: lm\nkind: decoder\nvocab_size: 8\ncontext: 16\nd_model: 16\nblocks: 1\nattention: {heads: 2}\n"
    )
    text = tmp_path / "t.txt"
    text.write_bytes(content)
    out = tmp_path / "o.safetensors"
    one_line(cli("train", spec, "--task", "lm", "--text", text, "--steps", "2", "--device", "cpu", "-o", out), needle)
    one_line(cli("train", spec, "--task", "lm", "--text", fifo(tmp_path / "p.txt"), "--steps", "2", "-o", out), "FIFO")
    one_line(cli("train", spec, "--task", "lm", "--text", "/dev/zero", "--steps", "2", "-o", out), "character device")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------- device profiles


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("peak_flops: {}\nbandwidth: 1e12\nmemory: 8e9\n", "1:1: error: peak_flops is empty"),
        (
            "peak_flops: {bf16: 1e15}\nbandwidth: 1e12\nmemory: 1e400\n",
            "3:1: error: memory must be a finite number, got inf",
        ),
        (
            "peak_flops: {bf16: 1e15}\nbandwidth: .nan\nmemory: 8e9\n",
            "2:1: error: bandwidth must be a finite number, got nan",
        ),
        ("peak_flops: {bf16: 1e15}\nbandwidth: .inf\nmemory: 8e9\n", "bandwidth must be a finite number, got inf"),
        ("peak_flops: {bf16: 1e15}\nbandwidth: 1e400 TB/s\nmemory: 8e9\n", "bandwidth must be a finite number"),
        ("peak_flops: {bf16: -.inf}\nbandwidth: 1e12\nmemory: 8e9\n", "peak_flops.bf16 must be a finite number"),
        ("peak_flops: {bf16: 1e15}\nbandwidth: 1e12\nmemory: 1e30\n", "memory = 1e+30 is outside 1…1e+24"),
        ("peak_flops: {bf16: [1]}\nbandwidth: 1e12\nmemory: 8e9\n", "expected a number or a quantity"),
        ("name: [a]\npeak_flops: {bf16: 1e15}\nbandwidth: 1e12\nmemory: 8e9\n", "name must be text"),
        ("peak_flops: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 32 levels"),
    ],
)
def test_device_profile_numbers_are_finite_and_located(cli: CLI, tmp_path: Path, body: str, needle: str) -> None:
    p = tmp_path / "dev.yaml"
    p.write_text(body)
    with pytest.raises(SpecError) as e:
        load_device(str(p))
    assert needle in e.value.format()
    code, _, err = cli("analyze", "gpt2", "--device", p)
    assert code == 2 and needle in err and "Traceback" not in err


def test_device_profile_must_be_a_regular_file(cli: CLI, tmp_path: Path) -> None:
    one_line(cli("analyze", "gpt2", "--device", fifo(tmp_path / "d.yaml")), "FIFO")
    one_line(cli("analyze", "gpt2", "--device", "/dev/zero"), "character device")


# ---------------------------------------------------------------------------------------------- ONNX and inputs


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return specc.export_onnx(specc.load_spec("gpt2", TINY), tmp_path_factory.mktemp("onnx") / "g.onnx")


def with_metadata(src: Path, dst: Path, **props: str) -> Path:
    import onnx

    m = onnx.load(str(src))
    keep = {p.key: p.value for p in m.metadata_props}
    keep.update({k.replace("__", "."): v for k, v in props.items()})
    del m.metadata_props[:]
    for k, v in keep.items():
        m.metadata_props.add(key=k, value=v)
    onnx.save(m, str(dst))
    return dst


@pytest.mark.parametrize(
    ("props", "needle"),
    [
        ({"specc__ir_meta": "{oops"}, "metadata 'specc.ir_meta': not valid JSON"),
        ({"specc__ir_meta": "[]"}, "metadata 'specc.ir_meta' must be a JSON object, not a list of 0 items"),
        ({"specc__ir_meta": '{"vocab_size": "32"}'}, "vocab_size must be a positive whole number, got the string"),
        ({"specc__ir_meta": '{"max_positions": -4}'}, "max_positions must be a positive whole number"),
        ({"specc__ir_meta": '{"task": 3}'}, "task must be text, got the number 3"),
        ({"specc__spec": "not json"}, "metadata 'specc.spec': not valid JSON"),
        ({"specc__spec": '"gpt2"'}, "must be a JSON object, not the string 'gpt2'"),
        ({"specc__role": "wizard"}, "metadata 'specc.role' is 'wizard'"),
        ({"specc__role": "encoder", "specc__decoder_step": "../../etc/x.onnx"}, "is not a file name in the folder"),
        ({"specc__role": "encoder", "specc__decoder_step": "/etc/passwd"}, "is not a file name in the folder"),
        ({"specc__ir_meta": "[" * 1000 + "]" * 1000}, "nested deeper than 32 levels"),
    ],
)
def test_onnx_metadata_is_checked(cli: CLI, onnx_model: Path, tmp_path: Path, props: dict, needle: str) -> None:
    bad = with_metadata(onnx_model, tmp_path / "bad.onnx", **props)
    one_line(cli("run", bad, "--input-ids", "1 2 3", "--provider", "cpu"), needle)


def test_onnx_model_file_must_be_regular(cli: CLI, tmp_path: Path) -> None:
    start = time.perf_counter()
    one_line(cli("run", fifo(tmp_path / "m.onnx"), "--provider", "cpu"), "FIFO")
    one_line(cli("run", "/dev/zero", "--provider", "cpu"), "character device")
    assert time.perf_counter() - start < 10


def _external(folder: Path, location: str) -> Path:
    """A one-MatMul model whose weight is external data at ``location``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    x = helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("MatMul", ["input_ids", "w"], ["logits"])], "g", [x], [y], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    path = folder / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="w.data", size_threshold=0)
    model = onnx.load(str(path), load_external_data=False)
    entry = next(e for e in model.graph.initializer[0].external_data if e.key == "location")
    entry.value = location
    onnx.save(model, str(path))
    return path


def test_onnx_external_data_stays_beside_the_model(cli: CLI, tmp_path: Path) -> None:
    """onnxruntime itself confines external data to the model's folder and to regular files: one line each."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "outside.data").write_bytes(np.ones((4, 4), np.float32).tobytes())
    fifo(sub / "pipe.data")
    (sub / "zero.data").symlink_to("/dev/zero")
    start = time.perf_counter()
    for location, needle in [
        ("../outside.data", "escapes model directory"),
        (str(tmp_path / "outside.data"), "Absolute path not allowed"),
        ("pipe.data", "regular file"),
        ("zero.data", "escapes model directory"),
    ]:
        one_line(cli("run", _external(sub, location), "--random", "1,4", "--provider", "cpu"), needle)
    assert time.perf_counter() - start < 20


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: np.save(p, np.array(5)), "is a 0-d array (a single number)"),
        (lambda p: np.save(p, np.array([["a", "b"]])), "holds <U1 values"),
        (lambda p: np.save(p, np.array([[1 + 2j]])), "holds complex128 values"),
        (lambda p: np.save(p, np.array([[1, 2]], dtype=object), allow_pickle=True), "not a .npy/.npz file"),
        (lambda p: np.save(p, np.array([[2**63 + 5]], dtype=np.uint64)), "holds 9223372036854775813, which does not"),
        (
            lambda p: p.write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (9,)}"),
            "not a .npy/.npz file",
        ),
        (lambda p: p.write_bytes(b"PK\x03\x04garbage"), "not a .npy/.npz file"),
        (lambda p: p.write_bytes(b""), "not a .npy/.npz file"),
    ],
)
def test_npy_inputs_are_numeric_arrays(cli: CLI, onnx_model: Path, tmp_path: Path, make, needle: str) -> None:
    p = tmp_path / "x.npy"
    make(p)
    one_line(cli("run", onnx_model, "--input", p, "--provider", "cpu"), needle)


def test_npz_with_object_arrays_and_bad_members(cli: CLI, onnx_model: Path, tmp_path: Path) -> None:
    p = tmp_path / "x.npz"
    np.savez(p, input_ids=np.array([[1, 2]], dtype=object), allow_pickle=True)
    one_line(cli("run", onnx_model, "--input", p, "--provider", "cpu"), "x.npz['input_ids'] cannot be read")
    one_line(cli("run", onnx_model, "--input", fifo(tmp_path / "f.npy"), "--provider", "cpu"), "FIFO")
    one_line(cli("run", onnx_model, "--input", "/dev/zero", "--provider", "cpu"), "character device")
    good = _npz(tmp_path / "ok.npz", input_ids=np.array([[1, 2, 3]]))
    code, _, err = cli("run", onnx_model, "--input", good, "--provider", "cpu")
    assert code == 0, err


@pytest.mark.parametrize(
    ("ids", "needle"),
    [
        ("99999999999999999999", "is too large for a token id"),
        ("9223372036854775808", "9223372036854775808 is too large for a token id"),
        ("1" * 5000, "is too large for a token id"),
        ("-9223372036854775809", "is too large for a token id"),
    ],
)
def test_ids_beyond_int64(cli: CLI, onnx_model: Path, ids: str, needle: str) -> None:
    line = one_line(cli("run", onnx_model, "--input-ids", ids, "--provider", "cpu"), needle)
    assert len(line) < 200
