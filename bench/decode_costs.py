"""What one decoding step costs, and the memory read bandwidth the way decoding reads its weights.

Decoding one token reads every weight once: the model's own tensors (dozens of matrices of 2-150 MB for GPT-2,
together far larger than the caches), one after another, in forward order. So the read bandwidth that bounds
it is measured on exactly those tensors, in that order:

- ``weight_read``: GB/s of ``sum()`` over every parameter once, in registration (= forward) order — a pure
  streaming read on every thread, nothing computed but the reduction;
- ``weight_gemvs``: seconds of the model's own linear kernels (those ``build_torch`` chose, one row) over
  every weight it decodes with, in order, and nothing else — the weight-streaming part of a step;
- ``step_seconds``: seconds of one KV-cached decoding step at a given cache length, as ``model.step`` takes it
  (the native step where it measured faster) — the difference to ``weight_gemvs`` is what the step costs beyond
  streaming its weights one call at a time (negative where the step streams them faster);
- ``reader_bandwidths``: the readers' rates both benches hold decoding against, like for like (median call
  for the median generation, best call for the best); ``repeated``: a reader timed between the generation
  calls, ``READS_PER_CALL`` reads a call.

All timings are the best and the median of ``reps`` calls, each after ``idle`` seconds of idle.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def _times(fn: Callable[[], object], reps: int, idle: float) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        time.sleep(idle)
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def summary(times: list[float]) -> dict[str, float]:
    return {"best_s": min(times), "median_s": statistics.median(times)}


READS_PER_CALL = 3  # reads per timed reader call between the generation calls (more samples, same rounds)


def repeated(fn: Callable[[], object], times: int = READS_PER_CALL) -> Callable[[], None]:
    """``fn`` called ``times`` times per call: a reader timed between the generation calls reads several times
    (its amount per call is ``times`` reads)."""

    def call() -> None:
        for _ in range(times):
            fn()

    return call


def reader_bandwidths(
    raw: dict[str, list[float]], names: dict[str, tuple[str, float]]
) -> tuple[dict[str, float], dict[str, float]]:
    """Amount/s of each reader (key in ``raw``, its call times → (label, amount read per call)): of its median
    call, which the floor uses (like for like with the median generation), and of its best call."""
    medians = {label: n / statistics.median(raw[k]) for k, (label, n) in names.items()}
    bests = {label: n / min(raw[k]) for k, (label, n) in names.items()}
    return medians, bests


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter once (parameters() yields a tied embedding / head matrix once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weight_read(model: torch.nn.Module, reps: int, idle: float) -> dict[str, float]:
    """Best and median GB/s of reading every parameter once with ``sum()``, in forward order."""
    params = [p.detach() for p in model.parameters()]

    def read() -> None:
        for p in params:
            p.sum()

    with torch.inference_mode():
        times = _times(read, reps, idle)
    nbytes = weight_bytes(model)
    return {"best_gb_s": nbytes / min(times) / 1e9, "median_gb_s": nbytes / statistics.median(times) / 1e9}


def _decode_linears(model: torch.nn.Module) -> list[Callable[[], object]]:
    """One-row calls of every linear layer of the model in forward order, each through the module itself (so
    through the kernel build_torch routed it to; a tied head is one, its weight the embedding's)."""
    calls: list[Callable[[], object]] = []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            x = torch.ones(1, 1, module.in_features)
            calls.append(lambda m=module, x=x: m(x))
    return calls


def weight_gemvs(model: torch.nn.Module, reps: int, idle: float) -> dict[str, float]:
    """Seconds of the model's one-row linear calls alone, in forward order."""
    calls = _decode_linears(model)

    def run() -> None:
        for call in calls:
            call()

    with torch.inference_mode():
        return summary(_times(run, reps, idle))


def step_seconds(model: torch.nn.Module, vocab: int, length: int, reps: int, idle: float) -> dict[str, float]:
    """Seconds of one KV-cached decoding step after ``length`` tokens (the cache is rewound after each step, so
    every timed step sees the same length)."""
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(3))
    token = ids[:, -1:]
    with torch.inference_mode():
        cache = model.start({}, length + 1)
        model.step(cache, ids)

        def one() -> None:
            model.step(cache, token)
            cache.length -= 1

        return summary(_times(one, reps, idle))
