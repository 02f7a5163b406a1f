"""Step time of one layout from the roofline plus the links, the 1F1B bubble, and MFU.

Per micro-batch and stage each op costs max(compute, memory) as in the single-device roofline: its FLOPs at
the dtype's tensor peak (matmuls) or the vector peak (the rest), its activation traffic and the weights it
reads at the memory bandwidth — divided by tp for tensor-parallel ops (all ops with sequence parallelism) and
by cp. Training charges 3 forward passes (backward = 2 × forward), plus one more for the blocks under full
recompute or for the attention cores under selective recompute. Collectives are not overlapped with compute:
each group's bytes go at its link's bandwidth (``links.py``). With M micro-batches and P stages, 1F1B takes
(M + P − 1) micro-batch slots of the slowest stage (bubble (P − 1) / (M + P − 1), Narayanan et al. 2021),
then the data-parallel gradient (and ZeRO) traffic. MFU = model FLOPs of the step (3 × forward in training,
no recomputation counted; attention at the full count) / (step time × devices × peak).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..devices import Device
from .layout import Layout, Training
from .links import Interconnect
from .profile import GraphProfile, OpProfile, Stage


def bubble(pp: int, micro_batches: int) -> float:
    return (pp - 1) / (micro_batches + pp - 1)


@dataclass(frozen=True)
class _Rates:
    peak: float
    vector: float
    bandwidth: float
    weight_bytes: int


def _op_seconds(p: OpProfile, r: _Rates, b: int, div: int, wdiv: int) -> float:
    compute = (p.matmul / r.peak + p.other / r.vector) * b / div
    memory = (p.io * b / div + p.weights_read * r.weight_bytes / wdiv) / r.bandwidth
    return max(compute, memory)


def stage_compute(prof: GraphProfile, stage: int, lay: Layout, t: Training, dev: Device, training: bool) -> float:
    """Seconds of compute one micro-batch spends on a device of ``stage``."""
    st = prof.stages(lay.pp)[stage]
    r = _Rates(dev.peak(prof.dtype), dev.vector_flops, dev.bandwidth, prof.elem_bytes)
    key = (st.key, r, lay.tp, lay.cp, lay.ep, t.sequence_parallel, t.micro_batch, t.recompute, training)
    if key not in prof.memo:
        prof.memo[key] = _stage_seconds(st, *key[1:])
    return prof.memo[key]


def _stage_seconds(
    st: Stage, r: _Rates, tp: int, cp: int, ep: int, sp: bool, b: int, recompute: str, training: bool
) -> float:
    total = 0.0
    for p, count in st.ops:
        split = tp if p.sharded or sp else 1
        wdiv = (tp if p.sharded else 1) * (ep if p.routed else 1)
        one = _op_seconds(p, r, b, split * cp, wdiv)
        passes = 1
        if training:
            passes = 3 + (recompute == "full" and p.in_block) + (recompute == "selective" and p.attention)
        total += count * passes * one
    return total


def group_seconds(groups: dict[str, dict[str, float]], lay: Layout, link: Interconnect) -> dict[str, float]:
    """Seconds each group's collectives take on its link."""
    strides = {"tp": (1, lay.tp), "cp": (lay.tp, lay.cp), "ep": (lay.tp * lay.cp, lay.ep)}
    strides |= {"dp": (lay.tp * lay.cp, lay.dp), "pp": (lay.tp * lay.cp * lay.dp, 2)}
    return {g: sum(v.values()) / link.bandwidth(*strides[g]) for g, v in groups.items()}
