"""Sections (tables with notes) of one report, for the table and markdown formats."""

from __future__ import annotations

from . import constants as C
from . import fmt
from .crossover import QUADRATIC
from .kind_costs import kinds_section
from .op_costs import Totals
from .report import Report
from .sections import Section

MATMUL_ONLY = {"qk", "av", "cross_qk", "cross_av", "lm_head", "head", "router"}
MEMORY_NOTES = {
    "weights": "parameters × dtype bytes",
    "gradients": "one per parameter, dtype bytes",
    "optimizer_states": f"{C.OPTIMIZER}: fp32 master + m + v (mixed precision) or m + v (fp32)",
    "activations": "kept for backward, no recompute, attention materialised (Korthikanti accounting, from the graph)",
    "activations_fused": "same with fused (flash) attention: no N² terms",
    "activations_korthikanti": "Σ_layers s·b·h·(34 + 5·a·s/h) (16-bit, with dropout masks)",
    "activations_training": "activations under the chosen recomputation",
    "attention_scores_materialized": "one layer's score matrix B·H·N_q·N_k",
    "attention_scores_materialized_all_layers": "all layers (what training keeps)",
    "attention_scores_fused": "fused kernel: B·H·N_q fp32 log-sum-exp per layer",
    "kv_cache": "2·layers·kv_heads·D_H·N·B·bytes, N ≤ window / chunk per layer (MLA: layers·(kv_rank + rope)·N·B·"
    "bytes; RNN: encoder states, keys, state)",
    "inference_total": "weights + KV cache",
    "training_total": "weights + gradients + optimizer + activations",
}


def title(r: Report) -> str:
    s = r.settings
    n = f"N={s.seq}" + (f", N_dec={s.dec_seq}" if s.dec_seq is not None else "")
    mode = "training" + (f" (recompute {s.recompute})" if s.recompute != "none" else "") if s.training else "inference"
    return f"{r.name} — {r.family} ({r.task}) · B={s.batch}, {n} · {s.dtype} · {mode}"


def _kind(t: Totals, cat: str) -> str:
    mm, other = t.matmul.get(cat, 0), t.other.get(cat, 0)
    if mm and other:
        return "matmul + elementwise"
    return "matmul" if mm or cat in MATMUL_ONLY else "non-matmul"


def params_section(r: Report) -> Section:
    p = r.params
    s = Section("Parameters", ["", "count", ""])
    s.add("total", fmt.count(p.total), fmt.si(p.total))
    if p.reference:  # an imported model: the reference implementation's count differs from what specc stores
        s.add("stored by specc", fmt.count(p.stored), fmt.si(p.stored))
        if p.frozen:
            s.add("frozen (computed by specc)", fmt.count(p.frozen), fmt.si(p.frozen))
        s.notes.append(f"total counts parameters as {p.reference} does (num_parameters()); see params.py")
    s.add("active per token", fmt.count(p.active), fmt.si(p.active))
    s.add("embedding (token/position tables)", fmt.count(p.embedding), fmt.si(p.embedding))
    s.add("non-embedding", fmt.count(p.non_embedding), fmt.si(p.non_embedding))
    s.add("output head (untied)", fmt.count(p.head), fmt.si(p.head))
    if p.active != p.stored:
        s.notes.append("active: MoE experts counted top-k of E; everything else always active")
    return s


def flops_section(r: Report) -> Section:
    f, u = r.forward, r.useful
    stacks = list(r.per_layer)
    per = [f"{st}/layer" if len(stacks) > 1 else "per layer" for st in stacks]
    masked = f.total != u.total
    cols = ["category", "type", *per, "total", "%"] + (["causal-useful"] if masked else [])
    s = Section("Forward FLOPs", cols, left=2)
    for cat in f.categories():
        cells = []
        for st in stacks:
            n, t = r.per_layer[st]
            v = t.matmul.get(cat, 0) + t.other.get(cat, 0)
            cells.append(f"{fmt.flops(v)} ×{n}" if cat in t.matmul and v else "-")
        total = f.matmul[cat] + f.other[cat]
        extra = [fmt.flops(u.matmul[cat] + u.other[cat])] if masked else []
        s.add(cat, _kind(f, cat), *cells, fmt.flops(total), fmt.pct(total, f.total), *extra)
    blank = ["" for _ in stacks]
    s.add(
        "matmul",
        "",
        *blank,
        fmt.flops(f.total_matmul),
        fmt.pct(f.total_matmul, f.total),
        *([fmt.flops(u.total_matmul)] if masked else []),
    )
    s.add(
        "non-matmul",
        "",
        *blank,
        fmt.flops(f.total_other),
        fmt.pct(f.total_other, f.total),
        *([fmt.flops(u.total_other)] if masked else []),
    )
    s.add("forward total", "", *blank, fmt.flops(f.total), "100%", *([fmt.flops(u.total)] if masked else []))
    mult = C.TRAINING_MULTIPLIER[r.settings.recompute]
    s.add(f"training step (×{mult})", "", *blank, fmt.flops(r.training_flops), "", *([""] if masked else []))
    if r.decode is not None:
        s.add(
            f"decode step (N_k={r.settings.kv_len})",
            "",
            *blank,
            fmt.flops(r.decode.total),
            "",
            *([""] if masked else []),
        )
    s.notes.append(f"exact: forward {f.total:,} FLOPs, of which matmul {f.total_matmul:,} (full count)")
    if masked:
        s.notes.append(
            f"causal-useful (visible pairs only): {u.total:,}; the full count is what FlopCounterMode reports"
        )
    full, useful = r.crossover
    if full:
        s.notes.append(
            f"attention (QKᵀ + softmax + AV) overtakes all other terms at N ≈ {full:,.0f} (full count)"
            + (f", {useful:,.0f} (causal-useful)" if useful and masked else "")
        )
    return s


def shapes_section(r: Report) -> Section:
    s = Section(
        "Attention matmuls (one layer, per sequence; FLOPs include the batch)",
        ["stack", "step", "shape", f"B={r.settings.batch}", "FLOPs/layer"],
        left=4,
    )
    for m in r.shapes:
        s.add(m.stack, m.step, m.symbolic, m.numeric, fmt.flops(m.flops))
    return s


def memory_section(r: Report) -> Section:
    s = Section("Memory", ["item", "bytes", "", "what"], text_last=True)
    for k, v in r.memory.items():
        s.add(k, fmt.count(v), fmt.nbytes(v), MEMORY_NOTES.get(k, ""))
    return s


def recurrent_section(r: Report) -> Section:
    s = Section("Recurrent", ["", "FLOPs", ""])
    assert r.recurrent is not None
    for k, v in r.recurrent.items():
        s.add(k.replace("_", " "), fmt.count(v), fmt.flops(v))
    s.notes.append("recurrent cost grows as O(N); attention adds O(N) per decoder step (O(N·N_dec) in all)")
    return s


def roofline_sections(r: Report) -> list[Section]:
    assert r.device is not None and r.prefill is not None
    d, s = r.device, r.settings
    peak = d.peak(s.dtype)
    summary = Section(f"Roofline on {d.name}", ["", "prefill"] + (["decode step"] if r.decode_phase else []))
    phases = [r.prefill] + ([r.decode_phase] if r.decode_phase else [])
    rows = [
        ("FLOPs", lambda p: fmt.flops(p.flops)),
        ("bytes that must move", lambda p: fmt.nbytes(p.min_bytes)),
        ("compute time", lambda p: fmt.seconds(p.compute_s)),
        ("memory time", lambda p: fmt.seconds(p.memory_s)),
        ("lower bound", lambda p: fmt.seconds(p.lower_bound_s)),
        ("bound", lambda p: p.bound),
        ("Σ per-op roofline (unfused)", lambda p: fmt.seconds(p.per_op_s)),
        ("tokens/s upper bound", lambda p: f"{p.tokens / p.lower_bound_s:,.0f}" if p.lower_bound_s else "-"),
    ]
    for label, fn in rows:
        summary.add(label, *(fn(p) for p in phases))
    need = r.memory["training_total"] if s.training else r.memory["inference_total"]
    fits = "fits" if need <= d.memory else "does NOT fit"
    what = "training" if s.training else "weights + KV cache"
    summary.notes += [
        f"{d.name}: {fmt.si(peak, 'FLOP/s')} {s.dtype} matmul, {fmt.si(d.vector_flops, 'FLOP/s')} vector, "
        f"{fmt.si(d.bandwidth, 'B/s')}, {fmt.nbytes(d.memory)}; ridge {peak / d.bandwidth:,.0f} FLOP/B",
        f"memory: {fmt.nbytes(need)} needed ({what}) → {fits} in {fmt.nbytes(d.memory)}",
        "decode step: one new token per sequence attending to N_k cached keys; weights read once per step",
    ]
    ops = Section(
        "Roofline per op (first layer and unrepeated ops)",
        ["op", "category", "FLOP/B", "bound", "time"] + (["decode FLOP/B", "bound", "time"] if r.decode_phase else []),
        left=2,
    )
    dec = {o.name: o for o in r.decode_phase.ops} if r.decode_phase else {}
    for o in r.prefill.ops:
        if not _representative(o.name):
            continue
        cells = [f"{o.intensity:,.1f}", o.bound, fmt.seconds(o.time_s)]
        if r.decode_phase:
            x = dec.get(o.name)
            cells += [f"{x.intensity:,.1f}", x.bound, fmt.seconds(x.time_s)] if x else ["-", "-", "-"]
        ops.add(o.name, o.category, *cells)
    return [summary, ops]


def _representative(name: str) -> bool:
    parts = name.split(".")
    if "blocks" in parts:
        i = parts.index("blocks")
        return i + 1 < len(parts) and parts[i + 1] == "0"
    return True


def conventions_section() -> Section:
    return Section("Conventions", [], notes=[f"{k}: {v}" for k, v in C.CONVENTIONS.items()])


def report_sections(r: Report) -> list[Section]:
    out = [params_section(r), flops_section(r)]
    if r.shapes:
        out.append(shapes_section(r))
    if r.per_kind:
        out.append(kinds_section(r.per_kind))
    if r.recurrent:
        out.append(recurrent_section(r))
    out.append(memory_section(r))
    if r.device is not None:
        out += roofline_sections(r)
    notes = Section("Notes", [], notes=list(r.notes)) if r.notes else None
    return [*out, *([notes] if notes else []), conventions_section()]


def quadratic(t: Totals) -> int:
    return t.sum_of(QUADRATIC)
