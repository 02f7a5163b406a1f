"""bench/gpu_onnx.py's logic (export, profiler-based attention check, logits check, IOBinding forward and
on-device KV-cache decode) runs on the CPU EP with a toy model, so the GPU check is ready for a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_onnx_cpu_dry_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_onnx.py"), "--cpu-dry-run", "--iters", "1", "--out", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {line.split("|")[1].strip(): line for line in run.stdout.splitlines() if line.startswith(("| fp", "| bf"))}
    assert set(rows) == {"fp16_standard", "fp16_contrib", "bf16_standard", "bf16_contrib"}
    assert "yes: 2 Attention node(s) on CPUExecutionProvider" in rows["fp16_standard"]
    assert "yes: 2 MultiHeadAttention node(s) on CPUExecutionProvider" in rows["fp16_contrib"]
    assert "FAIL" not in run.stdout
    assert "skipped in the CPU dry run" in rows["bf16_standard"]
    assert list(tmp_path.glob("fp16_standard*.json")), "no profiler trace written"
