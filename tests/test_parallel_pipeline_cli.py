"""``torchrun -m specc train ... --parallel pp=2 --pipeline-schedule NAME``: the pipelined run ends where one
process ends, its checkpoint folder resumes at dp=2 and in one process and loads into ``specc generate``;
layouts that cannot run are one located line, exit 2, printed once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch.distributed as dist
from test_parallel_torch_cli import _plain_kernels, torchrun  # noqa: F401 (an autouse fixture)

from specc.train import training_checkpoint as C

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

GPT = ["--set", "blocks=4", "--set", "d_model=32", "--set", "attention.heads=4", "--set", "context=16"]
GPT += ["--set", "mlp.hidden=64", "--set", "dtype=fp32"]  # tied head: a copy of the table on the last stage


def _diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _common(tmp_path: Path) -> list[object]:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(["the quick brown fox jumps over the lazy dog"] * 12), encoding="utf-8")
    common: list[object] = ["--task", "lm", "--text", text, "--batch", "4", "--max-len", "12", "--eval-size", "8"]
    return [*common, "--schedule", "constant", "--warmup", "0"]  # the learning rate does not depend on --steps


def test_pp2_interleaved_checkpoint_resumes_at_dp2_and_in_one_process_as_one_straight_run(cli, tmp_path: Path) -> None:
    common = _common(tmp_path)
    code, _, err = cli(
        "train", "gpt2", *GPT, *common, "--steps", "4", "--device", "cpu", "-o", tmp_path / "one.safetensors"
    )
    assert code == 0, err
    pp = tmp_path / "pp"
    first = torchrun(2, "train", "gpt2", *GPT, *common, "--steps", "2", "--parallel", "pp=2",
                     "--pipeline-schedule", "interleaved-1f1b", "--virtual-stages", "2", "--micro-batch", "1",
                     "-o", pp)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    assert "pp=2: interleaved-1f1b, 4 chunks, 4 micro-batches" in first.stdout
    assert first.stdout.count("wrote ") == 1  # rank 0 alone logs
    then = torchrun(2, "train", "--resume", pp, "--steps", "4", "--parallel", "dp=2", "-o", tmp_path / "dp")
    assert then.returncode == 0, then.stderr[-3000:]
    assert "optimizer state from" in then.stdout
    code, out, err = cli("train", "--resume", pp, "--steps", "4", "--device", "cpu", "-o", tmp_path / "r.safetensors")
    assert code == 0 and "optimizer state from" in out, err
    one = C.load(tmp_path / "one.safetensors", with_optimizer=True)
    for path in (tmp_path / "dp", tmp_path / "r.safetensors"):
        got = C.load(path, with_optimizer=True)
        assert _diff(one.weights, got.weights) < 1e-5, path
        assert _diff(one.optimizer, got.optimizer) < 1e-5, path
    code, out, err = cli("generate", pp, "-p", "1 2 3", "-n", "4")
    assert code == 0, err
    assert len(out.split()) == 7 and out.split()[:3] == ["1", "2", "3"]


def _report(stdout: str) -> dict[int, dict[str, tuple[float, float]]]:
    """rank → item → (predicted, measured) from ``--report``'s table."""
    from specc.parallel.rank_report import ITEMS

    lines = stdout[stdout.index("report, each cell predicted / measured") :].splitlines()[2:]
    out = {}
    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != 2 + len(ITEMS) or not cells[0].isdigit():
            break
        out[int(cells[0])] = {
            k: tuple(_number(v) for v in c.split(" / ")) for k, c in zip(ITEMS, cells[2:], strict=True)
        }
    return out


def _number(text: str) -> float:
    text = text.strip()
    for unit, scale in ((" MiB", 2**20), (" B", 1), (" ms", 1e-3), ("%", 1e-2)):
        if text.endswith(unit):
            return float(text.removesuffix(unit).replace(",", "")) * scale
    return float("nan")  # –: not predicted without a device profile


def test_one_process_checkpoint_resumes_under_pp2_gpipe_and_reports_prediction_beside_measurement(
    cli, tmp_path: Path
) -> None:
    """A single-process .safetensors (with its Adam sidecar) resumed at pp=2: each stage takes its share and
    ends where one process ends, gathered into one .safetensors and sidecar again; --report's per-rank
    weights, gradients and Adam moments are the analyzer's to the byte, its activations within 10%."""
    common = _common(tmp_path)
    first = tmp_path / "a.safetensors"
    code, _, err = cli("train", "gpt2", *GPT, *common, "--steps", "2", "--device", "cpu", "-o", first)
    assert code == 0, err
    code, _, err = cli("train", "--resume", tmp_path / "a.safetensors", "--steps", "4", "--device", "cpu",
                       "-o", tmp_path / "b.safetensors")  # fmt: skip
    assert code == 0, err
    run = torchrun(2, "train", "--resume", tmp_path / "a.safetensors", "--steps", "4", "--parallel", "pp=2",
                   "--pipeline-schedule", "gpipe", "--report", "-o", tmp_path / "pp.safetensors")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("pp")) == [
        "pp.optim.safetensors",
        "pp.safetensors",
    ]  # gathered through a temporary folder, which is gone
    a = C.load(tmp_path / "b.safetensors", with_optimizer=True)
    b = C.load(tmp_path / "pp.safetensors", with_optimizer=True)
    assert _diff(a.weights, b.weights) < 1e-5 and _diff(a.optimizer, b.optimizer) < 1e-5
    report = _report(run.stdout)
    assert sorted(report) == [0, 1], run.stdout[-3000:]
    for rank, items in report.items():
        for item in ("weights", "gradients", "optimizer_states"):
            predicted, measured = items[item]
            assert predicted == measured > 0, (rank, item)
        predicted, measured = items["activations"]
        assert measured == pytest.approx(predicted, rel=0.10), rank
        assert items["peak"][1] >= sum(items[k][1] for k in ("weights", "gradients", "optimizer_states"))
        assert items["bubble"][0] == pytest.approx(1 / 3, abs=1e-3)  # (pp - 1) / (M + pp - 1), M = 2
        assert 0 <= items["bubble"][1] < 1 and items["step_time"][1] > 0
    # the two stages hold different shares: the embedding and 2 blocks, 2 blocks, the norm and the table's copy
    assert report[0]["weights"][1] != report[1]["weights"][1]


def test_impossible_pipelines_exit_2_before_any_work(cli, write_spec, tmp_path: Path) -> None:
    common = [*_common(tmp_path), "--steps", "2"]
    out = tmp_path / "ck"
    for extra, message in [
        (["--parallel", "pp=8"], "4 blocks cannot fill pp=8 pipeline stages"),
        (["--parallel", "pp=2", "--pipeline-schedule", "interleaved-1f1b", "--virtual-stages", "3"],
         "4 blocks cannot fill pp=2 × 3 virtual stages"),
        (["--parallel", "pp=2", "--pipeline-schedule", "1f1b", "--virtual-stages", "2"], "1f1b runs one chunk"),
        (["--parallel", "pp=2", "--micro-batch", "3"], "--micro-batch 3 does not divide the 4 sequences"),
        (["--parallel", "pp=2", "--pipeline-schedule", "dualpipe"], "--pipeline-schedule dualpipe is unknown"),
        (["--parallel", "dp=2", "--pipeline-schedule", "gpipe"], "--pipeline-schedule sets up pipeline stages"),
        (["--micro-batch", "2"], "--micro-batch sets up pipeline stages"),
        (["--parallel", "pp=2", "--global-batch", "8"], "--batch 4 and --global-batch 8 disagree"),
        (["--parallel", "pp=2"], "needs 2 processes; torchrun is not running this process"),
        (["--parallel", "pp=2,tp=3"], "cannot be split over tp=3: blocks.0.attn.core: heads 4 is not divisible"),
        (["--report"], "--report compares a parallel run with its prediction: it needs --parallel"),
        (["--parallel", "pp=2", "--device-profile", "h100"], "--device-profile prices the --report's step time"),
    ]:  # fmt: skip
        code, _, err = cli("train", "gpt2", *GPT, *common, *extra, "-o", out)
        assert code == 2 and message in err and "Traceback" not in err, (extra, err)
        assert len(err.strip().splitlines()) <= 2, err  # the line and its hint
    spec = write_spec("name: s2s\nkind: encoder_decoder\nvocab_size: 13\ncontext: 16\nd_model: 32\nblocks: 2\n"
                      "attention: {heads: 2}\nmlp: {type: classic, hidden: 64}\n")  # fmt: skip
    code, _, err = cli("train", spec, "--task", "reverse", "--steps", "2", "--parallel", "pp=2", "-o", out)
    assert code == 2 and "pipeline parallelism runs decoder LMs" in err, err
    both = torchrun(2, "train", "gpt2", *GPT, *common, "--parallel", "pp=4", "-o", out)  # printed once
    assert both.returncode != 0 and both.stderr.count("4 blocks cannot fill pp=4") == 0
    assert both.stderr.count("needs 4 processes; 2 processes run") == 1, both.stderr[-2000:]
    assert not out.exists()


def test_llama_style_tp2_report_activations_are_the_prediction_within_10_percent(cli, tmp_path: Path) -> None:
    """RMSNorm, SwiGLU, GQA and RoPE under tp=2: --report prices what torch's eager ops keep on the CPU
    (``kernels`` ``torch-cpu``) and the logits gathered on each rank; the saved bytes measured on every rank
    (DTensor ops' results included) meet it within 10%, the weights and Adam moments to the byte."""
    sets = ["blocks=2", "d_model=32", "attention.heads=4", "attention.kv_heads=2", "context=16", "mlp.hidden=64"]
    llama = [x for s in [*sets, "dtype=fp32"] for x in ("--set", s)]
    text = tmp_path / "text.txt"  # 28 symbols: the embedding and head rows halve over tp as the analyzer splits them
    text.write_text(" ".join(["pack my box with five dozen liquor jugs."] * 10), encoding="utf-8")
    common = ["--task", "lm", "--text", text, "--batch", "4", "--max-len", "12", "--eval-size", "4"]
    run = torchrun(2, "train", "llama3.1-8b", *llama, *common, "--steps", "2", "--parallel", "tp=2",
                   "--report", "-o", tmp_path / "tp")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = _report(run.stdout)
    assert sorted(report) == [0, 1], run.stdout[-3000:]
    for rank, items in report.items():
        for item in ("weights", "optimizer_states"):  # gradients: one 14-row table shard more measured (open)
            predicted, measured = items[item]
            assert predicted == measured > 0, (rank, item)
        predicted, measured = items["activations"]
        assert measured == pytest.approx(predicted, rel=0.10), rank
