"""Peak memory of one forward of a one-block GPT-2-shaped model at length N, fused SDPA vs the explicit math
path, each in a fresh process (``python bench/attention_memory.py N IMPL THREADS``) as the growth of its peak
RSS: O(N) vs O(N²). Used by bench/bench_torch.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import specc
from specc.backends.torch.memory import available_bytes


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def attention_memory_child(n: int, impl: str) -> None:
    """(In a fresh process.) Peak RSS growth of one forward of a one-block GPT-2-shaped model at length n."""
    spec = specc.load_spec("gpt2", ["blocks=1", f"context={n}", "vocab_size=256"])
    model = specc.build_torch(spec)
    model.attention_impl = impl
    ids = torch.randint(0, 256, (1, n))
    with torch.inference_mode():
        model(ids[:, :64])  # load kernels before the baseline
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak (VmHWM) to the current RSS, so only this forward's growth counts
        before = _rss_kib("VmRSS:")
        start = time.perf_counter()
        model(ids)
        seconds = time.perf_counter() - start
        peak = _rss_kib("VmHWM:")
    print(json.dumps({"peak_bytes": (peak - before) * 1024, "seconds": seconds}))


def attention_memory(n: int, impl: str) -> dict[str, float] | str:
    heads = 12
    scores = heads * n * n * 4  # one fp32 H·N² matrix; the math path holds about three at once
    if impl == "math" and 3 * scores > 0.6 * available_bytes(torch.device("cpu")):
        return f"not run: its {heads}·N² fp32 score matrices need ~{3 * scores / 2**30:.0f} GiB"
    cmd = [
        sys.executable,
        __file__,
        str(n),
        impl,
        str(torch.get_num_threads()),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        return f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[3]))
    attention_memory_child(int(sys.argv[1]), sys.argv[2])
