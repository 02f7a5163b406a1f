"""Bad values for ids and output paths across commands: exit 2, one located line, no traceback, no file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

TINY_LM = [
    "--set",
    "blocks=1",
    "--set",
    "d_model=16",
    "--set",
    "attention.heads=2",
    "--set",
    "vocab_size=50",
    "--set",
    "context=16",
    "--set",
    "mlp.hidden=32",
]
TINY_S2S = [
    "--set",
    "blocks=1",
    "--set",
    "d_model=16",
    "--set",
    "attention.heads=2",
    "--set",
    "vocab_size=40",
    "--set",
    "mlp.hidden=32",
]


def clean_exit_2(result: tuple[int, str, str]) -> str:
    code, _out, err = result
    assert code == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("ids", ["1 -2", "1 50", "99"])
def test_generate_prompt_ids_outside_vocabulary(cli, ids: str) -> None:
    err = clean_exit_2(cli("generate", "gpt2", *TINY_LM, "--prompt-ids", ids, "-n", "2"))
    assert "outside the vocabulary (0..49)" in err


@pytest.mark.parametrize("start", ["-1", "40", "500"])
def test_generate_decoder_start_outside_vocabulary(cli, start: str) -> None:
    err = clean_exit_2(
        cli("generate", "transformer-base", *TINY_S2S, "-p", "3 4", "-n", "2", "--decoder-start-id", start)
    )
    assert f"--decoder-start-id {start} is outside the vocabulary" in err


def test_generate_and_run_share_the_start_flag(cli, tmp_path: Path) -> None:
    code, out, err = cli("generate", "transformer-base", *TINY_S2S, "-p", "3 4", "-n", "2", "--start-id", "2")
    assert code == 0, err
    assert out.split()[0] == "2"
    model = tmp_path / "s2s.onnx"
    assert cli("compile", "transformer-base", *TINY_S2S, "--target", "onnx", "-o", model)[0] == 0
    err = clean_exit_2(cli("run", model, "--input-ids", "3 4", "--generate", "2", "--decoder-start-id", "40"))
    assert "--start-id 40 is outside the vocabulary (0..39)" in err


def test_run_rnn_start_id_checked(cli, tmp_path: Path) -> None:
    model = tmp_path / "rnn.onnx"
    sets = ["--set", "vocab_size=30", "--set", "rnn.hidden=8", "--set", "rnn.embed=8"]
    assert cli("compile", "gru-bahdanau", *sets, "--target", "onnx", "-o", model)[0] == 0
    err = clean_exit_2(cli("run", model, "--input-ids", "3 4 5", "--generate", "2", "--start-id", "99999"))
    assert "--start-id 99999 is outside the vocabulary (0..29)" in err


def test_generate_on_an_onnx_file_points_to_run(cli, tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not really")
    err = clean_exit_2(cli("generate", model, "-p", "1 2"))
    assert "specc run" in err


def test_plot_with_unknown_suffix(cli, tmp_path: Path) -> None:
    target = tmp_path / "cost.txt"
    err = clean_exit_2(cli("analyze", "gpt2", "--sweep", "seq=128,256", "--plot", target))
    assert "unsupported image format '.txt'" in err and not target.exists()


def test_outputs_get_the_usual_permissions(cli, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        target = tmp_path / "model.py"
        assert cli("compile", "gpt2", *TINY_LM, "--target", "python", "-o", target)[0] == 0
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
