"""``torchrun --nproc-per-node 2 -m specc train ... --parallel`` ends where the single-process run ends, and its
checkpoints load into one process and ``specc generate``; layouts that cannot work are one-line errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from specc.train import training_checkpoint as C

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

ENC_DEC = """\
name: tiny-seq2seq
kind: encoder_decoder
vocab_size: 13
context: 16
d_model: 32
blocks: 1
attention: {heads: 2}
mlp: {type: classic, hidden: 64}
"""
LLAMA = ["--set", "blocks=2", "--set", "d_model=32", "--set", "attention.heads=4", "--set", "attention.kv_heads=2"]
LLAMA += ["--set", "mlp.hidden=48", "--set", "dtype=fp32"]


@pytest.fixture(autouse=True)
def _plain_kernels(monkeypatch: pytest.MonkeyPatch):
    from specc.backends.torch.accel import kernels

    monkeypatch.setenv("SPECC_KERNELS", "torch")  # the launched ranks and this process compute alike
    kernels.reset()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    kernels.reset()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(n: int, *args: object) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port", str(_port())]
    env = {**os.environ, "SPECC_KERNELS": "torch", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*cmd, "-m", "specc", *map(str, args)], capture_output=True, text=True, env=env, timeout=900, check=False
    )


def _weights_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_torchrun_dp2_seq2seq_ends_with_single_process_weights_in_a_distributed_checkpoint(
    cli, write_spec, tmp_path: Path
) -> None:
    """Reverse task: target lengths differ row to row, so the dp shards hold different token counts and the
    loss must be normalised by the global count to match."""
    from specc.train import training_checkpoint as C

    spec = write_spec(ENC_DEC)
    common = [spec, "--task", "reverse", "--steps", "3", "--batch", "8", "--max-len", "6", "--eval-size", "8"]
    code, out, err = cli("train", *common, "--device", "cpu", "-o", tmp_path / "one.safetensors")
    assert code == 0, err
    run = torchrun(2, "train", *common, "--parallel", "dp=2", "-o", tmp_path / "dcp")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "dp=2, tp=1" in run.stdout and run.stdout.count("wrote ") == 1  # rank 0 alone logs
    one, dcp = C.load(tmp_path / "one.safetensors"), C.load(tmp_path / "dcp")
    assert _weights_diff(one.weights, dcp.weights) < 1e-5
    assert dcp.step == 3 and dcp.train["task"] == "reverse"
    final = [line for line in out.splitlines() if line.startswith("final")]
    assert final and final[0] in run.stdout  # same greedy evaluation
    gen = [
        cli("generate", ck, "--prompt-ids", "3 4 5 6", "-n", "6")
        for ck in (tmp_path / "one.safetensors", tmp_path / "dcp")
    ]
    assert gen[0][0] == gen[1][0] == 0, gen[1][2]
    assert gen[0][1] == gen[1][1]


@pytest.mark.slow
def test_torchrun_tp2_checkpoint_resumes_under_dp2_to_the_single_process_weights(cli, tmp_path: Path) -> None:
    """Llama-like (GQA, SwiGLU, rotary) on characters: 2 steps at tp=2 gather one .safetensors with the Adam
    moments in the single-process layout (packed q|k|v rows back in order); resumed at dp=2 to step 4, it
    ends where 4 single-process steps end."""
    from safetensors.torch import load_file

    text = tmp_path / "text.txt"
    text.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 12), encoding="utf-8")
    common = ["--task", "lm", "--text", text, "--batch", "4", "--max-len", "16", "--eval-size", "8"]
    common += ["--schedule", "constant", "--warmup", "0"]  # the learning rate does not depend on --steps
    code, _, err = cli(
        "train", "llama2-7b", *LLAMA, *common, "--steps", "4", "--device", "cpu", "-o", tmp_path / "one.safetensors"
    )
    assert code == 0, err
    first = torchrun(
        2,
        "train",
        "llama2-7b",
        *LLAMA,
        *common,
        "--steps",
        "2",
        "--parallel",
        "tp=2",
        "-o",
        tmp_path / "tp.safetensors",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert set(load_file(tmp_path / "tp.optim.safetensors")) == set(load_file(tmp_path / "one.optim.safetensors"))
    then = torchrun(
        2,
        "train",
        "--resume",
        tmp_path / "tp.safetensors",
        "--steps",
        "4",
        "--parallel",
        "dp=2",
        "-o",
        tmp_path / "dp.safetensors",
    )
    assert then.returncode == 0, then.stderr[-3000:]
    assert "optimizer state from" in then.stdout  # the moments, not fresh ones
    for name in ("{}.safetensors", "{}.optim.safetensors"):
        a, b = (load_file(tmp_path / name.format(s)) for s in ("one", "dp"))
        assert _weights_diff(a, b) < 1e-5, name


def test_torchrun_tp2_distributed_checkpoint_with_adam_state_resumes_at_dp2_as_one_straight_run(
    cli, tmp_path: Path
) -> None:
    """2 steps at tp=2 into a DCP folder (weights and Adam moments sharded, packed q|k|v rows in order), then
    resumed to step 4 at dp=2 (DCP re-shards them) and in one process: both end where 4 straight
    single-process steps end, weights and moments."""
    from safetensors.torch import load_file

    from specc.parallel import sharded_checkpoint as distributed

    text = tmp_path / "text.txt"
    text.write_text(" ".join(["pack my box with five dozen liquor jugs"] * 10), encoding="utf-8")
    common = ["--task", "lm", "--text", text, "--batch", "4", "--max-len", "12", "--eval-size", "4"]
    common += ["--schedule", "constant", "--warmup", "0"]
    straight = tmp_path / "one.safetensors"
    code, _, err = cli("train", "llama2-7b", *LLAMA, *common, "--steps", "4", "--device", "cpu", "-o", straight)
    assert code == 0, err
    first = torchrun(
        2, "train", "llama2-7b", *LLAMA, *common, "--steps", "2", "--parallel", "tp=2", "-o", tmp_path / "k"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert distributed.has_optimizer(tmp_path / "k")
    then = torchrun(2, "train", "--resume", tmp_path / "k", "--steps", "4", "--parallel", "dp=2", "-o", tmp_path / "km")
    assert then.returncode == 0, then.stderr[-3000:]
    assert f"optimizer state from {tmp_path / 'k'}" in then.stdout  # the moments, not fresh ones
    code, out, err = cli(
        "train", "--resume", tmp_path / "k", "--steps", "4", "--device", "cpu", "-o", tmp_path / "1.safetensors"
    )
    assert code == 0 and "optimizer state from" in out, err
    want, moments = load_file(straight), load_file(tmp_path / "one.optim.safetensors")
    for got in (distributed.load(tmp_path / "km", with_optimizer=True), C.load(tmp_path / "1.safetensors", True)):
        assert got.step == 4
        assert _weights_diff(want, got.weights) < 1e-5
        assert _weights_diff(moments, got.optimizer) < 1e-5


def test_one_process_without_torchrun_trains_on_a_mesh_of_its_own(cli, tmp_path: Path) -> None:
    """``--parallel dp=1,tp=1`` needs no torchrun: a one-process group of its own (no env:// rendezvous),
    the single-process weights in a distributed checkpoint, the group gone afterwards."""
    from safetensors.torch import load_file

    from specc.parallel import sharded_checkpoint as distributed

    text = tmp_path / "text.txt"
    text.write_text("pack my box with five dozen liquor jugs " * 4, encoding="utf-8")
    common = ["train", "llama2-7b", *LLAMA, "--task", "lm", "--text", text, "--batch", "2", "--max-len", "8"]
    common += ["--eval-size", "2", "--steps", "2", "--device", "cpu"]
    code, _, err = cli(*common, "--parallel", "dp=1,tp=1", "-o", tmp_path / "k")
    assert code == 0 and "Traceback" not in err, err
    assert not dist.is_initialized()
    code, _, err = cli("train", "--resume", tmp_path / "k", "--steps", "2", "--parallel", "dp=1", "-o", tmp_path / "k2")
    assert code == 2 and "leaves nothing to do" in err  # refused on the mesh: the group is shut down all the same
    assert not dist.is_initialized()
    code, _, err = cli(*common, "-o", tmp_path / "one.safetensors")
    assert code == 0, err
    assert _weights_diff(load_file(tmp_path / "one.safetensors"), distributed.load(tmp_path / "k").weights) < 1e-6


def test_parallel_layout_errors_exit_2_before_training(cli, write_spec, tmp_path: Path) -> None:
    spec = write_spec(ENC_DEC)
    args = ["train", spec, "--task", "reverse", "--steps", "2", "-o", tmp_path / "o.safetensors"]
    for layout, message in [
        ("dp=2,pp=2", "pipeline parallelism runs decoder LMs"),  # checked against the spec before any work
        ("dp=2,sp=2", "--parallel: cannot read 'sp=2'"),  # read by the analyzer's parser: the same messages
        # read (case, spaces, the analyzer's form), accepted for the spec (one table shared by both stacks splits
        # by vocabulary), then refused for the process count
        ("TP=2, dp=1", "needs 2 processes; torchrun is not running this process"),
        ("tp=2,pp=1,dp=1", "needs 2 processes; torchrun is not running this process"),
        ("dp=0", "dp=0 is out of range"),
        ("tp=2,tp=2", "tp is given twice"),
        ("dp=2", "needs 2 processes; torchrun is not running this process"),
    ]:
        code, _, err = cli(*args, "--parallel", layout)
        assert code == 2 and message in err and "Traceback" not in err, (layout, err)
    folder = tmp_path / "ck"  # resumed into itself: refused before its shards are touched
    folder.mkdir()
    code, _, err = cli("train", "--resume", folder, "--steps", "4", "--parallel", "tp=2", "-o", folder)
    assert code == 2 and "is the checkpoint --resume reads" in err and "Traceback" not in err, err
