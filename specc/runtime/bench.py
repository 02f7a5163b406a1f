"""Latency statistics with a progress bar: warm-up, then timed repetitions of one call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


@dataclass(frozen=True)
class BenchResult:
    times_s: tuple[float, ...]
    tokens_per_call: int

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.times_s, q))

    @property
    def mean(self) -> float:
        return float(np.mean(self.times_s))

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_call / self.percentile(50)

    def summary(self) -> dict[str, float]:
        return {
            "p50_ms": 1e3 * self.percentile(50),
            "p90_ms": 1e3 * self.percentile(90),
            "p99_ms": 1e3 * self.percentile(99),
            "mean_ms": 1e3 * self.mean,
            "min_ms": 1e3 * min(self.times_s),
            "tokens_per_s": self.tokens_per_s,
        }


def benchmark(
    fn: Callable[[], object],
    iters: int = 20,
    warmup: int = 3,
    tokens_per_call: int = 1,
    label: str = "bench",
    console: Console | None = None,
) -> BenchResult:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    with Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=iters)
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            bar.advance(task)
    return BenchResult(tuple(times), tokens_per_call)
