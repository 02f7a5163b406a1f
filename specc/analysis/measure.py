"""Measuring this machine into a device profile (``specc profile-device``).

What is timed, with torch on the chosen device (CPU, or a CUDA GPU when present and asked for):

- GEMM rate by size: square fp32 products n = 64 … 1024 (and bf16/fp16 on a GPU); the peak is the fastest
  rate seen, the efficiency curve ``max · F / (F + knee)`` is fitted to the rates by least squares.
- GEMM rate by shape: products whose inner dimension is small (16 … 128) at a large size; their shortfall
  against the size curve fits ``dim_knee``.
- Memory bandwidth by size: copies of 64 KiB … 256 MiB (bytes read + written); the bandwidth is the median of
  the large copies, the knee is fitted to the small ones.
- Vector rate: an elementwise multiply-add on a cache-sized tensor.
- Backward GEMMs: the input and weight gradients of training shapes against their forward GEMM.
- Kernel overhead: the time of an op on a one-element tensor.
- Runtime context: this process's resident memory when the measurement ends (the command loads what
  ``specc train`` loads first: what a training process holds besides its tensors).

Every number of the profile says in ``sources`` that it was measured, when and on which CPU/GPU.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .devices import Device
from .efficiency import Curve, Efficiency, Runtime

COLD_BYTES = 64 << 20  # more than a last-level cache holds


@dataclass
class Measurement:
    device: Device
    gemm: list[tuple[int, int, int, float]] = field(default_factory=list)  # (m, k, n, FLOP/s)
    copies: list[tuple[int, float]] = field(default_factory=list)  # (bytes moved, bytes/s)


def _best(fn: Callable[[], Any], sync: Callable[[], None], budget: float, min_reps: int = 5) -> float:
    """The median of several runs (seconds), until ``budget`` seconds and at least ``min_reps`` runs: the
    rate a long job sees on this machine as it is loaded, not its best moment."""
    fn()
    sync()
    times: list[float] = []
    spent = 0.0
    while len(times) < min_reps or spent < budget:
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
        if len(times) >= 200:
            break
    return sorted(times)[len(times) // 2]


def _fit_curve(points: list[tuple[float, float]], peak: float) -> Curve:
    """Least-squares ``max · x / (x + knee)`` through (size, rate / peak) points, knee on a log grid."""
    best = (math.inf, 1.0, 0.0)
    for i in range(0, 121):
        knee = 10 ** (i / 10) if i else 0.0  # 0 and 10^0.1 … 10^12
        shape = [x / (x + knee) for x, _ in points]
        num = sum(s * e for s, (_, e) in zip(shape, points, strict=True))
        den = sum(s * s for s in shape)
        m = min(max(num / den, 1e-3), 1.0) if den else 1.0
        err = sum((m * s - e) ** 2 for s, (_, e) in zip(shape, points, strict=True))
        if err < best[0]:
            best = (err, m, knee)
    return Curve(best[1], best[2])


def _fit_gemm(points: list[tuple[float, float, float]], peak: float) -> tuple[Curve, float]:
    """Least squares of ``max · F/(F + knee) · d/(d + dim_knee)`` through (F, d, rate/peak), grids on the knees."""
    best = (math.inf, 1.0, 0.0, 0.0)
    for i in range(0, 121, 2):
        knee = 10 ** (i / 10) if i else 0.0
        for j in range(0, 41):
            dk = 10 ** (j / 10) - 1 if j else 0.0  # 0 … 10^4
            shape = [f / (f + knee) * d / (d + dk) for f, d, _ in points]
            effs = [r / peak for _, _, r in points]
            den = sum(x * x for x in shape)
            m = min(max(sum(x * e for x, e in zip(shape, effs, strict=True)) / den, 1e-3), 1.0)
            err = sum((m * x - e) ** 2 for x, e in zip(shape, effs, strict=True))
            if err < best[0]:
                best = (err, m, knee, dk)
    return Curve(best[1], best[2]), best[3]


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _total_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def measure(device: str = "cpu", quick: bool = False, threads: int | None = None) -> Measurement:
    import torch

    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    budget = 0.05 if quick else 0.25
    context = rss_bytes() if not cuda else 0  # before any tensor of the measurement
    dtypes = {"fp32": torch.float32} | ({"bf16": torch.bfloat16, "fp16": torch.float16} if cuda else {})
    main = "bf16" if cuda else "fp32"
    scale = 4 if cuda else 1
    # (m, k, n) and whether A is transposed (a weight gradient: the tokens are the inner dimension)
    shapes = [(n, n, n, False) for n in (64, 128, 256, 512, 1024)]
    shapes += [(m * scale, k * scale, n * scale, t) for m in (512, 2048, 8192) for k in (64, 256, 1024)
               for n in (256, 1024) for t in (False, True)]  # fmt: skip
    gemm: list[tuple[int, int, int, float]] = []
    peaks: dict[str, float] = {}
    points: list[tuple[float, float, float]] = []  # (FLOPs, smallest dimension, rate)
    for name, dt in dtypes.items():
        best = 0.0
        for m_, k_, n_, trans in shapes if name == main else shapes[:5]:
            # operands cycled through more memory than the caches hold: a training step's GEMMs read
            # activations another op wrote long before, not the operands of the previous call
            copies = max(1, min(16, COLD_BYTES // ((m_ * k_ + k_ * n_) * dt.itemsize)))
            ops = []
            for _ in range(copies):
                a = (
                    torch.randn(k_, m_, device=dev, dtype=dt).t()
                    if trans
                    else torch.randn(m_, k_, device=dev, dtype=dt)
                )
                ops.append((a, torch.randn(k_, n_, device=dev, dtype=dt)))
            turn = iter(range(1 << 62))
            t = _best(lambda ops=ops, turn=turn: torch.mm(*ops[next(turn) % len(ops)]), sync, budget)
            f = 2.0 * m_ * k_ * n_
            best = max(best, f / t)
            if name == main:
                gemm.append((m_, k_, n_, f / t))
                points.append((f, float(min(m_, k_, n_)), f / t))
        peaks[name] = best
    curve, dim_knee = _fit_gemm(points, peaks[main])
    # backward: input gradient dY·W and weight gradient dYᵀ·X against the forward X·Wᵀ, training shapes
    ratios = []
    for m_ in (1024 * scale, 4096 * scale):
        for k_, n_ in ((256 * scale, 1024 * scale), (1024 * scale, 256 * scale), (512 * scale, 512 * scale)):
            x = torch.randn(m_, k_, device=dev, dtype=dtypes[main])
            w = torch.randn(n_, k_, device=dev, dtype=dtypes[main])
            dy = torch.randn(m_, n_, device=dev, dtype=dtypes[main])
            fwd = _best(lambda x=x, w=w: torch.mm(x, w.t()), sync, budget)
            dgrad = _best(lambda dy=dy, w=w: torch.mm(dy, w), sync, budget)
            wgrad = _best(lambda dy=dy, x=x: torch.mm(dy.t(), x), sync, budget)
            ratios.append(2 * fwd / (dgrad + wgrad))
    backward = min(1.0, max(0.01, sorted(ratios)[len(ratios) // 2]))
    # memory bandwidth: copies (read + write)
    copies = []
    for size in [1 << s for s in range(16, 29 if not quick else 27, 2)]:
        x = torch.empty(size // 4, device=dev, dtype=torch.float32)
        y = torch.empty_like(x)
        t = _best(lambda x=x, y=y: y.copy_(x), sync, budget)
        copies.append((2 * size, 2 * size / t))
    large = sorted(r for n, r in copies if n >= 16 << 20)
    bandwidth = large[len(large) // 2] if large else max(r for _, r in copies)
    mem_curve = _fit_curve([(n, min(r / bandwidth, 1.0)) for n, r in copies], bandwidth)
    mem_curve = Curve(1.0, mem_curve.knee)  # the bandwidth is the plateau itself
    # vector unit: a transcendental activation (GELU, tanh form: 9 FLOPs an element as the cost rules count it)
    v = torch.randn(1 << 20, device=dev)
    t = _best(lambda: torch.nn.functional.gelu(v, approximate="tanh"), sync, budget)
    vector = 9.0 * v.numel() / t
    # launch overhead
    one = torch.ones(1, device=dev)
    overhead = _best(lambda: one.add_(0), sync, budget, min_reps=20)
    cpu = _cpu_model() or platform.processor() or platform.machine()
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    where = f"measured by `specc profile-device` on {cpu}, {torch.get_num_threads()} threads, {stamp}"
    if cuda:
        where = f"measured by `specc profile-device` on {torch.cuda.get_device_name(dev)}, {stamp}"
    eff = Efficiency(matmul=curve, dim_knee=dim_knee, vector=Curve(), memory=mem_curve, overlap=1.0,
                     kernel_overhead=overhead, backward=backward)  # fmt: skip
    memory = _total_memory() if not cuda else torch.cuda.get_device_properties(dev).total_memory
    sources = {
        "peak_flops": where + " (fastest square GEMM)",
        "efficiency.matmul": where + " (41 GEMMs by size and shape, least squares with dim_knee)",
        "efficiency.dim_knee": where + " (the same fit: smallest GEMM dimension 64-1024)",
        "bandwidth": where + " (median of copies of 16 MiB and more)",
        "efficiency.memory": where + " (copies of 64 KiB and more)",
        "vector_flops": where + " (tanh GELU on 4 MiB, 9 FLOPs an element)",
        "efficiency.kernel_overhead": where + " (one-element add)",
        "efficiency.backward": where + " (dY·W and dYᵀ·X against X·Wᵀ, 6 training shapes, median)",
        "efficiency.overlap": "assumed: an op's loads overlap its arithmetic (hardware prefetch, async copies)",
        "runtime.context": where + " (resident memory with torch and specc loaded)",
        "memory": "this machine's physical memory" if not cuda else "the GPU's memory",
    }
    device_obj = Device(
        name=f"local {device}" if not cuda else torch.cuda.get_device_name(dev),
        peak_flops=peaks,
        vector_flops=vector,
        bandwidth=bandwidth,
        memory=int(memory),
        source=where,
        efficiency=eff,
        attention="flash",  # torch's scaled_dot_product_attention: fused kernels on CPU and GPU
        runtime=Runtime(context=float(context), reserve=0.0, comm_buffers=0.0),
        sources=sources,
    )
    return Measurement(device_obj, gemm, copies)


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None
