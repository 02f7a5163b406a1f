"""Compute time of one micro-batch on one pipeline stage, op by op, as the kernels run.

Each op's forward is one kernel (a math attention core four or five: QKᵀ, softmax, dropout, AV) priced by
the device's efficiency model (``analysis/efficiency.py``: FLOPs at the matmul or vector unit's efficiency for
the op's size and smallest GEMM dimension, bytes at the memory system's efficiency for the transfer's size,
combined by the profile's stated rule, plus a launch overhead per kernel). Work is divided by tp for
tensor-parallel ops (all ops with sequence parallelism) and by cp.

- Backward = two kernels of the forward's size per op (input and weight gradients: 2 × the FLOPs and traffic).
  A fused (flash) attention's backward recomputes the scores: 2.5 × its forward FLOPs (FlashAttention-2).
- Attention ``flash``: causal work as the kernel does it — the masked tiles are skipped, so QKᵀ and AV run the
  visible pairs plus the half-filled diagonal tiles; O(N) memory traffic. ``math``: the full QKᵀ and AV
  GEMMs, the N² scores written, read and written by the softmax, read and written again with a mask by the
  attention dropout, read by AV (the same in backward, twice).
- Recompute ``full``: the blocks' forward again; ``selective``: the attention cores' forward again; ``op``
  (torchtitan's op-level selective checkpointing, see ``profile.py``): every op of a block whose output the
  policy does not save runs again (norms, activations, adds, the even-numbered bias-free linears).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..devices import Device
from ..efficiency import Efficiency, combine
from .layout import Layout, Training
from .profile import GraphProfile, OpProfile, Stage

FLASH_TILE = 128  # FlashAttention-2 key/query tile on A100/H100: the diagonal tiles run half-masked
FLASH_BACKWARD = 2.5  # FlashAttention-2 backward FLOPs / forward FLOPs (recomputes QKᵀ)
MATH_SCORE_PASSES = 4  # forward: QKᵀ writes, softmax reads and writes, AV reads (elements of the scores)
MATH_DROPOUT_PASSES = 2.5  # dropout reads, writes, and writes a 1-byte mask per element (in 2-byte units)


def bubble(pp: int, micro_batches: int, schedule: str = "1f1b", virtual: int = 1) -> float:
    """The idle fraction of a step with equal stages (Narayanan et al. 2021; Qi et al. 2023, ZB-H1)."""
    if pp <= 1:
        return 0.0
    idle = (pp - 1) / (virtual if schedule == "interleaved-1f1b" else 3 if schedule == "zero-bubble" else 1)
    return idle / (micro_batches + idle)


@dataclass(frozen=True)
class Rates:
    peak: float
    vector: float
    bandwidth: float
    weight_bytes: int
    eff: Efficiency
    attention: str  # flash | math


@dataclass
class OpTime:
    """Seconds of one op's passes per micro-batch, and what bound them."""

    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    compute: float = 0.0  # of forward + backward + recompute, at the unit's efficiency
    memory: float = 0.0


def _gemm_dim(p: OpProfile, tokens: float, tp: int) -> float:
    k, n = p.gemm
    if p.attention:
        return float(min(k, tokens))
    if p.role == "column" or p.role == "vocab":
        n = n // tp if p.sharded else n
    elif p.role == "row":
        k = k // tp if p.sharded else k
    return float(min(k, n, tokens)) if k and n else 0.0


def _forward(
    p: OpProfile, r: Rates, b: int, div: int, wdiv: int, tokens: float, tp: int, training: bool
) -> tuple[float, ...]:
    """(seconds, compute, memory, matmul seconds, kernels) of one forward of the op on one device (``r``: the
    op's rates, its attention implementation included); dropout runs in training only."""
    mm = p.matmul * b / div
    traffic = p.io * b / div + p.weights_read * r.weight_bytes / wdiv
    kernels = 0.0 if p.dropout and not training else 1.0
    if p.attention and r.attention == "flash" and p.matmul_causal < p.matmul and p.keys:
        mm = (p.matmul_causal + p.matmul * min(1.0, FLASH_TILE / 2 / p.keys)) * b / div
    elif p.attention and r.attention == "math":
        dropout = p.attn_dropout and training
        passes = MATH_SCORE_PASSES + (MATH_DROPOUT_PASSES if dropout else 0.0)
        traffic += p.scores * b / div * r.weight_bytes * passes
        kernels = 4.0 + dropout
    other = p.other * b / div
    dim = _gemm_dim(p, tokens, tp)
    eff = r.eff.for_flash() if p.attention and r.attention == "flash" else r.eff
    total, c, m = eff.seconds(r.peak, r.vector, r.bandwidth, mm, other, traffic, dim, kernels)
    mm_s = mm / eff.matmul_rate(r.peak, mm, dim) if mm else 0.0
    return total, c, m, mm_s, kernels


def op_time(p: OpProfile, r: Rates, b: int, div: int, wdiv: int, tokens: float, tp: int, t: Training,
            training: bool) -> OpTime:  # fmt: skip
    unfused = p.cpu_math_kept if training else p.cpu_math_inference  # no fused CPU kernel for it
    if unfused and t.kernels == "torch-cpu" and r.attention == "flash":
        r = replace(r, attention="math")
    fwd, c, m, mm_s, kernels = _forward(p, r, b, div, wdiv, tokens, tp, training)
    out = OpTime(forward=fwd, compute=c, memory=m)
    if not training:
        return out
    scale = FLASH_BACKWARD if p.attention and r.attention == "flash" else 2.0
    bc = scale * (c + mm_s * (1.0 / r.eff.backward - 1.0))  # the GEMMs at the backward's rate
    out.backward = combine(bc, scale * m, r.eff.overlap) + 2 * kernels * r.eff.kernel_overhead
    out.compute += bc
    out.memory += scale * m
    again = (
        float(t.recompute == "full" and p.in_block)
        or float(t.recompute == "selective" and p.attention)
        or (p.op_rerun if t.recompute == "op" and p.in_block else 0.0)
    )
    if again:
        out.recompute = again * fwd
        out.compute += again * c
        out.memory += again * m
    return out


@dataclass
class StageTime:
    """One micro-batch on one device of a stage: seconds by pass and by category."""

    forward: float = 0.0
    backward: float = 0.0
    recompute: float = 0.0
    by_category: dict[str, float] | None = None
    memory_bound: float = 0.0  # seconds of ops whose memory traffic outlasts their compute

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def rates(dev: Device, dtype: str, elem_bytes: int, attention: str | None) -> Rates:
    impl = attention or dev.attention
    return Rates(dev.peak(dtype), dev.vector_flops, dev.bandwidth, elem_bytes, dev.efficiency, impl)


def stage_time(prof: GraphProfile, stage: int, lay: Layout, t: Training, r: Rates, training: bool) -> StageTime:
    """Seconds one micro-batch spends computing on a device of ``stage``."""
    st = prof.stages(lay.pp)[stage]
    key = ("time", st.key, r, lay.tp, lay.cp, lay.ep, t.sequence_parallel, t.micro_batch, t.recompute, training)
    if key not in prof.memo:
        prof.memo[key] = _stage_time(st, prof.seq, r, lay, t, training)
    return prof.memo[key]  # type: ignore[return-value]


def _stage_time(st: Stage, seq: int, r: Rates, lay: Layout, t: Training, training: bool) -> StageTime:
    out = StageTime(by_category={})
    b = t.micro_batch
    for p, count in st.ops:
        split = lay.tp if p.sharded or t.sequence_parallel else 1
        wdiv = (lay.tp if p.sharded else 1) * (lay.ep if p.routed else 1)
        ot = op_time(p, r, b, split * lay.cp, wdiv, b * seq / lay.cp, lay.tp, t, training)
        out.forward += count * ot.forward
        out.backward += count * ot.backward
        out.recompute += count * ot.recompute
        cat = "attention" if p.attention else "matmul" if p.matmul else "memory_bound"
        assert out.by_category is not None
        out.by_category[cat] = out.by_category.get(cat, 0.0) + count * (ot.forward + ot.backward + ot.recompute)
        if ot.memory > ot.compute:
            out.memory_bound += count * (ot.forward + ot.backward + ot.recompute)
    return out


def optimizer_seconds(params: int, r: Rates) -> float:
    """Adam's step on a device's ``params`` elements: memory-bound, fp32 master weights, momentum and variance
    read and written, the gradient read, the 16-bit weight written (mixed precision: 4·6 + 2 + 2 bytes)."""
    traffic = params * (24 + 2 * r.weight_bytes) if r.weight_bytes < 4 else params * 16
    return r.eff.seconds(r.peak, r.vector, r.bandwidth, 0, 0, traffic, 0, 1)[0] if params else 0.0
