"""Bounds on every numeric option (one located line, exit 2, before any work), the memory check honouring
RLIMIT_AS and cgroup limits, and the CLI's own error wording (usage errors, long arguments, onnxruntime logs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specc.backends.torch import memory
from specc.cli import limits

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "blocks=1", "--set", "d_model=16", "--set", "attention.heads=2", "--set", "vocab_size=50",
        "--set", "context=16", "--set", "mlp.hidden=32"]  # fmt: skip
ROTARY = [*TINY, "--set", "position=rotary"]
MAX_THREADS = 4 * (os.cpu_count() or 1)


def one_line_error(result: tuple[int, str, str], *needles: str) -> str:
    code, out, err = result
    assert code == 2, (out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("  hint:")]
    assert len(lines) == 1 and "error:" in lines[0], err
    assert all(n in lines[0] for n in needles), err
    return lines[0]


TRAIN = ["train", "gpt2", *TINY, "--task", "copy", "--steps", "2", "-o", "never.safetensors"]
RUN = ["run", "never.onnx"]  # bounds are checked before the model is opened

CASES = [
    # (arguments, option named, allowed range shown)
    (["generate", "gpt2", *TINY, "-p", "1 2", "-n", "100000000"], "--max-new-tokens 100000000", "1..65536"),
    (["generate", "gpt2", *ROTARY, "-p", "1 2", "-n", "1000"], "--max-new-tokens 1000", "1..16: the model's context"),
    (["generate", "gpt2", *TINY, "-p", "1 2", "-n", "0"], "--max-new-tokens 0", "1..65536"),
    (["generate", "gpt2", *TINY, "-p", "1", "--temperature", "1e-300"], "--temperature 1e-300", "0 for greedy"),
    (["generate", "gpt2", *TINY, "-p", "1", "--temperature", "nan"], "--temperature nan", "0 for greedy"),
    (["generate", "gpt2", *TINY, "-p", "1", "--temperature", "1", "--seed", str(10**23)], "--seed", "..9223372036"),
    (["generate", "gpt2", *TINY, "-p", "1", "--top-p", "1.5"], "--top-p 1.5", "0..1"),
    (["generate", "gpt2", *TINY, "-p", "1", "--top-k", "0"], "--top-k 0", "1.."),
    ([*TRAIN, "--max-len", "1000000"], "--max-len 1000000", f"1..{limits.MAX_TRAIN_LEN}"),
    ([*TRAIN, "--threads", "100000"], "--threads 100000", f"1..{MAX_THREADS}: 4 × {os.cpu_count()} cores"),
    ([*TRAIN, "--threads", "0"], "--threads 0", f"1..{MAX_THREADS}"),
    ([*TRAIN, "--eval-size", "100000000"], "--eval-size 100000000", f"1..{limits.MAX_EVAL_SIZE}"),
    ([*TRAIN, "--batch", "0"], "--batch 0", "1.."),
    ([*TRAIN, "--lr", "inf"], "--lr inf", "..10"),
    ([*TRAIN, "--seed", "-1"], "--seed -1", "0.."),
    ([*TRAIN, "--min-len", "0"], "--min-len 0", "1.."),
    ([*TRAIN, "--warmup", "-5"], "--warmup -5", "0.."),
    ([*TRAIN, "--eval-every", "0"], "--eval-every 0", "1.."),
    ([*TRAIN, "--save-every", "-1"], "--save-every -1", "0.."),
    (["train", "gpt2", *TINY, "--task", "copy", "--steps", "100000000000", "-o", "x"], "--steps", "1..10000000"),
    ([*RUN, "--threads", "5000"], "--threads 5000", f"1..{MAX_THREADS}"),
    ([*RUN, "--bench", "--iters", "100000000"], "--iters 100000000", f"1..{limits.MAX_ITERS}"),
    ([*RUN, "--bench", "--warmup", "100000000"], "--warmup 100000000", f"0..{limits.MAX_WARMUP}"),
    ([*RUN, "--generate", "10000000"], "--generate 10000000", f"1..{limits.MAX_NEW_TOKENS}"),
    ([*RUN, "--top-k", "0"], "--top-k 0", "1.."),
    ([*RUN, "--random", "1," * 5000], "--random is 10,000 characters long", "at most 2,000"),
    (["analyze", "gpt2", "--batch", "0"], "--batch 0", "1..4294967296"),
    (["analyze", "gpt2", "--seq", str(10**12)], "--seq 1000000000000", "1..4294967296"),
    (["compare", "gpt2", "gpt2-medium", "--kv-len", "0"], "--kv-len 0", "1.."),
]


@pytest.mark.parametrize(("args", "option", "allowed"), CASES, ids=[c[1] for c in CASES])
def test_out_of_range_values_exit_2_naming_option_and_range(cli, tmp_path, monkeypatch, args, option, allowed) -> None:
    monkeypatch.chdir(tmp_path)
    line = one_line_error(cli(*args), option, allowed)
    assert "out of range" in line or "characters long" in line
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_in_range_values_still_work(cli, tmp_path: Path) -> None:
    code, out, err = cli("generate", "gpt2", *ROTARY, "-p", "1 2", "-n", "16", "--temperature", "0.5", "--seed", "3")
    assert code == 0, err
    assert len(out.split()) == 18


def test_learned_positions_keep_their_own_message(cli) -> None:
    code, _, err = cli("generate", "gpt2", *TINY, "-p", "1 2 3", "-n", "15")
    assert code == 2 and "learned positions" in err


def test_bad_option_values_are_one_line(cli) -> None:
    line = one_line_error(cli("train", "gpt2", "--threads", "abc"), "--threads", "valid integer")
    assert line.startswith("error: Invalid value")
    one_line_error(cli("analyze", "gpt2", "--no-such-flag"), "No such option")
    one_line_error(cli("generate", "gpt2"), "Missing option")


def test_a_huge_sweep_argument_is_not_echoed(cli) -> None:
    huge = "seq=" + "1," * 50_000
    code, _, err = cli("analyze", "gpt2", "--sweep", huge)
    assert code == 2 and len(err) < 300 and "--sweep is 100,004 characters long" in err
    code, _, err = cli("analyze", "gpt2", "--sweep", "seq=" + "x" * 1500)  # under the cap: parsed, error cut
    assert code == 2 and len(err) < 600, err


def test_long_messages_are_cut(cli) -> None:
    code, _, err = cli("graph", "gpt2", "--set", "x" * 100_000 + "=1")
    assert code == 2 and "Traceback" not in err
    assert all(len(line) < 500 for line in err.splitlines()) and "characters, cut" in err


def test_set_extends_is_an_error_not_ignored(cli) -> None:
    one_line_error(cli("graph", "gpt2", "--set", "extends=gpt2-medium"), "--set extends=... cannot change")
    one_line_error(cli("compare", "gpt2", "gpt2@extends=llama2-7b"), "--set extends=...")


def test_generate_checkpoint_with_weights_uses_those_weights(cli, tmp_path: Path) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert cli("compile", "gpt2", *TINY, "-o", a)[0] == 0
    with safe_open(str(a), "pt") as f:
        meta = f.metadata()
    g = torch.Generator().manual_seed(0)  # weights far from the init, so greedy tokens differ
    save_file({k: torch.randn(v.shape, generator=g) for k, v in load_file(str(a)).items()}, str(b), metadata=meta)
    gen = ["-p", "1 2 3", "-n", "8"]
    _, out_a, _ = cli("generate", a, *gen)
    _, out_b, _ = cli("generate", b, *gen)
    code, out_ab, err = cli("generate", a, "--weights", b, *gen)
    assert code == 0, err
    assert out_ab == out_b and out_ab != out_a  # W is used, not silently ignored


# ---------------------------------------------------------------------------------------------- onnxruntime


def _bad_reshape_model(path: Path, out_rank: int = 0) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "N"])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)
    if out_rank:  # a non-specc model whose logits are 4-D: [B, N, 1, 1]
        nodes = [helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
                 helper.make_node("Unsqueeze", ["f", "axes"], ["logits"])]  # fmt: skip
        init = [helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])]
    else:  # a Reshape that fails at run time, so onnxruntime logs an ERROR line before raising
        nodes = [helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
                 helper.make_node("Reshape", ["f", "s"], ["logits"])]  # fmt: skip
        init = [helper.make_tensor("s", TensorProto.INT64, [2], [7, 3])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], init), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 9
    onnx.save(model, str(path))


def _specc(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "specc", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)  # fmt: skip


def test_onnxruntime_log_lines_stay_out_of_the_way(tmp_path: Path) -> None:
    model = tmp_path / "bad.onnx"
    _bad_reshape_model(model)
    proc = _specc("run", str(model), "--input-ids", "1 2 3", "--provider", "cpu", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "\x1b[" not in proc.stderr and "[E:onnxruntime" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "error:" in proc.stderr
    loud = _specc("run", str(model), "--input-ids", "1 2 3", "--provider", "cpu", "--verbose", cwd=tmp_path)
    assert loud.returncode == 2 and "onnxruntime" in loud.stderr and len(loud.stderr.splitlines()) > 1


def test_a_foreign_model_with_4d_logits_is_summarised(cli, tmp_path: Path) -> None:
    model = tmp_path / "four.onnx"
    _bad_reshape_model(model, out_rank=4)
    code, out, err = cli("run", model, "--input-ids", "1 2 3", "--provider", "cpu")
    assert code == 0, err
    assert "logits" in out and "[1, 3, 1, 1]" in out


# ---------------------------------------------------------------------------------------------- memory


def _mountinfo(point: Path, fstype: str, root: str = "/") -> str:
    opts = "rw,memory" if fstype == "cgroup" else "rw"
    return f"30 20 0:26 {root} {point} rw,nosuid - {fstype} cgroup {opts}\n"


def test_cgroup_v2_limit_counts_every_level_and_reclaimable_cache(tmp_path: Path) -> None:
    mount = tmp_path / "cg2"
    leaf = mount / "a" / "b"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text(f"{2 << 30}\n")
    (leaf / "memory.current").write_text(f"{1 << 30}\n")
    (leaf / "memory.stat").write_text(f"anon 123\ninactive_file {512 << 20}\n")
    (mount / "a" / "memory.max").write_text("max\n")  # no limit at this level
    (tmp_path / "cgroup").write_text("0::/a/b\n")
    (tmp_path / "mountinfo").write_text(_mountinfo(mount, "cgroup2"))
    lim = memory.cgroup_headroom(tmp_path / "cgroup", tmp_path / "mountinfo")
    assert lim is not None and lim.bytes == (2 << 30) - (1 << 30) + (512 << 20)
    assert "memory.max" in lim.source
    (mount / "a" / "memory.max").write_text(f"{1 << 30}\n")  # a tighter parent wins
    (mount / "a" / "memory.current").write_text(f"{(1 << 30) - (100 << 20)}\n")
    lim = memory.cgroup_headroom(tmp_path / "cgroup", tmp_path / "mountinfo")
    assert lim is not None and lim.bytes == 100 << 20


def test_cgroup_v1_limit_and_unlimited(tmp_path: Path) -> None:
    mount = tmp_path / "memory"
    leaf = mount / "docker" / "abc"
    leaf.mkdir(parents=True)
    (leaf / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    (leaf / "memory.usage_in_bytes").write_text(f"{3 << 30}\n")
    (leaf / "memory.stat").write_text(f"cache 1\ntotal_inactive_file {1 << 30}\n")
    (mount / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # the root: unlimited
    (tmp_path / "cgroup").write_text("12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    (tmp_path / "mountinfo").write_text(_mountinfo(mount, "cgroup"))
    lim = memory.cgroup_headroom(tmp_path / "cgroup", tmp_path / "mountinfo")
    assert lim is not None and lim.bytes == 2 << 30 and "limit_in_bytes" in lim.source
    (leaf / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory.cgroup_headroom(tmp_path / "cgroup", tmp_path / "mountinfo") is None


def test_cgroup_namespace_uses_the_mount_itself(tmp_path: Path) -> None:
    """Inside a cgroup namespace the process's group is the mount's root: /proc says "/" or a path outside it."""
    mount = tmp_path / "cg2"
    mount.mkdir()
    (mount / "memory.max").write_text(f"{1 << 30}\n")
    (mount / "memory.current").write_text(f"{256 << 20}\n")
    (tmp_path / "cgroup").write_text("0::/../../elsewhere\n")
    (tmp_path / "mountinfo").write_text(_mountinfo(mount, "cgroup2", root="/kubepods/pod1"))
    lim = memory.cgroup_headroom(tmp_path / "cgroup", tmp_path / "mountinfo")
    assert lim is not None and lim.bytes == (1 << 30) - (256 << 20)


def test_the_tightest_host_limit_binds(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable:    8000000 kB\n")
    (tmp_path / "cgroup").write_text("0::/\n")
    (tmp_path / "mountinfo").write_text("")
    limits_found = memory.host_limits(tmp_path / "meminfo", "/proc/self/status", tmp_path / "cgroup",
                                      tmp_path / "mountinfo")  # fmt: skip
    assert limits_found[0].bytes == 8_000_000 * 1024 and limits_found[0].source == "MemAvailable"


RLIMITED = """
import os, resource, sys
import torch, specc.cli, specc.backends.onnx.export
status = open("/proc/self/status").read()
vm = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmSize:")) * 1024
headroom = int(os.environ["HEADROOM"])
resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.exit(specc.cli.run(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("args", "headroom", "needle"),
    [
        (["compile", "gpt2-xl", "--target", "torch", "-o", "x.safetensors"], 1 << 30, "needs 5.8 GiB"),
        # streamed, an export's peak is a fixed ~0.5 GB whatever the model (test_onnx_stream.py exports a model
        # larger than the limit): refused when even that does not fit
        (["compile", "gpt2", "--target", "onnx", "-o", "x.onnx"], 3 << 27, "at its peak"),
    ],
    ids=["build", "export"],
)
def test_rlimit_as_is_honoured(tmp_path: Path, args: list[str], headroom: int, needle: str) -> None:
    """With ``ulimit -v`` a little above what the process maps (1 GiB; 0.375 GiB), a 6 GB build and an export
    whose streamed peak is about 0.5 GB are refused before anything is allocated, naming the limit."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HEADROOM": str(headroom)}
    proc = subprocess.run([sys.executable, "-c", RLIMITED, *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "RLIMIT_AS (ulimit -v)" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.iterdir())


# A model whose parameters fit under the limit with room to spare, but not beside init's fp32 draw of its largest
# parameter (a 200,000-row embedding: 205 MB) and the intra-op threads' reservations.
BIG_EMBEDDING = {"extends": "gpt2", "vocab_size": 200_000, "d_model": 256, "blocks": 1, "context": 64,
                 "attention": {"heads": 4}}  # fmt: skip
HEADROOM = """
import json, resource, sys
import torch, specc, specc.cli
from specc.backends.torch import memory
from specc.backends.torch.build import as_graph
from specc.backends.torch.source import model_class
spec = json.loads(sys.argv[1])
with torch.device("meta"):
    meta = model_class(as_graph(spec))()
kept, draw = memory.param_bytes(meta), memory.init_transient(meta).transient
threads = torch.get_num_threads() * memory.THREAD_ADDRESS_SPACE
room = {"short": kept + draw // 2, "enough": kept + draw + threads + (256 << 20)}[sys.argv[2]]
status = open("/proc/self/status").read()
vm = next(int(l.split()[1]) for l in status.splitlines() if l.startswith("VmSize:")) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + room, resource.getrlimit(resource.RLIMIT_AS)[1]))
sys.exit(specc.cli.run(sys.argv[3:]))
"""


@pytest.mark.parametrize("room", ["short", "enough"])
def test_the_memory_check_counts_the_init_draw_and_the_threads(tmp_path: Path, room: str) -> None:
    """Parameters that fit beside what the process maps are not enough: init draws the largest parameter whole in
    fp32 before copying it in, and the intra-op threads reserve stacks and arenas. Short of that: refused before
    anything is allocated (this once died in the allocator with a traceback); with it: built and written."""
    import json

    spec = tmp_path / "big.json"
    spec.write_text(json.dumps(BIG_EMBEDDING))
    args = ["compile", str(spec), "--target", "torch", "-o", "x.safetensors"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", HEADROOM, json.dumps(BIG_EMBEDDING), room, *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    if room == "short":
        line = one_line_error((proc.returncode, proc.stdout, proc.stderr), "RLIMIT_AS (ulimit -v)")
        assert "for the fp32 draw of its largest parameter" in line and "of thread stacks and arenas" in line
        assert not (tmp_path / "x.safetensors").exists()
    else:
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "x.safetensors").stat().st_size > 200_000 * 256 * 4


def test_loading_counts_the_stored_tensors_beside_their_casts(tmp_path: Path) -> None:
    """fp32 weights into a bf16 model: the stored fp32 tensors and the bf16 casts are alive together."""
    import torch

    from specc.backends.torch.build import load_transient

    weights = {"a": torch.zeros(1000, 10), "b": torch.zeros(10, dtype=torch.bfloat16)}
    stored = 10_000 * 4 + 10 * 2
    # bf16 model (20,020 bytes kept): a's fp32 clone beside its bf16 cast; b is taken as it is
    assert load_transient(weights, torch.bfloat16, 10_010 * 2).transient == stored + 10_000 * 2 - 10_010 * 2
    # fp32 model (40,040 bytes kept): only b is cast
    assert load_transient(weights, torch.float32, 10_010 * 4).transient == stored + 10 * 4 - 10_010 * 4
    assert load_transient(tmp_path / "missing.safetensors", torch.float32, 0).transient == 0  # the reader names it


def test_generation_with_non_finite_weights_is_a_located_error(cli, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    ck = tmp_path / "a.safetensors"
    assert cli("compile", "gpt2", *TINY, "-o", ck)[0] == 0
    with safe_open(str(ck), "pt") as f:
        meta = f.metadata()
    tensors = load_file(str(ck))
    tensors["lm_head.weight" if "lm_head.weight" in tensors else "embed.weight"][:] = float("nan")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(ck), metadata=meta)
    code, _, err = cli("generate", ck, "-p", "1 2", "-n", "3", "--temperature", "1", "--seed", "0")
    one_line_error((code, "", err))
