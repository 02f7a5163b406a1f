"""One layout's costs: per-device memory, communication, bubble, and with a device the step time and MFU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..devices import Device
from . import comm as C
from .layout import Layout, Training
from .links import Interconnect
from .memory import representatives, stage_memory
from .profile import GraphProfile
from .shard import BlockWeights, block_weights, param_shards, weights_per_stage
from .timing import bubble, group_seconds, stage_compute


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

    def to_dict(self) -> dict[str, Any]:
        t = self.training
        settings: dict[str, Any] = {"micro_batch": t.micro_batch, "global_batch": t.global_batch}
        settings["micro_batches"] = self.micro_batches
        if self.is_training:
            settings |= {"zero": t.zero, "recompute": t.recompute}
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
        return stage_memory(self.prof, self.weights(lay), lay, t, micro_batches, self.prof.training)

    def peak_memory(self, lay: Layout, t: Training, micro_batches: int) -> int:
        """The most memory any device of the layout needs (only stages unlike an earlier one are evaluated)."""
        key = (lay.tp, lay.pp, lay.ep)
        if key not in self._representatives:
            self._representatives[key] = representatives(self.prof, self.weights(lay), lay.pp)
        only = self._representatives[key]
        return max(s["total"] for s in stage_memory(self.prof, self.weights(lay), lay, t, micro_batches,
                                                    self.prof.training, only))  # fmt: skip

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
        """Seconds per step and its parts: (M + P − 1) slots of the slowest stage, then its dp traffic."""
        assert self.device is not None and self.link is not None
        comms = comms if comms is not None else self.comms(lay, t, m)
        slots = m + lay.pp - 1
        per_slot, parts, dp_s, seen = 0.0, {}, {}, set()
        for s in range(lay.pp):
            if id(comms[s]) in seen:
                continue
            seen.add(id(comms[s]))
            compute = stage_compute(self.prof, s, lay, t, self.device, self.prof.training)
            links = group_seconds({g: v for g, v in comms[s].items() if g != "dp"}, lay, self.link)
            slot = compute + sum(links.values()) / m
            if slot >= per_slot:
                per_slot = slot
                parts = {"compute": compute * slots} | {g: v / m * slots for g, v in links.items()}
            dp = group_seconds({g: v for g, v in comms[s].items() if g == "dp"}, lay, self.link)
            if sum(dp.values()) >= sum(dp_s.values()):
                dp_s = dp
        return per_slot * slots + sum(dp_s.values()), parts | dp_s

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
            bubble=bubble(lay.pp, micro_batches),
            model_flops=flops,
        )
        if self.device is not None:
            out.fits = out.memory["total"] <= self.device.memory
            if self.link is not None:
                out.step_time, out.time = self.step_time(lay, t, micro_batches, comms)
                peak = self.device.peak(prof.dtype)
                out.mfu = flops / (out.step_time * lay.devices * peak) if out.step_time else None
        return out
