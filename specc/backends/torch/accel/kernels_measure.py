"""Timing the candidate kernels of one linear shape class on the call's own inputs, and picking the fastest.

Every applicable candidate is timed on the call's inputs (a slice of the weight when it is large, so one class
costs a few ms to a few tens of ms), round-robin, best of a few repetitions; ``F.linear`` wins ties (< 3%).
A GEMV (≤ FEW_ROWS rows) and a weight larger than the caches are timed on weights not in the caches, as in
decoding, where every layer's weight comes from memory: each call reads another slice (or copy) of the
weight, from a pool larger than the last-level caches. A measurement is *noisy* when the process was
preempted during it or a candidate's repetitions spread (other load on the machine); the dispatcher then
measures again later, each candidate keeping its best time.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from . import kernels_native
from .kernels_candidates import CANDIDATES, onednn_available, runs_and_agrees

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

ENV = kernels_native.KERNELS_ENV  # "torch": always F.linear (no native code loaded); "auto" (or unset): measure
FEW_ROWS = 8  # up to this many rows a linear layer is a weight-streaming GEMV

# Measurement budget: one timed call of a candidate does at most this much work (the weight is sliced along
# out_features to fit), and the repetitions of one class stop after about _SPEND seconds. Large enough for
# GPT-2's 512-row GEMMs whole: kernels rank differently on a slice (MKL led oneDNN on 448 of 2304 outputs and
# trailed it on all of them: bench/bench_torch.py's GEMM rows and kernel choices), so a slice chose the slower one.
_MAX_FLOPS = 2e9
_MAX_WEIGHT_BYTES = 16 << 20
_MAX_POOL = 256 << 20  # GEMV timings read from copies of the weight worth twice the last-level cache, up to this
_MIN_OUT = 256
_MIN_ROWS = 32  # fewest rows a GEMM (more than FEW_ROWS rows) with a weight larger than the caches is timed on
_SPEND = 0.015
_MIN_ROUNDS, _MAX_ROUNDS = 3, 15
_MARGIN = 0.03  # another kernel must beat F.linear by this fraction to be chosen
_NOISE = 0.25  # a candidate's median repetition this much slower than its best: measure again later
_PREEMPTIONS = 5  # more involuntary context switches than this during a measurement: measure again later

_LLC: list[int] = []  # bytes of last-level cache (read at the first GEMV measurement)


class Choice(NamedTuple):
    kernel: str  # the name of the chosen candidate
    seconds: dict[str, float]  # best time of each candidate, over every measurement of this class
    measured: tuple[int, int, int]  # (rows, out_features, in_features) of the last measurement
    measurements: int  # how many times this class was measured (more than once only when it was noisy)


def applicable(x: Tensor, w: Tensor) -> list[str]:
    names = ["torch"]
    if onednn_available(x.dtype):
        names.append("onednn")
    k = torch.get_num_threads()
    gemv = x.numel() <= FEW_ROWS * x.shape[-1]
    if gemv and k > 1 and w.shape[0] >= 8 * k and w.is_contiguous():
        names.append("split")
    if gemv and w.is_contiguous() and kernels_native.supports(x.dtype):
        names.append("native")
    return names


def measure(x: Tensor, w: Tensor, b: Tensor | None, previous: Choice | None) -> tuple[Choice, bool] | None:
    """(the fastest candidate, whether the measurement was noisy), or None where these inputs cannot decide
    (non-finite values). ``SPECC_KERNELS=torch`` chooses F.linear without timing anything."""
    n_out, n_in = w.shape
    rows = x.numel() // n_in
    if os.environ.get(ENV) == "torch":
        return Choice("torch", {}, (rows, n_out, n_in), 0), False
    names = applicable(x, w)
    size = w.element_size() * n_in  # bytes per row of the weight
    cold = rows <= FEW_ROWS or n_out * size > cache_bytes()
    if rows > 512:
        x, rows = x.reshape(-1, n_in)[:512], 512
    if cold:
        # A GEMV, or a weight larger than the caches (an LM head): the weight streams from memory, so time
        # it on slices of it (or copies) that are not in the caches, and on fewer rows if need be.
        keep = _MAX_WEIGHT_BYTES // size
        fit = max(_MIN_ROWS, int(_MAX_FLOPS // (2 * min(keep, n_out) * n_in)))
        if fit < rows:
            x, rows = x.reshape(-1, n_in)[:fit], fit
    else:
        keep = int(_MAX_FLOPS // (2 * rows * n_in))
    keep = max(keep, _MIN_OUT)
    keep = n_out if keep >= n_out else keep - keep % 64
    b = b[:keep] if b is not None else None
    with torch.no_grad():
        pool = _pool(w, keep, clones=rows <= FEW_ROWS) if cold else [w[:keep]]
        ref = F.linear(x, pool[0], b)  # also the warm-up of F.linear
        if not bool(torch.isfinite(ref).all()):
            return None
        ok = [name for name in names if name == "torch" or runs_and_agrees(CANDIDATES[name], x, pool[0], b, ref)]
        times: dict[str, list[float]] = {name: [] for name in ok}
        # The warm-ups read pool[0]; the others, walked in the order they were made, are all out of cache.
        timed = pool[1:] or pool
        switches = preemptions()
        start = time.perf_counter()
        calls = 0
        for rounds in range(1, _MAX_ROUNDS + 1):
            for name in ok:
                fn, weight = CANDIDATES[name], timed[calls % len(timed)]
                calls += 1
                t0 = time.perf_counter()
                fn(x, weight, b)
                times[name].append(time.perf_counter() - t0)
            if rounds >= _MIN_ROUNDS and time.perf_counter() - start > _SPEND:
                break
        del pool, timed
    old = previous.seconds if previous is not None else {}
    best = {name: min([*ts, old.get(name, float("inf"))]) for name, ts in times.items()}
    # Noisy: the process was preempted (other load on the cores stalls every thread of a parallel kernel),
    # or a candidate's repetitions spread.
    noisy = preemptions() - switches > _PREEMPTIONS
    noisy = noisy or any(sorted(ts)[len(ts) // 2] > (1 + _NOISE) * min(ts) for ts in times.values())
    fastest = min(best, key=best.__getitem__)
    if best[fastest] >= best["torch"] * (1 - _MARGIN):
        fastest = "torch"
    count = previous.measurements + 1 if previous is not None else 1
    return Choice(fastest, best, (rows, keep, n_in), count), noisy


def _pool(w: Tensor, keep: int, clones: bool) -> list[Tensor]:
    """Weights of shape w[:keep] that together exceed the last-level caches (capped at _MAX_POOL bytes):
    disjoint row slices of w, and (if ``clones``) copies of w[:keep] where w is not large enough."""
    one = keep * w.shape[1] * w.element_size()
    count = min(_MAX_POOL // one, -(-2 * cache_bytes() // one), 64)
    slices = w.shape[0] // keep if w.is_contiguous() else 1
    pool = [w[i * keep : (i + 1) * keep] for i in range(max(1, min(slices, count)))]
    return pool + [pool[0].clone() for _ in range(count - len(pool) if clones else 0)]


def cache_bytes() -> int:
    """The last-level cache this process's CPUs share, all instances together (from sysfs; 32 MiB where it
    does not say). Read once."""
    if not _LLC:
        sizes: dict[str, int] = {}
        try:
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
            for cpu in sorted(cpus):
                root = f"/sys/devices/system/cpu/cpu{cpu}/cache"
                level, shared, size = max(
                    (int(_read(f"{d.path}/level")), _read(f"{d.path}/shared_cpu_list"), _read(f"{d.path}/size"))
                    for d in os.scandir(root)
                    if d.name.startswith("index")
                )
                scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
                sizes[f"{level}:{shared}"] = int(size.rstrip("KMG")) * scale
        except (OSError, ValueError):
            sizes = {}
        _LLC.append(sum(sizes.values()) or 32 << 20)
    return _LLC[0]


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def preemptions() -> int:
    """Involuntary context switches of this process so far (0 where the platform does not say)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw if resource is not None else 0
