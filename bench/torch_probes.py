"""Machine probes for bench/bench_torch.py: the CPU's name, round-robin timing after an idle gap, the fp32
GEMM peak of torch.mm and oneDNN on GPT-2's shapes, and the read bandwidth of several weight readers."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

import decode_costs
import torch
import torch.nn.functional as F
from cpu_info import cpu_model

IDLE = 0.1  # seconds of idle before every timed call
GPT2_GEMMS = [(768, 2304), (768, 768), (768, 3072), (3072, 768), (768, 50257)]  # (in_features, out_features)


# ================================================================================================ machine


def machine() -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu_model()}, {cpus} CPUs usable; torch {torch.__version__}, {torch.get_num_threads()} threads"


# ================================================================================================= timing


def timed(fn: Callable[[], object]) -> float:
    """One call after IDLE seconds of idle; its wall time."""
    time.sleep(IDLE)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def round_robin(contenders: dict[str, Callable[[], object]], reps: int, warm: bool = True) -> dict[str, list[float]]:
    """Warm every contender up once (unless the caller did), then time each ``reps`` times, alternating (so
    load from elsewhere hits all alike)."""
    for fn in contenders.values() if warm else ():
        fn()
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            times[name].append(timed(fn))
    return times


def onednn() -> Callable[..., torch.Tensor] | None:
    """oneDNN's linear, if this torch build has it and it agrees with F.linear on a probe."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        g = torch.Generator().manual_seed(0)
        x, w = torch.randn(3, 40, generator=g), torch.randn(24, 40, generator=g)
        with torch.no_grad():
            if not torch.allclose(op(x, w, None, "none", [], ""), F.linear(x, w), atol=1e-4):
                return None
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    return lambda x, w: op(x, w, None, "none", [], "")


def row_split(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ wᵀ as one batched matmul over torch.get_num_threads() row blocks of w (a GEMV on every core)."""
    k = torch.get_num_threads()
    main = w.shape[0] - w.shape[0] % k
    y = torch.bmm(w[:main].view(k, main // k, -1), x.t().expand(k, -1, -1)).permute(2, 0, 1).reshape(len(x), main)
    return torch.cat((y, F.linear(x, w[main:])), 1) if main < w.shape[0] else y


# ========================================================================================== machine peaks


def gemm_peaks(rows: int, reps: int) -> dict[str, object]:
    """GFLOP/s of torch.mm and oneDNN on GPT-2's GEMM shapes with ``rows`` rows, of the median of ``reps`` calls
    (held against the median forward, like with like) and of the best call (against the best forward)."""
    g = torch.Generator().manual_seed(0)
    dnn = onednn()
    shapes: dict[str, dict[str, float]] = {}
    bests: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for n_in, n_out in GPT2_GEMMS:
            x, w = torch.randn(rows, n_in, generator=g), torch.randn(n_out, n_in, generator=g)
            contenders: dict[str, Callable[[], object]] = {"torch.mm": lambda x=x, w=w: torch.mm(x, w.t())}
            if dnn is not None:
                contenders["oneDNN"] = lambda x=x, w=w: dnn(x, w)
            times = round_robin(contenders, reps)
            flops = 2 * rows * n_in * n_out
            shapes[f"{n_in}→{n_out}"] = {name: flops / statistics.median(ts) / 1e9 for name, ts in times.items()}
            bests[f"{n_in}→{n_out}"] = {name: flops / min(ts) / 1e9 for name, ts in times.items()}
    best = {name: max(s.get(name, 0.0) for s in shapes.values()) for name in ("torch.mm", "oneDNN")}
    best_call = max(v for s in bests.values() for v in s.values())
    return {"shapes": shapes, "best": best, "peak": max(best.values()), "peak_best": best_call}


def readers(mib: int) -> tuple[dict[str, Callable[[], object]], dict[str, float]]:
    """Weight readers of ``mib`` MiB each and the GB each call reads: sum() of an fp32 tensor, and 1-row GEMVs
    streaming a weight of that size by F.linear, oneDNN, the row-split batched GEMV and specc's native GEMV."""
    n = mib * 2**20 // 4
    big = torch.ones(n)
    w = torch.ones(n // 768, 768)
    x = torch.ones(1, 768)
    dnn = onednn()
    contenders: dict[str, Callable[[], object]] = {
        "sum()": big.sum,
        "GEMV F.linear": lambda: F.linear(x, w),
        "GEMV row-split": lambda: row_split(x, w),
    }
    if dnn is not None:
        contenders["GEMV oneDNN"] = lambda: dnn(x, w)
    native = native_gemv()
    if native is not None:
        contenders["GEMV specc native"] = lambda: native(x, w, None)
    if torch.get_num_threads() == 1:
        del contenders["GEMV row-split"]
    return contenders, {name: (big if name == "sum()" else w).numel() * 4 / 1e9 for name in contenders}


def bandwidth(
    contenders: dict[str, Callable[[], object]], gb: dict[str, float], reps: int
) -> dict[str, tuple[float, float]]:
    """GB/s read by each reader (readers()), (median, best) of ``reps`` calls timed round-robin."""
    with torch.inference_mode():
        times = round_robin(contenders, reps)
    return reader_rates(times, gb)


def reader_rates(times: dict[str, list[float]], gb: dict[str, float]) -> dict[str, tuple[float, float]]:
    """(median, best) GB/s of each reader in ``gb`` from its call times."""
    names = {name: (name, gb[name]) for name in gb if name in times}
    medians, bests = decode_costs.reader_bandwidths(times, names)
    return {name: (medians[name], bests[name]) for name in names}


def native_gemv() -> Callable[..., torch.Tensor] | None:
    """specc's native GEMV where this checkout has it and it builds here (else None; the reason is printed)."""
    try:
        from specc.backends.torch.accel import kernels_native
    except ImportError:
        return None
    if not kernels_native.available():
        print(f"specc native GEMV: {kernels_native.status()}", file=sys.stderr)
        return None
    return kernels_native.native_linear
