"""Sweeps: one report per value of seq / batch / dec_seq / kv_len (``seq=512,1024,...,131072``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..ir.graph import LayerGraph
from . import fmt
from .report import Report, analyze
from .report_json import report_dict
from .report_views import quadratic
from .sections import Section

VARIABLES = ("seq", "batch", "dec_seq", "kv_len")
MAX_POINTS = 256
DEFAULT = "seq=128,256,...,131072"


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``seq=512,1024,...,131072`` → ("seq", [512, 1024, 2048, …, 131072]); ``...`` continues the pattern
    of the two values before it (geometric when the second is a multiple of the first, else arithmetic)."""
    var, sep, rest = text.partition("=")
    var = var.strip()
    hint = "write e.g. --sweep seq=512,1024,...,131072"
    if not sep or var not in VARIABLES:
        raise SpecError(f"bad sweep '{text}'", file="--sweep", hint=f"sweep one of {', '.join(VARIABLES)}; {hint}")
    items = [t.strip() for t in rest.split(",") if t.strip()]
    values: list[int] = []
    for i, item in enumerate(items):
        if item in ("...", "…"):
            if len(values) < 2 or i + 1 >= len(items):
                raise SpecError(
                    f"'...' needs two values before it and one after in '{text}'", file="--sweep", hint=hint
                )
            continue
        n = _int(item, text)
        if i > 0 and items[i - 1] in ("...", "…"):
            values += _continue(values[-2], values[-1], n, text)
        values.append(n)
    if not values:
        raise SpecError(f"sweep '{text}' has no values", file="--sweep", hint=hint)
    if len(values) > MAX_POINTS:
        raise SpecError(f"sweep '{text}' has {len(values)} points (at most {MAX_POINTS})", file="--sweep")
    return var, values


def _int(item: str, text: str) -> int:
    try:
        n = int(item.replace("_", ""))
    except ValueError:
        raise SpecError(f"'{item}' in sweep '{text}' is not an integer", file="--sweep") from None
    if n < 1:
        raise SpecError(f"sweep values must be positive, got {n}", file="--sweep")
    return n


def _continue(a: int, b: int, end: int, text: str) -> list[int]:
    """Values strictly between ``b`` and ``end`` following a, b (``end`` is appended by the caller): geometric
    when b is a multiple of a and ``end`` lies on that progression, else arithmetic."""
    if b <= a:
        raise SpecError(f"'...' in '{text}' needs increasing values", file="--sweep")
    ratio, step = (b // a if b % a == 0 else 0), b - a
    geometric = ratio >= 2 and _on_progression(b, ratio, end)
    if not geometric and (end - b) % step and ratio >= 2:
        geometric = True  # neither fits: keep the obvious doubling-style pattern, end is appended as given
    out: list[int] = []
    x = b * ratio if geometric else b + step
    while x < end and len(out) <= MAX_POINTS:
        out.append(x)
        x = x * ratio if geometric else x + step
    return out


def _on_progression(b: int, ratio: int, end: int) -> bool:
    x = b
    while x < end:
        x *= ratio
    return x == end


@dataclass
class Sweep:
    variable: str
    values: list[int]
    reports: list[Report]

    def to_dict(self) -> dict[str, Any]:
        first = self.reports[0]
        points = []
        for v, r in zip(self.values, self.reports, strict=True):
            d = report_dict(r)
            d.pop("conventions")
            points.append({"value": v, **d})
        return {
            "sweep": {"variable": self.variable, "values": list(self.values)},
            "spec": {"name": first.name, "family": first.family, "task": first.task},
            "attention_crossover": {"seq": first.crossover[0], "seq_causal_useful": first.crossover[1]},
            "points": points,
        }


def run_sweep(g: LayerGraph, variable: str, values: list[int], **kwargs: Any) -> Sweep:
    symbols = {str(d) for i in g.inputs.values() for d in i.shape}
    needed = {"seq": "N", "dec_seq": "N_dec"}.get(variable)
    if needed and needed not in symbols:
        raise SpecError(
            f"{g.meta.get('name')} has no {variable} to sweep (its inputs are fixed-size)",
            file="--sweep",
            hint="sweep batch= instead",
        )
    reports = []
    for i, v in enumerate(values):
        reports.append(analyze(g, **{**kwargs, variable: v, "crossover": i == 0 and kwargs.get("crossover", True)}))
    return Sweep(variable, values, reports)


Column = tuple[str, Callable[[Report], int | float | None], Callable[[Any], str]]


def columns(reports: list[Report]) -> list[Column]:
    """(label, raw value, human form) for the sweep table and CSV."""
    cols: list[Column] = [
        ("forward FLOPs", lambda r: r.forward.total, fmt.flops),
        ("matmul", lambda r: r.forward.total_matmul, fmt.flops),
        ("attention N² (QK+softmax+AV)", lambda r: quadratic(r.forward), fmt.flops),
        ("other (linear in N)", lambda r: r.forward.total - quadratic(r.forward), fmt.flops),
        ("attention share", lambda r: round(quadratic(r.forward) / r.forward.total, 4), lambda x: f"{100 * x:.1f}%"),
        ("causal-useful FLOPs", lambda r: r.useful.total, fmt.flops),
        ("activations", lambda r: r.memory["activations"], fmt.nbytes),
        ("activations fused", lambda r: r.memory["activations_fused"], fmt.nbytes),
    ]
    if any("attention_scores_materialized" in r.memory for r in reports):
        cols += [
            ("scores/layer materialised", lambda r: r.memory.get("attention_scores_materialized", 0), fmt.nbytes),
            ("scores/layer fused", lambda r: r.memory.get("attention_scores_fused", 0), fmt.nbytes),
        ]
    cols.append(("KV cache", lambda r: r.memory["kv_cache"], fmt.nbytes))
    if reports[0].prefill is not None:
        cols.append(("prefill ≥", lambda r: r.prefill.lower_bound_s if r.prefill else None, fmt.seconds))
    if reports[0].decode_phase is not None:
        cols.append(("decode step ≥", lambda r: r.decode_phase.lower_bound_s if r.decode_phase else None, fmt.seconds))
    return cols


def sweep_section(sw: Sweep) -> Section:
    cols = columns(sw.reports)
    s = Section(f"Sweep over {sw.variable}", [sw.variable, *(c[0] for c in cols)])
    for v, r in zip(sw.values, sw.reports, strict=True):
        s.add(f"{v:,}", *(_cell(c, r) for c in cols))
    full, useful = sw.reports[0].crossover
    if full:
        s.notes.append(
            f"attention (QKᵀ + softmax + AV) overtakes everything else at N ≈ {full:,.0f}"
            + (f" (causal-useful: {useful:,.0f})" if useful and useful != full else "")
        )
    noted = next((r for r in sw.reports if r.notes), None)
    if noted is not None:
        first = sw.values[sw.reports.index(noted)]
        s.notes += [f"{sw.variable}={first:,} and up: {n}" for n in noted.notes]
    return s


def _cell(c: Column, r: Report) -> str:
    v = c[1](r)
    return "-" if v is None else c[2](v)


def sweep_csv_rows(sw: Sweep) -> list[list[object]]:
    cols = columns(sw.reports)
    rows: list[list[object]] = [[sw.variable, *(c[0] for c in cols)]]
    rows += [[v, *(c[1](r) for c in cols)] for v, r in zip(sw.values, sw.reports, strict=True)]
    return rows
