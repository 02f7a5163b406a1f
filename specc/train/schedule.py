"""Learning-rate schedules and per-step seeding: both pure functions of the step, so a resumed run matches."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "constant")


def lr_at(step: int, base: float, total: int, warmup: int, schedule: str) -> float:
    """Linear warmup to ``base``, then constant or cosine decay to 10% of ``base`` at ``total``."""
    if step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return base
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def step_seed(seed: int, step: int) -> int:
    """Seed of the batch (and dropout) of one step: independent of how the run was split by --resume."""
    return (seed * 0x9E3779B1 + step * 0x85EBCA77 + 1) % (1 << 63)
