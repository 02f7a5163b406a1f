"""How far below its peaks a device runs an op: efficiency curves, the combination rule, launch overheads.

An op of ``F`` matmul FLOPs, ``V`` vector FLOPs and ``Q`` bytes of memory traffic takes

    compute = F / (peak · e_mm(F, d)) + V / (vector · e_vec(V))
    memory  = Q / (bandwidth · e_mem(Q))
    time    = max(compute, memory) + (1 − overlap) · min(compute, memory) + kernels · kernel_overhead

A backward pass runs two GEMMs of the forward's size per matmul (input and weight gradient) at ``backward`` ×
the forward's rate (a weight gradient reduces over the tokens: a long inner dimension, a small output).
Saturating curves ``e(x) = max · x / (x + knee)`` (small ops run far below the peak, large ones approach
``max``) and for matmuls a shape factor ``d / (d + dim_knee)`` on the smallest GEMM dimension ``d`` (a
head_dim of 64 fills the tensor cores less than a width of 8192). ``overlap`` = 1 is the roofline (compute and
memory traffic fully overlap), 0 is Calculon's ``no_overlap`` mode (they add). All numbers are device profile
data (``efficiency:`` in a device YAML); a profile without them is ideal (efficiency 1, overlap 1, no overhead),
the roofline bound.

Memory the runtime holds beyond the model's tensors is profile data too (``runtime:``): the CUDA/framework
context, the allocator's reserve as a fraction of what it hands out (fragmentation, caching), and the
communication library's buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

ATTENTION_IMPLS = ("flash", "math")


@dataclass(frozen=True)
class Curve:
    """Efficiency ``max · x / (x + knee)`` of a unit for an op of size ``x`` (FLOPs or bytes)."""

    max: float = 1.0
    knee: float = 0.0

    def at(self, x: float) -> float:
        if x <= 0:
            return self.max
        return self.max * x / (x + self.knee)

    def to_dict(self) -> dict[str, float]:
        return {"max": self.max, "knee": self.knee}


@dataclass(frozen=True)
class Efficiency:
    matmul: Curve = field(default_factory=Curve)
    dim_knee: float = 0.0  # smallest GEMM dimension at which the shape factor is 1/2
    vector: Curve = field(default_factory=Curve)
    memory: Curve = field(default_factory=Curve)
    overlap: float = 1.0  # 1: max(compute, memory); 0: compute + memory
    kernel_overhead: float = 0.0  # seconds per kernel launch (and the gap between kernels)
    backward: float = 1.0  # backward GEMMs' rate / the forward's (weight gradients reduce over the tokens)
    flash: float = 0.0  # a fused attention kernel's ceiling as a fraction of the matmul peak (0: the matmul curve's)

    def for_flash(self) -> Efficiency:
        """The efficiency a fused attention kernel runs at: its own ceiling on the matmul curve's knee (its tiles
        are the kernel's own, so no GEMM shape factor)."""
        if self.flash <= 0:
            return self
        return replace(self, matmul=Curve(self.flash, self.matmul.knee), dim_knee=0.0)

    def matmul_rate(self, peak: float, flops: float, dim: float) -> float:
        shape = 1.0 if self.dim_knee <= 0 or dim <= 0 else dim / (dim + self.dim_knee)
        return peak * self.matmul.at(flops) * shape

    def seconds(
        self,
        peak: float,
        vector: float,
        bandwidth: float,
        mm: float,
        other: float,
        traffic: float,
        dim: float,
        kernels: float,
    ) -> tuple[float, float, float]:
        """(total, compute, memory) seconds of one op (the combination rule of the module docstring)."""
        c = (mm / self.matmul_rate(peak, mm, dim) if mm else 0.0) + (
            other / (vector * self.vector.at(other)) if other else 0.0
        )
        m = traffic / (bandwidth * self.memory.at(traffic)) if traffic else 0.0
        return combine(c, m, self.overlap) + kernels * self.kernel_overhead, c, m

    def with_values(self, **values: float) -> Efficiency:
        """A copy with some parameters changed (``matmul.max=0.8`` style keys, as ``calibrate`` fits them)."""
        out = self
        for key, v in values.items():
            head, _, tail = key.partition(".")
            if tail:
                out = replace(out, **{head: replace(getattr(out, head), **{tail: v})})
            else:
                out = replace(out, **{head: v})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "matmul": self.matmul.to_dict(),
            "dim_knee": self.dim_knee,
            "vector": self.vector.to_dict(),
            "memory": self.memory.to_dict(),
            "overlap": self.overlap,
            "kernel_overhead": self.kernel_overhead,
            "backward": self.backward,
            "flash": self.flash,
        }


def combine(compute: float, memory: float, overlap: float) -> float:
    """The stated rule: the longer of the two, plus the part of the shorter that does not overlap it."""
    return max(compute, memory) + (1.0 - overlap) * min(compute, memory)


@dataclass(frozen=True)
class Runtime:
    """Memory the runtime holds on a device besides tensors the model owns."""

    context: float = 0.0  # bytes: CUDA context, cuBLAS/cuDNN workspaces, framework
    reserve: float = 0.0  # fraction of allocated bytes the caching allocator holds on top (fragmentation)
    comm_buffers: float = 0.0  # bytes: NCCL channels and buffers per communicator

    def to_dict(self) -> dict[str, float]:
        return {"context": self.context, "reserve": self.reserve, "comm_buffers": self.comm_buffers}
