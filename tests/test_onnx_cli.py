"""`specc compile --target onnx` and `specc run`: happy paths, and every user error exits 2 with one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import specc
from specc.backends.onnx.export import export_onnx

GPT = ["blocks=2", "d_model=32", "attention.heads=4", "context=32", "vocab_size=50", "mlp.hidden=64"]
CLI = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("onnx_cli")
    gpt = specc.load_spec("gpt2", GPT)
    return {
        "gpt": export_onnx(gpt, d / "gpt.onnx"),
        "gpt_kv": export_onnx(gpt, d / "gpt_kv.onnx", kv_cache=True),
        "vit": export_onnx(
            specc.load_spec(
                "vit-b16",
                [
                    "blocks=1",
                    "d_model=32",
                    "attention.heads=4",
                    "image.size=16",
                    "image.patch=8",
                    "classes=7",
                    "mlp.hidden=64",
                ],
            ),
            d / "vit.onnx",
        ),
        "rnn": export_onnx(
            specc.load_spec("gru-bahdanau", ["rnn.hidden=16", "rnn.embed=8", "vocab_size=20"]), d / "s2s.onnx"
        ),
        "dir": d,
    }


def test_compile_onnx_then_run(cli: CLI, tmp_path: Path) -> None:
    path = tmp_path / "g.onnx"
    code, out, err = cli(
        "compile", "gpt2", "--target", "onnx", "-o", path, "--kv-cache", *[a for s in GPT for a in ("--set", s)]
    )
    assert code == 0, err
    assert path.is_file()
    code, out, err = cli("run", path, "--input-ids", "1 2 3; 4 5 6", "--provider", "cpu")
    assert code == 0, err
    assert "provider: CPUExecutionProvider" in out
    assert "logits" in out and "[2, 3, 50]" in out
    assert "top-5 at the last position" in out and "[1]" in out


def test_run_generate_through_the_kv_cache(cli: CLI, models: dict[str, Path]) -> None:
    code, out, err = cli("run", models["gpt_kv"], "--input-ids", "1 2 3", "--generate", "4", "--provider", "cpu")
    assert code == 0, err
    ids = out.split("generated 4 tokens per row:")[1].split()
    assert len(ids) == 4 and all(0 <= int(t) < 50 for t in ids)
    # the cache-less graph recomputes the context and must pick the same tokens
    code, out2, _ = cli("run", models["gpt"], "--input-ids", "1 2 3", "--generate", "4", "--provider", "cpu")
    assert out2.split("generated 4 tokens per row:")[1].split() == ids


def test_run_rnn_generate_and_forward(cli: CLI, models: dict[str, Path]) -> None:
    code, out, err = cli("run", models["rnn"], "--input-ids", "3 4 5 6", "--generate", "5", "--provider", "cpu")
    assert code == 0, err
    assert len(out.split("generated 5 tokens per row:")[1].split()) == 5
    code, out, err = cli("run", models["rnn"], "--random", "2,6", "--provider", "cpu")
    assert code == 0, err
    assert "attention_weights" in out and "logits" in out


def test_run_bench_and_random(cli: CLI, models: dict[str, Path]) -> None:
    code, out, err = cli("run", models["vit"], "--random", "3,1", "--bench", "--iters", "3", "--warmup", "1")
    assert code == 0, err
    assert "[3, 7]" in out and "per sample" in out
    assert "latency p50" in out and "samples/s" in out
    code, out, err = cli("run", models["gpt_kv"], "--random", "1,4", "--generate", "3", "--bench", "--iters", "2")
    assert code == 0, err
    assert "new tokens/s" in out


def test_run_npy_inputs(cli: CLI, models: dict[str, Path], tmp_path: Path) -> None:
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3, 4]], np.int32))  # any integer width is fine
    np.save(tmp_path / "mask.npy", np.array([[1, 1, 1, 0]], np.int64))
    code, out, err = cli(
        "run", models["gpt"], "--input", tmp_path / "ids.npy", "--input", f"attention_mask={tmp_path / 'mask.npy'}"
    )
    assert code == 0, err
    assert "attention_mask [1, 4] int64" in out


def test_run_past_a_rotary_models_context_says_so(cli: CLI, tmp_path: Path) -> None:
    """Rotary positions run past the spec's context (and equal torch there), but the user hears it once."""
    spec = specc.load_spec("llama2-7b", [*GPT, "attention.kv_heads=4", "context=16", "dtype=fp32"])
    path = export_onnx(spec, tmp_path / "r.onnx")
    code, out, err = cli("run", path, "--random", "1,12", "--provider", "cpu")
    assert code == 0 and "note:" not in err, err
    code, out, err = cli("run", path, "--random", "1,12", "--generate", "6", "--provider", "cpu")
    assert code == 0 and "note: 18 tokens pass the spec's context of 16" in err, err
    assert "generated 6 tokens" in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--input-ids", "1 2 99"], "outside the vocabulary (0..49)"),
        (["--input-ids", "1 -2"], "outside the vocabulary"),
        (["--input-ids", "1 two"], "'two' is not an integer"),
        (["--input-ids", "1 2; 3"], "different lengths"),
        (["--input", "foo={npy_float}"], "no input named 'foo'"),
        (["--input", "{npy_float}"], "must hold integers"),
        (["--input", "{npy_3d}"], "must have 2 dims"),
        (["--input", "{npy_ids}", "--input", "attention_mask={npy_mask_short}"], "attention_mask has shape [1, 2]"),
        (["--input", "{not_npy}"], "not a .npy/.npz file"),
        (["--random", "0,4"], "expected B,N"),
        (["--random", "1,4", "--input-ids", "1"], "cannot be combined"),
        (["--provider", "cuda"], "CUDA"),
        (["--input-ids", "1 2", "--generate", "40"], "passes the model's 32 learned positions"),
        (["--input-ids", " ".join(["1"] * 33)], "has 33 tokens; the model has 32 learned positions"),
    ],
)
def test_run_errors_exit_2_with_one_line(
    cli: CLI, models: dict[str, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    files = {
        "npy_float": tmp_path / "f.npy",
        "npy_3d": tmp_path / "d3.npy",
        "npy_ids": tmp_path / "ids.npy",
        "npy_mask_short": tmp_path / "m.npy",
        "not_npy": tmp_path / "x.npy",
    }
    np.save(files["npy_float"], np.zeros((1, 3), np.float32))
    np.save(files["npy_3d"], np.zeros((1, 3, 2), np.int64))
    np.save(files["npy_ids"], np.ones((1, 3), np.int64))
    np.save(files["npy_mask_short"], np.ones((1, 2), np.int64))
    files["not_npy"].write_text("hello")
    args = [a.format(**files) for a in args]
    model = models["gpt_kv"] if "--generate" in args else models["gpt"]
    code, _, err = cli("run", model, *args)
    assert code == 2
    lines = [line for line in err.strip().splitlines() if not line.startswith("  hint:")]
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err
    assert message in lines[0]


@pytest.mark.parametrize("content", [b"", b"name: gpt2\nkind: decoder\n", b"\x00\x01garbage"])
def test_run_refuses_a_file_that_is_not_onnx(cli: CLI, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    code, _, err = cli("run", path)
    assert code == 2
    assert "bad.onnx is not an ONNX model" in err and "Traceback" not in err


def test_run_missing_file_and_step_graph(cli: CLI, models: dict[str, Path], tmp_path: Path) -> None:
    code, _, err = cli("run", tmp_path / "nope.onnx")
    assert code == 2 and "no such file" in err
    step = models["dir"] / "s2s.decoder_step.onnx"
    code, _, err = cli("run", step)
    assert code == 2 and "one-step decoder" in err
