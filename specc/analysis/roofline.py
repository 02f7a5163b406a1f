"""Roofline bounds on one device: per-op arithmetic intensity and bound, prefill and decode-step times.

Each op is charged max(compute time, memory time): matmul FLOPs at the dtype's tensor peak, other FLOPs at the
vector peak, and the bytes it moves (activations in and out, attention fused, plus the weights it reads) at
the memory bandwidth. Summed over ops this is the unfused-kernel roofline; the *lower bound* assumes perfect
fusion: max(all FLOPs / peak, bytes that must move at least once / bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .devices import Device
from .op_costs import OpCost


@dataclass(frozen=True)
class OpRoof:
    name: str
    category: str
    flops: int
    bytes: int
    time_s: float
    bound: str  # compute | memory

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "flops": self.flops,
            "bytes": self.bytes,
            "intensity": round(self.intensity, 3),
            "bound": self.bound,
            "time_s": self.time_s,
        }


@dataclass(frozen=True)
class Phase:
    """One forward (prefill) or one decode step."""

    tokens: int  # tokens per phase (B·N for prefill, B for a decode step)
    flops: int
    min_bytes: int  # weights read + cache / inputs / outputs that must move at least once
    compute_s: float  # matmul FLOPs at the tensor peak + the rest at the vector peak
    memory_s: float  # min_bytes at the bandwidth
    per_op_s: float  # Σ over ops of max(compute, memory): unfused kernels
    ops: tuple[OpRoof, ...]

    @property
    def lower_bound_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    def to_dict(self, with_ops: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "flops": self.flops,
            "bytes": self.min_bytes,
            "compute_s": self.compute_s,
            "memory_s": self.memory_s,
            "lower_bound_s": self.lower_bound_s,
            "per_op_s": self.per_op_s,
            "bound": self.bound,
            "tokens_per_s": self.tokens / self.lower_bound_s if self.lower_bound_s else None,
        }
        if with_ops:
            d["ops"] = [o.to_dict() for o in self.ops]
        return d


def op_roofs(costs: list[OpCost], dev: Device, dtype: str, weight_bytes: int, category: Any) -> list[OpRoof]:
    peak = dev.peak(dtype)
    out = []
    for c in costs:
        mm = sum(f.matmul for f in c.flops)
        other = sum(f.other for f in c.flops)
        moved = c.mem.io + c.mem.weights_read * weight_bytes
        t_c = mm / peak + other / dev.vector_flops
        t_m = moved / dev.bandwidth
        out.append(
            OpRoof(
                c.op.name, category(c.op, None), mm + other, moved, max(t_c, t_m), "compute" if t_c >= t_m else "memory"
            )
        )
    return out


def phase(
    costs: list[OpCost], dev: Device, dtype: str, weight_bytes: int, extra_bytes: int, tokens: int, category: Any
) -> Phase:
    """``extra_bytes``: cache and graph inputs/outputs that must move besides the weights."""
    roofs = op_roofs(costs, dev, dtype, weight_bytes, category)
    mm = sum(f.matmul for c in costs for f in c.flops)
    other = sum(f.other for c in costs for f in c.flops)
    min_bytes = sum(c.mem.weights_read for c in costs) * weight_bytes + extra_bytes
    compute = mm / dev.peak(dtype) + other / dev.vector_flops
    memory = min_bytes / dev.bandwidth
    return Phase(tokens, mm + other, min_bytes, compute, memory, sum(r.time_s for r in roofs), tuple(roofs))
