"""Checkpoints are replaced whole: a folder is written beside its target and swapped in by rename, so a signal at
any stage of the write leaves the previous folder complete (and nothing of the new one), a signal after the swap
does not fail the run, no shard of a larger layout survives a rewrite, the weights + optimizer pair never mixes
two writes, and an output that cannot be written is refused before the first training step.

Each signal is sent by the process to itself at a named stage (a wrapper around the step that ends it), so the
stage is exact, never a matter of timing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from specc.train import training_checkpoint as C

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "blocks=1", "--set", "d_model=32", "--set", "attention.heads=4", "--set", "attention.kv_heads=2"]
TINY += ["--set", "mlp.hidden=48", "--set", "dtype=fp32"]

# The child starts with an interactive shell's dispositions (a test run under nohup inherits ignored signals),
# wraps the step named by argv[1] so that the process sends itself signal argv[2] right after it, and runs specc.
CHILD = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from specc.cli import run
from specc.parallel import sharded_checkpoint, shards
import specc.io.atomic as atomic
stage, sig = sys.argv[1], int(sys.argv[2])
rank = os.environ.get("RANK", "0")

def after(owner, name, when=lambda *a, **k: True):
    real = getattr(owner, name)
    def wrapped(*a, **k):
        out = real(*a, **k)
        if when(*a, **k):
            os.kill(os.getpid(), sig)
        return out
    setattr(owner, name, wrapped)

if stage == "shard":  # a rank's shard file is written, the others may not be
    after(shards.ShardWriter, "write_data")
elif stage == "index":  # every shard and specc.json in the temporary folder, not yet swapped in
    after(sharded_checkpoint, "write_meta")
elif stage == "swapped":  # the new folder is in place
    after(sharded_checkpoint, "replace_folder")
elif stage == "sidecar":  # the pair: the optimizer sidecar renamed over the old one, the weights not yet
    after(atomic.os, "replace", lambda src, dst: str(dst).endswith(".optim.safetensors"))
elif stage == "renamed":  # an output renamed into place in the working folder (not a temp, not specc's cache)
    def output(src, dst):
        dst = os.path.abspath(str(dst))
        return os.path.dirname(dst) == os.getcwd() and not os.path.basename(dst).startswith(".")
    after(atomic.os, "replace", output)
sys.exit(run(sys.argv[3:]))
"""


@pytest.fixture(autouse=True)
def _plain_kernels(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECC_KERNELS", "torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "SPECC_KERNELS": "torch", "OMP_NUM_THREADS": "1"}


def _text(tmp_path: Path) -> Path:
    text = tmp_path / "text.txt"
    text.write_text("pack my box with five dozen liquor jugs " * 4, encoding="utf-8")
    return text


def _train_args(text: Path, steps: int, *more: object) -> list[str]:
    args = ["train", "llama2-7b", *TINY, "--task", "lm", "--text", text, "--batch", "2", "--max-len", "8"]
    return [str(a) for a in [*args, "--eval-size", "2", "--steps", steps, "--device", "cpu", *more]]


def _child(
    stage: str, sig: int, args: list[str], cwd: Path, cache: Path | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", CHILD, stage, str(int(sig)), *args]
    env = _env() if cache is None else {**_env(), "SPECC_CACHE": str(cache)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False)


def _temps(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("."))


def _step(folder: Path) -> int:
    from specc.parallel import sharded_checkpoint as distributed

    return distributed.load(folder).step


STAGES = [
    ("shard", signal.SIGINT, 130),
    ("shard", signal.SIGTERM, 128 + signal.SIGTERM),
    ("shard", signal.SIGKILL, -signal.SIGKILL),
    ("index", signal.SIGTERM, 128 + signal.SIGTERM),
    ("index", signal.SIGKILL, -signal.SIGKILL),
    ("swapped", signal.SIGINT, 0),  # complete: the signal no longer fails the command
    ("swapped", signal.SIGTERM, 0),
]


@pytest.mark.parametrize(("stage", "sig", "code"), STAGES, ids=[f"{s}-{g.name}" for s, g, _ in STAGES])
def test_a_signal_at_each_stage_of_a_folder_write(cli, tmp_path: Path, stage: str, sig: int, code: int) -> None:
    from specc.io import STALE_AFTER_S, clean_stale

    text, folder = _text(tmp_path), tmp_path / "ck"
    done = cli(*_train_args(text, 1, "--parallel", "dp=1", "-o", folder))
    assert done[0] == 0, done[2]
    run = _child(stage, sig, _train_args(text, 2, "--parallel", "dp=1", "-o", folder), tmp_path)
    assert run.returncode == code, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    if code == 0:
        assert _step(folder) == 2 and "wrote " in run.stdout
        assert _temps(tmp_path) == []
        return
    assert _step(folder) == 1  # the previous folder, whole
    assert sorted(p.name for p in folder.iterdir()) == ["shard-00000.safetensors", "specc.json"]
    left = _temps(tmp_path)
    if sig != signal.SIGKILL:
        assert left == []
        return
    assert len(left) == 1 and left[0].name.startswith(".ck.specc-")  # the killed run's temporary folder
    with pytest.raises(ProcessLookupError):
        os.kill(int(left[0].name.split(".specc-")[1].split("-")[0]), 0)
    old = time.time() - 2 * STALE_AFTER_S
    for p in [left[0], *left[0].iterdir()]:
        os.utime(p, (old, old))
    assert clean_stale(tmp_path) == left  # its process is gone: the next write's cleaner removes it


def test_the_weights_and_optimizer_pair_is_never_half_replaced(cli, tmp_path: Path) -> None:
    """A signal right after the sidecar's rename is held until the checkpoint is renamed too: a mid-run save
    ends the run (130) with both halves new, the final save completes (0); a sidecar from another write with
    the same step is refused by its hash."""
    text, out = _text(tmp_path), tmp_path / "out.safetensors"
    assert cli(*_train_args(text, 1, "--seed", "0", "-o", out))[0] == 0
    before = C.load(out).weights
    mid_run = _train_args(text, 2, "--seed", "5", "--save-every", "1", "-o", out)
    run = _child("sidecar", signal.SIGINT, mid_run, tmp_path)
    assert run.returncode == 130, run.stderr[-3000:]
    mid = C.load(out, with_optimizer=True)  # checks the sidecar's hash against the one the checkpoint records
    assert mid.step == 1 and mid.optimizer is not None
    assert any(not torch.equal(before[k], mid.weights[k]) for k in before)  # the new weights came with it
    run = _child("sidecar", signal.SIGINT, _train_args(text, 2, "--seed", "5", "-o", out), tmp_path)
    assert run.returncode == 0 and "wrote " in run.stdout, run.stderr[-3000:]
    assert C.load(out, with_optimizer=True).step == 2 and _temps(tmp_path) == []
    other = tmp_path / "other.safetensors"  # same step, another seed: its sidecar does not belong to out
    assert cli(*_train_args(text, 2, "--seed", "7", "-o", other))[0] == 0
    C.optimizer_path(out).write_bytes(C.optimizer_path(other).read_bytes())
    code, _, err = cli("train", "--resume", out, "--steps", "3", "-o", tmp_path / "r.safetensors")
    assert code == 2 and "not written with this checkpoint" in err and "Traceback" not in err, err


def test_unwritable_outputs_are_refused_before_training(cli, tmp_path: Path) -> None:
    text = _text(tmp_path)
    afile = tmp_path / "file"
    afile.write_text("mine")
    for output, parallel, needle in [
        ("/proc/x", True, "cannot write in /proc"),
        ("/proc/x.safetensors", False, "cannot write in /proc"),
        (tmp_path / "missing" / "ck", True, "does not exist"),
        (afile, True, "not a specc distributed checkpoint folder"),
    ]:
        more = ["--parallel", "dp=1"] if parallel else []
        code, out, err = cli(*_train_args(text, 2, *more, "-o", output))
        assert code == 2 and needle in err and "Traceback" not in err, (output, err)
        assert "step" not in out and "parameters" not in out, out  # nothing trained
    assert afile.read_text() == "mine"


def test_a_checkpoint_in_a_folder_that_cannot_be_written_is_refused_before_training(cli, tmp_path: Path) -> None:
    """An existing checkpoint folder whose parent cannot take the temporary folder (immutable here, which stops
    root too; a read-only mount alike): refused before the first step, the old folder untouched."""
    text, parent = _text(tmp_path), tmp_path / "locked"
    parent.mkdir()
    assert cli(*_train_args(text, 1, "--parallel", "dp=1", "-o", parent / "ck"))[0] == 0
    if subprocess.run(["chattr", "+i", str(parent)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        code, out, err = cli(*_train_args(text, 2, "--parallel", "dp=1", "-o", parent / "ck"))
        assert code == 2 and f"cannot write in {parent}" in err and "Traceback" not in err, err
        assert "parameters" not in out
        code, out, err = cli(*_train_args(text, 2, "-o", parent / "x.safetensors"))
        assert code == 2 and f"cannot write in {parent}" in err, err
    finally:
        subprocess.run(["chattr", "-i", str(parent)], check=False)
    assert _step(parent / "ck") == 1 and _temps(parent) == []


# ---------------------------------------------------------------------------------------------- torchrun


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(n: int, args: list[str], cwd: Path, stage: str | None = None) -> subprocess.CompletedProcess[str]:
    """``specc ARGS`` on ``n`` ranks; with a ``stage``, every rank sends itself SIGINT there (the CHILD)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port", str(_port())]
    if stage is None:
        cmd = [*launch, "-m", "specc", *args]
    else:
        script = cwd / "child.py"
        script.write_text(CHILD)
        cmd = [*launch, str(script), stage, str(int(signal.SIGINT)), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=cwd, timeout=600, check=False)


def test_torchrun_writes_whole_folders_and_reads_damaged_ones_as_one_line(cli, tmp_path: Path) -> None:
    """Under torchrun (2 ranks): Ctrl-C while the ranks write their shards leaves the previous folder whole, no
    temporary folder and no traceback; a dp=2 folder rewritten at dp=1 keeps no shard of the second rank; a
    folder missing a rank's shard is refused with one line, printed once."""
    text, folder = _text(tmp_path), tmp_path / "ck"
    assert cli(*_train_args(text, 1, "--parallel", "dp=1", "-o", folder))[0] == 0
    args = _train_args(text, 2, "--parallel", "dp=2", "-o", folder)
    args.remove("--device"), args.remove("cpu")
    run = _torchrun(2, args, tmp_path, stage="shard")
    assert run.returncode != 0
    assert "KeyboardInterrupt" not in run.stderr and "[rank0]" not in run.stderr, run.stderr[-3000:]
    assert _step(folder) == 1 and _temps(tmp_path) == []
    run = _torchrun(2, args, tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["shard-00000.safetensors", "shard-00001.safetensors", "specc.json"] and _step(folder) == 2
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in names:
        (broken / name).write_bytes((folder / name).read_bytes())
    (broken / "shard-00001.safetensors").unlink()
    resume = ["train", "--resume", str(broken), "--steps", "3", "--parallel", "dp=2", "-o", str(tmp_path / "k2")]
    run = _torchrun(2, resume, tmp_path)
    assert run.returncode != 0 and run.stderr.count("shard-00001.safetensors: error: ") == 1, run.stderr[-3000:]
    code, _, err = cli("generate", broken, "-p", "1 2", "-n", "2")
    assert code == 2 and "shard-00001.safetensors" in err and "Traceback" not in err, err
    code, _, err = cli(*_train_args(text, 3, "--parallel", "dp=1", "-o", folder))  # dp=1 over the dp=2 folder
    assert code == 0, err
    assert sorted(p.name for p in folder.iterdir()) == ["shard-00000.safetensors", "specc.json"]
    assert _step(folder) == 3 and _temps(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(("target", "name"), [("torch", "m.safetensors"), ("python", "model.py"), ("onnx", "m.onnx")])
def test_a_signal_once_compile_renamed_its_output_does_not_fail_it(tmp_path: Path, target: str, name: str,
                                                                    sig: int) -> None:  # fmt: skip
    """compile's output is its last: a signal that lands as it is renamed into place is discarded (exit 0, the
    file whole), where before the command exited 130 / 143 over a complete output."""
    args = ["compile", "gpt2", *TINY, "--set", "vocab_size=64", "--set", "context=16", "--target", target, "-o", name]
    run = _child("renamed", sig, args, tmp_path, cache=tmp_path / "cache")  # a cold cache renames entries too
    assert run.returncode == 0, run.stderr
    assert (tmp_path / name).stat().st_size > 0 and not _temps(tmp_path)
    assert (tmp_path / "cache" / "generated").is_dir() or target != "torch"  # its cache renames were not signalled
