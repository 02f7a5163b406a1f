"""One layout's costs: per-device memory, communication, bubble, and with a device the step time and MFU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..devices import Device
from . import comm as C
from .device_memory import representatives, stage_memory
from .layout import Layout, Training
from .links import Interconnect
from .profile import GraphProfile
from .shard import BlockWeights, block_weights, param_shards, weights_per_stage
from .timing import bubble, optimizer_seconds, rates, stage_time

DP_BUCKET = 25 * 2**20  # bytes per gradient bucket (PyTorch DDP's default bucket_cap_mb = 25)


def _strides(lay: Layout) -> dict[str, tuple[int, int]]:
    """Group → (stride, size) in the rank order tp, cp, dp, pp (the tier a group's links are on)."""
    return {
        "tp": (1, lay.tp),
        "cp": (lay.tp, lay.cp),
        "ep": (lay.tp * lay.cp, lay.ep),
        "dp": (lay.tp, lay.cp * lay.dp),
        "pp": (lay.tp * lay.cp * lay.dp, 2),
    }


def _buckets(nbytes: float) -> int:
    return max(1, -(-int(nbytes) // DP_BUCKET))


def _tp_calls(stage: Any, t: Training, training: bool) -> int:
    """Tensor-parallel collectives one micro-batch runs on a stage: one per row-parallel output in the forward
    pass (again under full recompute), one per column-parallel input in the backward pass."""
    g = sum(c for p, c in stage.ops if p.tp_fwd)
    f = sum(c for p, c in stage.ops if p.tp_bwd)
    g_blocks = sum(c for p, c in stage.ops if p.tp_fwd and p.in_block)
    return g + (f + (g_blocks if t.recompute == "full" else 0) if training else 0)


@dataclass
class LayoutCost:
    layout: Layout
    training: Training
    is_training: bool
    micro_batches: int  # per data-parallel replica and step
    memory: dict[str, int]  # the stage that needs most
    memory_stage: int
    stages: list[dict[str, int]]
    comm: dict[str, int]  # collective → bytes per device per step (the stage that sends most)
    comm_by_group: dict[str, dict[str, int]]
    bubble: float
    step_time: float | None = None
    mfu: float | None = None
    time: dict[str, float] = field(default_factory=dict)  # compute and each group's seconds per step
    model_flops: int = 0  # per step, all devices
    fits: bool | None = None
    breakdown: dict[str, Any] = field(default_factory=dict)  # where the step's time goes (step_breakdown)

    def to_dict(self) -> dict[str, Any]:
        t = self.training
        settings: dict[str, Any] = {"micro_batch": t.micro_batch, "global_batch": t.global_batch}
        settings["micro_batches"] = self.micro_batches
        if self.is_training:
            settings |= {"zero": t.zero, "recompute": t.recompute}
            settings |= {"pipeline_schedule": t.schedule, "virtual_stages": t.virtual_stages}
        settings["sequence_parallel"] = t.sequence_parallel
        return {
            "layout": self.layout.to_dict(),
            "settings": settings,
            "per_device": {"memory": dict(self.memory), "stage": self.memory_stage, "fits": self.fits},
            "stages": [dict(s) for s in self.stages],
            "comm": dict(self.comm),
            "comm_by_group": {g: dict(v) for g, v in self.comm_by_group.items()},
            "bubble": self.bubble,
            "step_time": self.step_time,
            "time": dict(self.time),
            "model_flops": self.model_flops,
            "mfu": self.mfu,
            "time_breakdown": {k: v for k, v in self.breakdown.items() if k not in ("step_time", "parts")},
        }


class Estimator:
    """Costs of layouts of one profiled graph; the weights of each (tp, pp, ep) split are computed once."""

    def __init__(self, prof: GraphProfile, device: Device | None = None, link: Interconnect | None = None):
        self.prof, self.device, self.link = prof, device, link
        self._weights: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
        self._blocks: dict[tuple[int, int], BlockWeights] = {}
        self._representatives: dict[tuple[int, int, int], list[int]] = {}
        self._shards = param_shards(prof.graph)

    def weights(self, lay: Layout) -> list[tuple[int, int]]:
        key = (lay.tp, lay.pp, lay.ep)
        if key not in self._weights:
            split = (lay.tp, lay.ep)
            if split not in self._blocks:
                self._blocks[split] = block_weights(self.prof.graph, tp=lay.tp, ep=lay.ep, shards=self._shards)
            self._weights[key] = weights_per_stage(self.prof.graph, pp=lay.pp, by_block=self._blocks[split])
        return self._weights[key]

    def memory(self, lay: Layout, t: Training, micro_batches: int) -> list[dict[str, int]]:
        return stage_memory(self.prof, self.weights(lay), lay, t, micro_batches, self.prof.training, None,
                            *self._memory_model(t))  # fmt: skip

    def _memory_model(self, t: Training) -> tuple[str, Any]:
        """The attention kernel (flag, else the device profile's; without a device the materialised scores of
        Korthikanti's accounting) and the runtime's own memory (device profile data)."""
        if self.device is None:
            return t.attention or "math", None
        return t.attention or self.device.attention, self.device.runtime

    def peak_memory(self, lay: Layout, t: Training, micro_batches: int) -> int:
        """The most memory any device of the layout needs (only stages unlike an earlier one are evaluated)."""
        key = (lay.tp, lay.pp, lay.ep)
        if key not in self._representatives:
            self._representatives[key] = representatives(self.prof, self.weights(lay), lay.pp)
        only = self._representatives[key]
        return max(s["total"] for s in stage_memory(self.prof, self.weights(lay), lay, t, micro_batches,
                                                    self.prof.training, only, *self._memory_model(t)))  # fmt: skip

    def comms(self, lay: Layout, t: Training, m: int) -> list[dict[str, dict[str, float]]]:
        """Per stage, group → collective → bytes; a stage holding what another holds shares its dict."""
        prof, weights = self.prof, self.weights(lay)
        out, same = [], {}
        for s in range(lay.pp):
            key = (prof.stages(lay.pp)[s].key, weights[s], s == 0, s == lay.pp - 1)
            if key not in same:
                same[key] = C.stage_comm(prof, weights[s], s, lay, t, m, prof.training)
            out.append(same[key])
        return out

    def step_time(
        self, lay: Layout, t: Training, m: int, comms: list[dict[str, dict[str, float]]] | None = None
    ) -> tuple[float, dict[str, float]]:
        """Seconds per step and its exposed parts (see ``step_breakdown``)."""
        b = self.step_breakdown(lay, t, m, comms)
        return b["step_time"], b["parts"]

    def step_breakdown(
        self, lay: Layout, t: Training, m: int, comms: list[dict[str, dict[str, float]]] | None = None
    ) -> dict[str, Any]:
        """Where a step's time goes.

        Per stage and micro-batch: compute (``timing.py``) plus the exposed tensor-parallel (unless async-TP
        hides it behind the stage's GEMMs), expert all-to-all and pipeline p2p seconds; the context-parallel
        ring is overlapped with the attention kernels (exposed: what outlasts them). The schedule turns the
        stage slots into the step: M slots of the slowest stage plus the others' fill and drain divided by
        the virtual stages (1F1B, GPipe: 1; interleaved: V; zero-bubble ZB-H1: 3). Then the data-parallel
        gradient sync, overlapped with the last micro-batch's backward (exposed: what outlasts it, at least the
        last bucket); ZeRO-3 all-gathers are prefetched under each micro-batch's compute. Then the optimizer.
        """
        assert self.device is not None and self.link is not None
        comms = comms if comms is not None else self.comms(lay, t, m)
        prof, link, training = self.prof, self.link, self.prof.training
        r = rates(self.device, prof.dtype, prof.elem_bytes, t.attention)
        strides = _strides(lay)
        slots: list[float] = []
        per_stage: list[dict[str, Any]] = []
        for s in range(lay.pp):
            st = stage_time(prof, s, lay, t, r, training)
            groups = comms[s]
            calls = self.prof.stages(lay.pp)[s]
            exposed: dict[str, float] = {}
            notes: dict[str, str] = {}
            if "tp" in groups:
                n = lay.tp
                steps = _tp_calls(calls, t, training) * 2 * (n - 1)
                sec = link.seconds(*strides["tp"], sum(groups["tp"].values()) / m, steps)
                matmul = (st.by_category or {}).get("matmul", 0.0)
                if t.async_tp:
                    exposed["tp"] = max(0.0, sec - matmul)
                    notes["tp"] = "async-TP: overlapped with the GEMMs beside each collective"
                else:
                    exposed["tp"] = sec
                    notes["tp"] = "exposed: each collective waits for the GEMM before it and blocks the one after"
            if "cp" in groups:
                sec = link.seconds(*strides["cp"], sum(groups["cp"].values()) / m, 3 * (lay.cp - 1))
                attn = (st.by_category or {}).get("attention", 0.0)
                exposed["cp"] = max(0.0, sec - attn)
                notes["cp"] = "ring exchange of K/V overlapped with the attention kernels"
            if "ep" in groups:
                exposed["ep"] = link.seconds(*strides["ep"], sum(groups["ep"].values()) / m, 4 * (lay.ep - 1))
                notes["ep"] = "exposed: dispatch and combine wait for the router and the experts"
            if "pp" in groups:
                chunks = t.virtual_stages if t.schedule == "interleaved-1f1b" else 1  # a send per model chunk
                exposed["pp"] = chunks * link.seconds(*strides["pp"], sum(groups["pp"].values()) / m, 2)
                notes["pp"] = "exposed: each micro-batch's boundary send/receive sits between its stage slots"
            slot = st.total + sum(exposed.values())
            slots.append(slot)
            per_stage.append({"compute": st, "exposed": exposed, "notes": notes})
        worst = max(range(lay.pp), key=lambda i: slots[i])
        divide = t.virtual_stages if t.schedule == "interleaved-1f1b" else 3 if t.schedule == "zero-bubble" else 1
        fill = (sum(slots) - slots[worst]) / divide
        pipeline = m * slots[worst] + fill
        # data parallel: the stage whose sync outlasts its overlap most
        dp_exposed, dp_note, opt = 0.0, "", 0.0
        weights = self.weights(lay)
        n_dense = lay.dp * lay.cp
        for s in range(lay.pp):
            dense, expert = weights[s]
            local = dense // (n_dense if t.zero >= 1 else 1) + expert
            opt = max(opt, optimizer_seconds(local, r) if training else 0.0)
            groups = comms[s]
            if "dp" not in groups:
                continue
            st = per_stage[s]["compute"]
            dp = groups["dp"]
            n = lay.dp * lay.cp
            if t.zero >= 3:
                gather = link.seconds(*strides["dp"], dp.get("all_gather", 0.0) / m, 2 * (n - 1))
                reduce = link.seconds(*strides["dp"], dp.get("reduce_scatter", 0.0), n - 1)
                e = m * max(0.0, gather - st.total) + max(0.0, reduce - st.backward)
                note = "FSDP: all-gathers prefetched under each micro-batch's compute, reduce-scatter under backward"
            else:
                total = link.seconds(*strides["dp"], sum(dp.values()), 2 * (n - 1) * _buckets(sum(dp.values())))
                tail = total / _buckets(sum(dp.values()))
                if t.dp_overlap:
                    e = max(total - st.backward, tail)
                    note = "gradient sync bucketed and overlapped with the last micro-batch's backward"
                else:
                    e, note = total, "gradient sync after the backward pass (not overlapped)"
            if e >= dp_exposed:
                dp_exposed, dp_note = e, note
        step = pipeline + dp_exposed + opt
        ws = per_stage[worst]
        st = ws["compute"]
        parts = {"compute": m * st.total} | {g: v * m for g, v in ws["exposed"].items()}
        parts["bubble"] = fill
        if dp_exposed:
            parts["dp"] = dp_exposed
        parts["optimizer"] = opt
        breakdown = {
            "step_time": step,
            "parts": parts,
            "compute_by_category": {k: v * m for k, v in (st.by_category or {}).items()},
            "memory_bound": st.memory_bound * m,
            "passes": {"forward": st.forward * m, "backward": st.backward * m, "recompute": st.recompute * m},
            "exposed_comm": {g: v * m for g, v in ws["exposed"].items()} | ({"dp": dp_exposed} if dp_exposed else {}),
            "bubble": fill,
            "optimizer": opt,
            "overlap": ws["notes"] | ({"dp": dp_note} if dp_note else {}),
            "slowest_stage": worst,
            "schedule": t.schedule,
            "attention": r.attention,
        }
        return breakdown

    def cost(self, lay: Layout, t: Training, micro_batches: int) -> LayoutCost:
        prof, training = self.prof, self.prof.training
        stages = self.memory(lay, t, micro_batches)
        worst = max(range(len(stages)), key=lambda s: stages[s]["total"])
        comms = self.comms(lay, t, micro_batches)
        totals = [sum(sum(v.values()) for v in c.values()) for c in comms]
        loud = max(range(lay.pp), key=lambda s: totals[s])
        flops = prof.forward_flops * t.global_batch * (3 if training else 1)
        out = LayoutCost(
            layout=lay,
            training=t,
            is_training=training,
            micro_batches=micro_batches,
            memory=stages[worst],
            memory_stage=worst,
            stages=stages,
            comm=C.by_collective(comms[loud]),
            comm_by_group={g: {k: round(v) for k, v in c.items()} for g, c in comms[loud].items()},
            bubble=bubble(lay.pp, micro_batches, t.schedule, t.virtual_stages),
            model_flops=flops,
        )
        if self.device is not None:
            out.fits = out.memory["total"] <= self.device.memory
            if self.link is not None:
                out.breakdown = self.step_breakdown(lay, t, micro_batches, comms)
                out.step_time, out.time = out.breakdown["step_time"], out.breakdown["parts"]
                peak = self.device.peak(prof.dtype)
                out.mfu = flops / (out.step_time * lay.devices * peak) if out.step_time else None
        return out
