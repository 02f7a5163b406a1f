"""`specc analyze` and `specc compare`: formats, sweeps, plots, devices, errors."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from specc.analysis.sweep import parse_sweep
from specc.errors import SpecError

Cli = Callable[..., tuple[int, str, str]]
SMALL = ["--set", "blocks=2"]


def test_json_keys(cli: Cli) -> None:
    code, out, _ = cli("analyze", "gpt2", "--seq", "128", "-f", "json", *SMALL)
    assert code == 0
    d = json.loads(out)
    for key in ("total", "active"):
        assert isinstance(d["params"][key], int)
    fwd = d["flops"]["forward"]
    assert isinstance(fwd["total"], int) and isinstance(fwd["matmul"], int)
    assert set(fwd["by_category"]) >= {"qkv_proj", "qk", "av", "out_proj", "mlp", "norm", "softmax", "lm_head"}
    assert fwd["matmul"] > d["flops"]["causal_useful"]["matmul"]
    assert {"weights", "activations", "kv_cache", "attention_scores_materialized"} <= set(d["memory"])
    assert "flop" in d["conventions"] and "non_matmul" in d["conventions"]


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv"])
def test_other_formats(cli: Cli, fmt: str) -> None:
    code, out, _ = cli("analyze", "transformer-base", "--seq", "64", "-f", fmt, *SMALL)
    assert code == 0
    if fmt == "csv":
        rows = dict(csv.reader(io.StringIO(out)))
        assert int(rows["flops.forward.by_category.cross_qk"]) > 0
    else:
        assert "[N,D]×[D,3HD_H]→[N,3HD_H]" in out and "cross_qk" in out and "Conventions" in out


def test_training_and_dtype(cli: Cli) -> None:
    code, out, _ = cli("analyze", "gpt2", "--training", "--dtype", "bf16", "-f", "json", *SMALL)
    d = json.loads(out)
    assert code == 0 and d["settings"]["dtype"] == "bf16"
    assert d["memory"]["optimizer_states"] == 12 * d["params"]["total"]


def test_device_roofline(cli: Cli, tmp_path: Path) -> None:
    code, out, _ = cli("analyze", "gpt2", "--device", "h200", *SMALL)
    assert code == 0 and "Roofline on H200" in out and "tokens/s" in out
    profile = tmp_path / "dev.yaml"
    profile.write_text("peak_flops: {fp32: 1 TFLOP/s}\nbandwidth: 100 GB/s\nmemory: 1 GB\n")
    code, out, _ = cli("analyze", "gpt2", "--device", str(profile), "-f", "json", *SMALL)
    assert code == 0 and json.loads(out)["roofline"]["device"]["name"] == "dev"


def test_sweep_and_plot(cli: Cli, tmp_path: Path) -> None:
    png = tmp_path / "cost.png"
    code, out, err = cli("analyze", "gpt2", "--sweep", "seq=256,512,...,4096", "--plot", str(png), "-f", "csv", *SMALL)
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(out)))
    assert [int(r[0]) for r in rows[1:]] == [256, 512, 1024, 2048, 4096]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, no leftovers


def test_compare(cli: Cli) -> None:
    code, out, _ = cli("compare", "gpt2", "gpt2@mlp.type=swiglu@mlp.hidden=2048", "-f", "json", *SMALL)
    assert code == 0
    a, b = json.loads(out)["reports"]
    assert b["spec"]["name"] == "gpt2@mlp.type=swiglu@mlp.hidden=2048"
    assert a["params"]["total"] != b["params"]["total"]
    code, out, _ = cli("compare", "gru-bahdanau", "gpt2@blocks=2", "--sweep", "seq=64,128,256")
    assert code == 0 and "gru-bahdanau" in out and "KV cache" in out


def test_output_file(cli: Cli, tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    code, out, _ = cli("analyze", "vit-b16", "-f", "markdown", "-o", str(target), *SMALL)
    assert code == 0 and out == ""
    assert target.read_text().startswith("# vit-b16")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "len=1,2"], "bad sweep"),
        (["--sweep", "seq=512,...,4096"], "'...' needs two values"),
        (["--device", "tpu9"], "no device named 'tpu9'"),
    ],
)
def test_user_errors_exit_2(cli: Cli, args: list[str], message: str) -> None:
    code, _, err = cli("analyze", "gpt2", *args, *SMALL)
    assert code == 2 and message in err


def test_parse_sweep() -> None:
    assert parse_sweep("seq=512,1024,...,131072")[1][-3:] == [32768, 65536, 131072]
    assert parse_sweep("batch=1,3,...,9") == ("batch", [1, 3, 9])  # geometric when the end is on it
    assert parse_sweep("batch=2,4,...,10") == ("batch", [2, 4, 6, 8, 10])
    assert parse_sweep("seq=100,200,...,450")[1] == [100, 200, 400, 450]  # neither fits: doubling, then the end
    with pytest.raises(SpecError):
        parse_sweep("seq=0,1")


def test_compare_shows_mla_kv_cache_per_token(cli: Cli) -> None:
    """DeepSeek-V3 keeps (512 + 64) bf16 values per token and layer (61 layers); Llama 3.1 8B 2 · 8 · 128 (32)."""
    code, out, _ = cli("compare", "deepseek-v3", "llama3.1-8b", "--seq", "32768")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("kv_cache per token"))
    assert row.split()[-4:] == ["70.27", "kB", "131.1", "kB"]  # 61·576·2 B and 32·2·8·128·2 B
