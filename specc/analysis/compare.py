"""Several specs side by side, at one size or along a sweep."""

from __future__ import annotations

from typing import Any

from . import fmt
from .report import Report
from .report_json import flatten, report_dict
from .report_views import quadratic
from .sections import Section
from .sweep import Sweep


def _row(s: Section, label: str, values: list[int | float | None], human: Any = fmt.si) -> None:
    s.add(label, *("-" if v is None else human(v) for v in values))


def _per_token(r: Report) -> float | None:
    """KV-cache bytes per cached token of one sequence (the cache at the analysed length / (B · length))."""
    n = r.settings.kv_len
    cache = r.memory.get("kv_cache")
    return cache / (r.settings.batch * n) if n and cache else None


def compare_sections(reports: list[Report]) -> list[Section]:
    names = [r.name for r in reports]
    p = Section("Parameters", ["", *names])
    p.add("family", *(r.family for r in reports))
    for key in ("total", "active", "embedding", "non_embedding"):
        _row(p, key.replace("_", "-"), [getattr(r.params, key) for r in reports], fmt.count)

    f = Section("Forward FLOPs", ["", *names])
    _row(f, "total", [r.forward.total for r in reports], fmt.flops)
    _row(f, "matmul", [r.forward.total_matmul for r in reports], fmt.flops)
    _row(f, "non-matmul", [r.forward.total_other for r in reports], fmt.flops)
    _row(f, "causal-useful total", [r.useful.total for r in reports], fmt.flops)
    _row(f, "attention N² (QK+softmax+AV)", [quadratic(r.forward) for r in reports], fmt.flops)
    cats: list[str] = []
    for r in reports:
        cats += [c for c in r.forward.categories() if c not in cats]
    for c in cats:
        _row(f, f"  {c}", [r.forward.by_category().get(c) for r in reports], fmt.flops)
    _row(f, "training step", [r.training_flops for r in reports], fmt.flops)
    _row(f, "decode step", [r.decode.total if r.decode else None for r in reports], fmt.flops)
    _row(f, "attention overtakes at N", [r.crossover[0] for r in reports], lambda x: f"{x:,.0f}")

    m = Section("Memory", ["", *names])
    items: list[str] = []
    for r in reports:
        items += [k for k in r.memory if k not in items]
    for k in items:
        _row(m, k, [r.memory.get(k) for r in reports], fmt.nbytes)
        if k == "kv_cache":  # what one more token of context costs to keep (MLA: its latent, not per-head K/V)
            _row(m, "kv_cache per token", [_per_token(r) for r in reports], fmt.nbytes)
    sections = [p, f, m]
    if any(r.prefill for r in reports):
        t = Section("Roofline", ["", *names])
        _row(t, "prefill ≥", [r.prefill.lower_bound_s if r.prefill else None for r in reports], fmt.seconds)
        _row(
            t, "decode step ≥", [r.decode_phase.lower_bound_s if r.decode_phase else None for r in reports], fmt.seconds
        )
        _row(
            t,
            "tokens/s ≤",
            [r.settings.batch / r.decode_phase.lower_bound_s if r.decode_phase else None for r in reports],
            lambda x: f"{x:,.0f}",
        )
        sections.append(t)
    return sections


def compare_dict(reports: list[Report]) -> dict[str, Any]:
    dicts = [report_dict(r) for r in reports]
    conventions = dicts[0].pop("conventions")
    for d in dicts[1:]:
        d.pop("conventions")
    return {"reports": dicts, "conventions": conventions}


def compare_csv_rows(reports: list[Report]) -> list[list[object]]:
    """One row per dotted key (roofline per-op lists and conventions left out), one column per spec."""
    flat = [dict(flatten({k: v for k, v in report_dict(r).items() if k != "conventions"})) for r in reports]
    keys: list[str] = []
    for f in flat:
        keys += [k for k in f if k not in keys and ".ops." not in k]
    return [["key", *(r.name for r in reports)], *([k, *(f.get(k, "") for f in flat)] for k in keys)]


def compare_sweep_sections(sweeps: list[Sweep]) -> list[Section]:
    names = [sw.reports[0].name for sw in sweeps]
    var = sweeps[0].variable
    out = []
    for title, get, human in (
        ("Forward FLOPs", lambda r: r.forward.total, fmt.flops),
        ("Attention N² share", lambda r: quadratic(r.forward) / r.forward.total, lambda x: f"{100 * x:.1f}%"),
        ("Activations kept for backward", lambda r: r.memory["activations"], fmt.nbytes),
        ("KV cache / decode state", lambda r: r.memory["kv_cache"], fmt.nbytes),
    ):
        s = Section(f"{title} against {var}", [var, *names])
        for i, v in enumerate(sweeps[0].values):
            s.add(f"{v:,}", *(human(get(sw.reports[i])) for sw in sweeps))
        out.append(s)
    return out


def compare_sweep_dict(sweeps: list[Sweep]) -> dict[str, Any]:
    return {
        "sweep": {"variable": sweeps[0].variable, "values": sweeps[0].values},
        "specs": [sw.to_dict() for sw in sweeps],
    }


def compare_sweep_csv_rows(sweeps: list[Sweep]) -> list[list[object]]:
    names = [sw.reports[0].name for sw in sweeps]
    head = [sweeps[0].variable]
    for n in names:
        head += [f"{n}.flops.forward.total", f"{n}.memory.activations", f"{n}.memory.kv_cache"]
    rows: list[list[object]] = [head]
    for i, v in enumerate(sweeps[0].values):
        row: list[object] = [v]
        for sw in sweeps:
            r = sw.reports[i]
            row += [r.forward.total, r.memory["activations"], r.memory["kv_cache"]]
        rows.append(row)
    return rows
