"""Plan search: every legal layout of N devices, those that fit the device memory, ranked by step time.

Enumerated: tp over the divisors of N that divide the attention heads, the KV heads and the MLP units; pp over
the divisors that divide the blocks; cp in 1, 2, 4, 8 (dividing the sequence); ep over the divisors of the
experts that divide dp (MoE only); dp the rest; micro-batches over the divisors of G / dp up to
``MAX_MICRO_BATCH``; in training the least recomputation (none, then selective, then full) with the lowest
ZeRO stage that fits — stages 0–2 move the same bytes (ZeRO §7), so a higher one is never faster; stage 3 and
more recomputation only cost time, so they are tried only while nothing cheaper fits. Sequence parallelism
is on whenever tp > 1: the same bytes as plain tensor parallelism, less activation memory (Korthikanti et al.
2022 §4.2.2). The global batch defaults to one sequence per device.
Ties in step time go to the smaller per-device memory.

Only layouts ``specc train --parallel`` runs are returned (``support.runtime_gap``, the rule its refusals use);
the others are counted in ``excluded`` by reason, and ``specc analyze --parallel`` still sizes any of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...ir.graph import LayerGraph
from .estimate import Estimator, LayoutCost
from .layout import Layout, LayoutError, Training, check_layout, graph_facts
from .profile import profile
from .run import devices_and_links, settings
from .support import runtime_facts, runtime_gap

MAX_MICRO_BATCH = 16
CONTEXT_PARALLEL = (1, 2, 4, 8)
MAX_DEVICES = 1 << 20
TRAINING_RECOMPUTE = ("none", "selective", "full")


@dataclass
class Excluded:
    """Layouts the plan leaves out for one reason (micro-batch sizes left out of a layout that keeps others
    are not counted)."""

    reason: str
    layouts: int = 0
    example: str = ""  # the first one left out, as ``--parallel`` takes it (analyze sizes it)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "layouts": self.layouts, "example": self.example}


@dataclass
class PlanResult:
    devices: int
    global_batch: int
    training: bool
    considered: int
    fitting: int
    plans: list[LayoutCost] = field(default_factory=list)
    device: Any = None
    link: Any = None
    excluded: dict[str, Excluded] = field(default_factory=dict)  # reason → layouts specc train does not run

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "global_batch": self.global_batch,
            "training": self.training,
            "device": self.device.to_dict() if self.device is not None else None,
            "interconnect": self.link.to_dict() if self.link is not None else None,
            "considered": self.considered,
            "fitting": self.fitting,
            "plans": [plan_dict(p) for p in self.plans],
            "excluded": {
                "layouts": sum(e.layouts for e in self.excluded.values()),
                "why": "sized by the analyzer, not run by specc train --parallel",
                "reasons": [e.to_dict() for e in self.excluded.values()],
            },
        }

    def exclude(self, reason: str, lay: Layout) -> None:
        e = self.excluded.setdefault(reason, Excluded(reason, example=lay.text()))
        e.layouts += 1


def plan_dict(c: LayoutCost) -> dict[str, Any]:
    lay, t = c.layout, c.training
    d: dict[str, Any] = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, "cp": lay.cp}
    d |= {"zero": t.zero, "micro_batch": t.micro_batch, "micro_batches": c.micro_batches}
    d |= {"recompute": t.recompute, "sequence_parallel": t.sequence_parallel}
    d |= {"memory": dict(c.memory), "step_time": c.step_time, "mfu": c.mfu, "bubble": c.bubble, "comm": dict(c.comm)}
    return d


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def plan(
    g: LayerGraph,
    devices: int,
    *,
    training: bool = False,
    global_batch: int | None = None,
    seq: int | None = None,
    dec_seq: int | None = None,
    dtype: str | None = None,
    device: str = "h100",
    interconnect: str | None = None,
    top: int = 10,
) -> PlanResult:
    if not 1 <= devices <= MAX_DEVICES:
        raise LayoutError(f"--devices {devices} is out of range (allowed 1..{MAX_DEVICES})")
    n, dtype = settings(g, seq, dtype)
    dev, link = devices_and_links(device, interconnect)
    assert dev is not None
    batch = global_batch or devices
    prof = profile(g, n, dec_seq, dtype, training)
    est = Estimator(prof, dev, link)
    out = PlanResult(devices, batch, training, 0, 0, device=dev, link=link)
    found: list[tuple[float, int, Layout, Training, int]] = []
    facts = runtime_facts(g)
    for lay in layouts(g, devices, n):
        gap = runtime_gap(lay, facts)
        if gap is not None:
            out.exclude(gap.kind, lay)
            continue
        if batch % lay.dp:
            continue
        per_replica = batch // lay.dp
        short, kept = None, False  # short: why a micro-batch size is not run (1f1b needs ≥ pp micro-batches)
        for mb in (d for d in divisors(per_replica) if d <= MAX_MICRO_BATCH):
            m = per_replica // mb
            gap = runtime_gap(lay, facts, m)
            if gap is not None:
                short = gap
                continue
            kept = True
            for recompute in TRAINING_RECOMPUTE if training else ("none",):
                out.considered += 1
                fit = _lowest_fitting_zero(est, lay, recompute, mb, batch, m, training, dev.memory)
                if fit is not None:
                    t, peak = fit
                    found.append((est.step_time(lay, t, m)[0], peak, lay, t, m))
                    if t.zero < 3:
                        break  # more recomputation is only slower: stages 0-2 already fit without it
        if short is not None and not kept:  # no micro-batch size of this layout runs
            out.exclude(short.kind, lay)
    out.fitting = len(found)
    found.sort(key=lambda c: (c[0], c[1]))
    out.plans = [est.cost(lay, t, m) for _, _, lay, t, m in found[:top]]
    return out


def _lowest_fitting_zero(
    est: Estimator, lay: Layout, recompute: str, mb: int, batch: int, m: int, training: bool, memory: int
) -> tuple[Training, int] | None:
    """The settings with the lowest ZeRO stage that fits, and their peak memory per device."""
    for zero in (0, 1, 2, 3) if training else (0,):
        t = Training(zero, lay.tp > 1, recompute, mb, batch)
        peak = est.peak_memory(lay, t, m)
        if peak <= memory:
            return t, peak
    return None


def layouts(g: LayerGraph, devices: int, seq: int) -> list[Layout]:
    """Every layout of ``devices`` that ``check_layout`` accepts."""
    facts = graph_facts(g)
    heads, experts = facts.heads, facts.experts
    out = []
    for tp in divisors(devices):
        if tp > 1 and heads is None:
            break
        for pp in divisors(devices // tp):
            for cp in CONTEXT_PARALLEL:
                rest = devices // (tp * pp)
                if rest % cp or (cp > 1 and heads is None):
                    continue
                dp = rest // cp
                for ep in [e for e in divisors(experts) if dp % e == 0] if experts else [1]:
                    lay = Layout(tp, pp, dp, ep, cp)
                    try:
                        check_layout(facts, lay, seq)
                    except LayoutError:
                        continue
                    out.append(lay)
    return out
