"""Benchmarks of specc's PyTorch backend against Hugging Face transformers, in one run on one machine.

    python bench/bench_torch.py            # the full run (a few minutes on 2 cores)
    python bench/bench_torch.py --quick    # a smoke run (< 1 minute)

1. fp32 matmul peak of this machine (a large square matmul: torch.mm, and oneDNN's linear when available).
2. Forward latency of gpt2.yaml vs HF ``GPT2LMHeadModel(attn_implementation="sdpa")`` holding the same random
   weights (loaded through specc's HF name mapping; the logits are compared), B=1, N=512, fp32, CPU, same
   ``torch.set_num_threads``. The runs alternate, the best of each is reported, with the % of the matmul peak
   (FLOPs counted by ``FlopCounterMode`` on specc's explicit attention path: full, non-causal-halved count).
3. Greedy generation tokens/s: specc's KV-cached ``generate`` vs HF ``generate`` (same prompt, same number of
   new tokens, both timed end to end including the prompt).
4. Peak memory of a one-block GPT-2-shaped model at N = 4096 and 16384 with fused SDPA vs the explicit math
   path (each measured in a fresh process as the growth of its peak RSS): O(N) vs O(N²).
5. With CUDA: bf16 forward throughput and MFU of GPT-2-XL.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twins import gpt2_twins  # noqa: E402

import specc  # noqa: E402
from specc.backends.torch.memory import available_bytes  # noqa: E402


def machine() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
        info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        cpu = f"{info.get('Model name', platform.processor())}, {info.get('CPU(s)', os.cpu_count())} CPUs"
    except (OSError, subprocess.CalledProcessError):
        cpu = f"{platform.processor()}, {os.cpu_count()} CPUs"
    return f"{cpu}; torch {torch.__version__}, {torch.get_num_threads()} threads"


def best_of(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_peaks(n: int, reps: int) -> dict[str, float]:
    """GFLOP/s of an n×n×n fp32 matmul, best of ``reps``: torch.mm (MKL here) and oneDNN's linear (what
    specc's inference path uses when this torch has it; on AMD CPUs MKL avoids AVX-512)."""
    from specc.backends.torch.runtime import ONEDNN_LINEAR

    a, b = torch.randn(n, n), torch.randn(n, n)
    peaks = {"torch.mm": 2 * n**3 / best_of(lambda: torch.mm(a, b), reps) / 1e9}
    fast = ONEDNN_LINEAR
    if fast is not None:
        with torch.inference_mode():
            peaks["oneDNN"] = 2 * n**3 / best_of(lambda: fast(a, b, None), reps) / 1e9
    return peaks


def matmul_flops(model: torch.nn.Module, ids: torch.Tensor) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    # FlopCounterMode misses SDPA on the CPU and oneDNN's linear: count the math attention path with autograd
    # on, where every product is a plain aten matmul.
    model.attention_impl = "math"
    try:
        with torch.enable_grad(), FlopCounterMode(display=False) as counter:
            model(ids)
    finally:
        model.attention_impl = "sdpa"
    return counter.get_total_flops()


def forward(ours: torch.nn.Module, hf: torch.nn.Module, n: int, reps: int) -> dict[str, float]:
    ids = torch.randint(0, 50257, (1, n), generator=torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {"specc": [], "hf": []}
    with torch.inference_mode():
        diff = (ours(ids) - hf(ids).logits).abs().max().item()  # also the warm-up
        for _ in range(reps):  # alternate, so load from elsewhere hits both alike
            for name, fn in (("specc", lambda: ours(ids)), ("hf", lambda: hf(ids))):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    return {
        "specc_s": min(times["specc"]),
        "hf_s": min(times["hf"]),
        "specc_median_s": statistics.median(times["specc"]),
        "hf_median_s": statistics.median(times["hf"]),
        "max_abs_diff": diff,
        "flops": matmul_flops(ours, ids),
    }


def generation(ours: torch.nn.Module, hf: torch.nn.Module, prompt: int, new: int, reps: int) -> dict[str, float]:
    ids = torch.randint(0, 50257, (1, prompt), generator=torch.Generator().manual_seed(2))

    def run_ours() -> torch.Tensor:
        return ours.generate(ids, new)

    def run_hf() -> torch.Tensor:
        return hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    with torch.inference_mode():
        same = torch.equal(run_ours(), run_hf())
        t_ours, t_hf = [], []
        for _ in range(reps):
            t_ours.append(best_of(run_ours, 1))
            t_hf.append(best_of(run_hf, 1))
    return {"specc_tok_s": new / min(t_ours), "hf_tok_s": new / min(t_hf), "same_tokens": same}


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
        "--attention-memory-child",
        str(n),
        impl,
        "--threads",
        str(torch.get_num_threads()),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        return f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cuda_gpt2_xl(batch: int, n: int, reps: int) -> dict[str, float]:
    """bf16 forward throughput and MFU of GPT-2-XL on the first CUDA device."""
    dev = torch.device("cuda")
    a, b = (
        torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16),
        torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16),
    )

    def synced(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            fn()
            torch.cuda.synchronize()

        return run

    peak = 2 * 8192**3 / best_of(synced(lambda: a @ b), reps) / 1e12
    model = specc.build_torch("gpt2-xl", device=dev, dtype="bf16")
    ids = torch.randint(0, 50257, (batch, n), device=dev)
    flops = matmul_flops(model, ids[:1]) * batch
    with torch.inference_mode():
        seconds = best_of(synced(lambda: model(ids)), reps)
    return {"tokens_s": batch * n / seconds, "tflops": flops / seconds / 1e12, "peak_tflops": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions (< 1 minute)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch.set_num_threads")
    parser.add_argument("--attention-memory-child", nargs=2, metavar=("N", "IMPL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.attention_memory_child:
        attention_memory_child(int(args.attention_memory_child[0]), args.attention_memory_child[1])
        return

    quick = args.quick
    reps = 2 if quick else 7
    rows: list[tuple[str, str, str, str]] = []  # benchmark, specc, HF / reference, ratio or note

    peaks = matmul_peaks(1024 if quick else 4096, reps)
    peak = max(peaks.values())  # the % below is of the best fp32 matmul this machine showed
    rows.append(("fp32 matmul peak, n×n×n", ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items()), "", ""))

    ours, hf = gpt2_twins(specc.load_spec("gpt2", ["blocks=2"] if quick else None))
    n = 128 if quick else 512
    f = forward(ours, hf, n, reps)
    pct = f["flops"] / f["specc_s"] / 1e9 / peak * 100
    rows.append(
        (
            f"forward gpt2{' (2 blocks)' if quick else ''}, B=1, N={n}, fp32 (best; median)",
            f"{f['specc_s'] * 1e3:.1f} ms; {f['specc_median_s'] * 1e3:.1f} ms",
            f"{f['hf_s'] * 1e3:.1f} ms; {f['hf_median_s'] * 1e3:.1f} ms",
            f"{f['hf_s'] / f['specc_s']:.2f}× HF; {pct:.0f}% of the best matmul peak; "
            f"logits differ by ≤ {f['max_abs_diff']:.1e}",
        )
    )

    prompt, new = (8, 8) if quick else (32, 128)
    g = generation(ours, hf, prompt, new, 1 if quick else 3)
    rows.append(
        (
            f"greedy generate, prompt {prompt}, {new} new tokens",
            f"{g['specc_tok_s']:.1f} tok/s",
            f"{g['hf_tok_s']:.1f} tok/s",
            f"{g['specc_tok_s'] / g['hf_tok_s']:.2f}× HF; same tokens: {g['same_tokens']}",
        )
    )
    del ours, hf

    for length in (1024, 2048) if quick else (4096, 16384):
        result = {impl: attention_memory(length, impl) for impl in ("sdpa", "math")}
        cells = [
            f"{r['peak_bytes'] / 2**20:,.0f} MiB ({r['seconds']:.1f} s)" if isinstance(r, dict) else r
            for r in result.values()
        ]
        note = ""
        if all(isinstance(r, dict) for r in result.values()):
            note = f"{result['math']['peak_bytes'] / max(result['sdpa']['peak_bytes'], 1):.1f}× more on the math path"
        rows.append((f"peak memory, 1 block, N={length}: fused SDPA vs math path", cells[0], cells[1], note))

    if torch.cuda.is_available():
        c = cuda_gpt2_xl(8, 1024, 3 if quick else 10)
        mfu = c["tflops"] / c["peak_tflops"] * 100
        result = f"{c['tflops']:.0f} TFLOP/s, MFU {mfu:.0f}%"
        peak_cell = f"bf16 matmul peak {c['peak_tflops']:.0f} TFLOP/s"
        rows.append(("GPT-2-XL bf16 forward, B=8, N=1024 (CUDA)", f"{c['tokens_s']:,.0f} tok/s", peak_cell, result))

    print(f"command: python bench/bench_torch.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"machine: {machine()}\n")
    print("| benchmark | specc | HF / reference | result |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
