"""Temporary files and staging folders are removed when a write is interrupted by SIGTERM, SIGHUP or SIGINT,
and nothing is replaced: each case kills a real process in the middle of its write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each child starts with the dispositions of an interactive shell (a test run under nohup or as a background job
# inherits ignored signals), and its writer is slowed down once the staged file exists, so the signal lands
# mid-write.
RESET = """
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
"""
SLOW_ATOMIC = (
    RESET
    + """
import sys, time
from specc.io import atomic_write
def slow(tmp):
    tmp.write_bytes(b"half")
    print("writing", flush=True)
    time.sleep(60)
atomic_write(sys.argv[1], slow)
"""
)

SLOW_EXPORT = (
    RESET
    + """
import sys, time
from specc.cli import run
import specc.backends.onnx.stream as stream
real = stream.run  # streams the weights into the staged files
def slow(*a, **k):
    real(*a, **k)
    print("writing", flush=True)
    time.sleep(60)
stream.run = slow
sys.exit(run(["compile", "gpt2", "--set", "blocks=1", "--set", "d_model=16", "--set", "attention.heads=2",
              "--set", "vocab_size=50", "--set", "context=16", "--set", "mlp.hidden=32",
              "--target", "onnx", "-o", sys.argv[1]]))
"""
)


def _interrupt(code: str, target: Path, sig: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=target.parent)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the staged file is being written
        assert line.strip() == "writing", proc.stderr.read() if proc.stderr else ""
        staged = [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]
        assert staged, "the write should be staged beside the target"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["TERM", "HUP", "INT"])
def test_a_signal_mid_write_removes_the_temporary_file(tmp_path: Path, sig: int) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"previous")
    done = _interrupt(SLOW_ATOMIC, target, sig)
    # SIGTERM/SIGHUP: SystemExit(128 + signal); SIGINT: an uncaught KeyboardInterrupt, which Python ≥ 3.8
    # reports by dying of SIGINT itself (-2) after unwinding
    expected = {128 + sig} if sig != signal.SIGINT else {-signal.SIGINT, 1}
    assert done.returncode in expected, done.stderr
    assert _left(tmp_path) == [] and target.read_bytes() == b"previous"


def test_sigterm_during_an_onnx_export_removes_its_staging_folder(tmp_path: Path) -> None:
    target = tmp_path / "m.onnx"
    start = time.monotonic()
    done = _interrupt(SLOW_EXPORT, target, signal.SIGTERM)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "Traceback" not in done.stderr
    assert _left(tmp_path) == [] and not target.exists()
    assert time.monotonic() - start < 60


def test_sigint_during_an_onnx_export_exits_130_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "m.onnx"
    done = _interrupt(SLOW_EXPORT, target, signal.SIGINT)
    assert done.returncode == 130, done.stderr
    assert _left(tmp_path) == [] and not target.exists()
