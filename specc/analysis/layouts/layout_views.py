"""Table sections and JSON documents for ``--parallel`` and ``--plan``."""

from __future__ import annotations

from typing import Any

from .. import fmt
from ..sections import Section
from .comm import COLLECTIVES
from .device_memory import ITEMS
from .estimate import LayoutCost
from .layout import Layout
from .search import PlanResult, plan_dict

SCHEMA_VERSION = 1
MEMORY_NOTES = {
    "weights": "parameters this device holds (tp/pp/ep split; /N_d under ZeRO-3) × dtype bytes",
    "gradients": "one per parameter, dtype bytes (/N_d under ZeRO-2 and -3)",
    "optimizer_states": "Adam: fp32 master + m + v = 12 B/param mixed precision, 8 B fp32 (/N_d from ZeRO-1)",
    "activations": "Korthikanti et al. 2022 from the graph: /tp, /tp with SP, recompute; × micro-batches in flight",
    "kv_cache": "inference: the replica's G/dp sequences, KV heads / tp (MLA's latent whole), tokens / cp",
    "recompute_transient": "backward with recompute: one block's activations regenerated on top of what was kept",
    "optimizer_transient": "the optimizer step's fp32 gradient copy (4 B/param; sharded away from ZeRO-1)",
    "comm_buffers": "communication library buffers (device profile) + FSDP's gathered blocks (current + prefetch)",
    "runtime_context": "CUDA context, library workspaces, framework (device profile runtime.context)",
    "allocator_reserve": "caching allocator's reserve over what it hands out (device profile runtime.reserve)",
    "total": "",
}
CONVENTIONS = {
    "devices": "devices = tp × pp × cp × dp; ep ranks are carved out of dp; ranks ordered tp, cp, dp, pp",
    "weights": "per_device_weight_bytes: the IR's parameter tensors split as torch.distributed's tensor "
    "parallel plan splits them (column / row / vocabulary-parallel, norms replicated), spec dtype",
    "zero": "ZeRO (Rajbhandari et al. 2020): N_d = dp × cp ranks hold the same weights (dp × cp / ep for experts)",
    "comm": "bytes each device sends per step with ring algorithms: all-reduce 2(n−1)/n·S, all-gather and "
    "reduce-scatter (n−1)/n·S, all-to-all (n−1)/n of what it holds, p2p its tensor",
    "bubble": "idle share with equal stages: (P − 1)/d / (M + (P − 1)/d), d = 1 for 1F1B and GPipe, V for "
    "interleaved 1F1B, 3 for zero-bubble (ZB-H1); M micro-batches per replica",
    "step_time": "per op: FLOPs at the matmul/vector unit's efficiency for its size and shape, bytes at the memory "
    "system's, combined by the device profile's rule (max + (1 − overlap)·min) plus launch overheads; backward 2× "
    "(flash attention 2.5×), recompute per policy; M slots of the slowest stage (compute + exposed tp/ep/pp "
    "collectives, cp overlapped with attention) + the others' fill/drain ÷ d; then the exposed dp sync "
    "(overlapped with backward; FSDP gathers prefetched) and the optimizer step. Collectives: steps × latency + "
    "bus bytes / (link bandwidth × efficiency) per tier",
    "mfu": "model FLOPs (3 × forward in training, no recompute, full attention count) / (step × devices × peak)",
}


def title(name: str, lay: Layout, c: LayoutCost, seq: int, dtype: str) -> str:
    mode = "training" if c.is_training else "inference"
    return f"{name} · {lay.text()} ({lay.devices} devices) · N={seq} · G={c.training.global_batch} · {dtype} · {mode}"


def layout_sections(c: LayoutCost, device: Any, link: Any) -> list[Section]:
    t, lay = c.training, c.layout
    setup = Section("Layout", ["", "value"])
    for k in ("tp", "pp", "dp", "ep", "cp"):
        setup.add(k, getattr(lay, k))
    setup.add("devices", lay.devices)
    setup.add("micro-batch", t.micro_batch)
    setup.add("micro-batches per step", c.micro_batches)
    setup.add("global batch", t.global_batch)
    if c.is_training:
        setup.add("ZeRO stage", t.zero)
        setup.add("recompute", t.recompute)
    setup.add("sequence parallel", "yes" if t.sequence_parallel else "no")
    mem = Section(f"Memory per device (pipeline stage {c.memory_stage})", ["item", "bytes", "", "what"], text_last=True)
    for k in c.memory:
        mem.add(k, fmt.count(c.memory[k]), fmt.nbytes(c.memory[k]), MEMORY_NOTES.get(k, ""))
    if device is not None:
        fits = "fits" if c.fits else "does NOT fit"
        need, have = fmt.nbytes(c.memory["total"]), fmt.nbytes(device.memory)
        mem.notes.append(f"{need} per device → {fits} in {device.name}'s {have}")
    comm = Section("Communication per device per step", ["collective", "bytes", "", "groups"], text_last=True)
    for k in COLLECTIVES:
        groups = ", ".join(f"{g} {fmt.nbytes(v[k])}" for g, v in c.comm_by_group.items() if v.get(k))
        comm.add(k, fmt.count(c.comm[k]), fmt.nbytes(c.comm[k]), groups or "-")
    step = Section("Step", ["", "value"])
    step.add("pipeline bubble", f"{100 * c.bubble:.1f}%")
    sections = [setup, mem, comm, step]
    if c.step_time is not None:
        step.add("step time", fmt.seconds(c.step_time))
        for k, v in c.time.items():
            step.add(f"  {k}", fmt.seconds(v))
        step.add("MFU", f"{100 * (c.mfu or 0):.1f}%")
        b = c.breakdown
        step.notes.append(
            f"{device.name} on {link.name}, attention {b['attention']}, schedule {b['schedule']}: the device "
            "profile's efficiency model (see conventions)"
        )
        sections.append(_time_section(c))
    else:
        step.notes.append("step time and MFU need --device (and optionally --interconnect)")
    return [*sections, conventions()]


def _time_section(c: LayoutCost) -> Section:
    """Where the step's time goes on the slowest stage."""
    b = c.breakdown
    s = Section(f"Where the time goes (stage {b['slowest_stage']}, per step)", ["part", "seconds", "share", "what"],
                text_last=True)  # fmt: skip
    total = c.step_time or 1.0

    def add(name: str, v: float, what: str) -> None:
        s.add(name, fmt.seconds(v), f"{100 * v / total:.1f}%", what)

    what = {"matmul": "linear layers (GEMMs)", "attention": "attention cores"}
    what["memory_bound"] = "norms, activations, residuals, embeddings"
    for cat, v in sorted(b["compute_by_category"].items(), key=lambda kv: -kv[1]):
        add(f"compute:{cat}", v, what.get(cat, ""))
    add("memory-bound ops", b["memory_bound"], "of the compute above: ops whose traffic outlasts their FLOPs")
    for k, v in b["passes"].items():
        add(f"pass:{k}", v, "")
    for g, v in b["exposed_comm"].items():
        add(f"exposed:{g}", v, b["overlap"].get(g, ""))
    add("bubble", b["bubble"], f"pipeline fill and drain ({b['schedule']})")
    add("optimizer", b["optimizer"], "Adam step (memory-bound)")
    return s


def conventions() -> Section:
    return Section("Conventions", [], notes=[f"{k}: {v}" for k, v in CONVENTIONS.items()])


def layout_document(head: dict[str, Any], c: LayoutCost, device: Any, link: Any) -> dict[str, Any]:
    par = c.to_dict()
    par["device"] = device.to_dict() if device is not None else None
    par["interconnect"] = link.to_dict() if link is not None else None
    return {"schema_version": SCHEMA_VERSION, **head, "parallel": par, "conventions": dict(CONVENTIONS)}


def plan_sections(r: PlanResult) -> list[Section]:
    cols = ["#", "tp", "pp", "dp", "ep", "cp", "zero", "micro-batch", "recompute", "memory", "step time", "MFU"]
    s = Section(f"Plans for {r.devices} × {r.device.name} (best {len(r.plans)} of {r.fitting} that fit)", cols)
    for i, c in enumerate(r.plans, 1):
        lay, t = c.layout, c.training
        s.add(
            i, lay.tp, lay.pp, lay.dp, lay.ep, lay.cp, t.zero if r.training else "-", t.micro_batch,
            t.recompute if r.training else "-", fmt.nbytes(c.memory["total"]),
            fmt.seconds(c.step_time or 0), f"{100 * (c.mfu or 0):.1f}%",
        )  # fmt: skip
    s.notes.append(
        f"{r.considered} layouts considered, {r.fitting} fit in {fmt.nbytes(r.device.memory)} "
        "(per-device total, with the device profile's runtime context, allocator reserve and buffers)"
    )
    s.notes.append(f"global batch {r.global_batch}; links: {r.link.name}; ranked by estimated step time")
    if r.excluded:
        left = ", ".join(f"{e.reason} ({e.layouts}, e.g. {e.example})" for e in r.excluded.values())
        s.notes.append(
            f"left out {sum(e.layouts for e in r.excluded.values())} layouts sized by the analyzer, not run by "
            f"specc train --parallel: {left}; analyze --parallel sizes any of them"
        )
    if not r.plans:
        s.notes.append("no layout fits: more devices, a smaller global batch, or a device with more memory")
    return [s, conventions()]


def plan_document(head: dict[str, Any], r: PlanResult) -> dict[str, Any]:
    d = r.to_dict()
    return {"schema_version": SCHEMA_VERSION, **head, "search": {k: v for k, v in d.items() if k != "plans"},
            "plans": d["plans"], "conventions": dict(CONVENTIONS)}  # fmt: skip


def plan_rows(r: PlanResult) -> list[list[Any]]:
    keys = ["tp", "pp", "dp", "ep", "cp", "zero", "micro_batch", "recompute", "step_time", "mfu"]
    rows: list[list[Any]] = [[*keys, *(f"memory.{k}" for k in ITEMS)]]
    for c in r.plans:
        d = plan_dict(c)
        rows.append([*(d[k] for k in keys), *(d["memory"][k] for k in ITEMS)])
    return rows
