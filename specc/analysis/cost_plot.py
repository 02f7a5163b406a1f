"""Cost against sequence length on log axes (matplotlib, written atomically)."""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_write, image_format
from .report_views import quadratic
from .sweep import Sweep


def _figure(title: str):  # -> (figure, (flops axis, memory axis))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    fig.suptitle(title)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    return fig, axes


def _save(fig, path: str) -> Path:  # type: ignore[no-untyped-def]
    import matplotlib.pyplot as plt

    fmt = image_format(path)
    fig.tight_layout()
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=120))
    finally:
        plt.close(fig)


def _positive(xs: list[int], ys: list[float]) -> tuple[list[int], list[float]]:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_sweep(sw: Sweep, path: str) -> Path:
    image_format(path)  # refuse a bad suffix before drawing
    rs, xs = sw.reports, sw.values
    r0 = rs[0]
    fig, (af, am) = _figure(f"{r0.name}: cost against {sw.variable} (B={r0.settings.batch}, {r0.settings.dtype})")
    series = {
        "forward total": [r.forward.total for r in rs],
        "attention N² terms (QKᵀ+softmax+AV)": [quadratic(r.forward) for r in rs],
        "other terms (linear in N)": [r.forward.total - quadratic(r.forward) for r in rs],
        "attention N², causal-useful": [quadratic(r.useful) for r in rs],
    }
    styles = ["-", "-", "-", "--"]
    for (label, ys), st in zip(series.items(), styles, strict=True):
        af.plot(*_positive(xs, ys), st, marker="o", ms=3, label=label)
    full = r0.crossover[0]
    if sw.variable == "seq" and full and xs[0] <= full <= xs[-1]:
        af.axvline(full, color="grey", ls=":", lw=1)
        af.annotate(f"attention overtakes\nat N ≈ {full:,.0f}", (full, min(series["forward total"])), fontsize=8)
    af.set_xlabel(sw.variable)
    af.set_ylabel("forward FLOPs")
    af.legend(fontsize=8)
    mem = {
        "weights": [r.memory["weights"] for r in rs],
        "activations (kept for backward)": [r.memory["activations"] for r in rs],
        "activations, fused attention": [r.memory["activations_fused"] for r in rs],
        "scores/layer materialised": [r.memory.get("attention_scores_materialized", 0) for r in rs],
        "scores/layer fused": [r.memory.get("attention_scores_fused", 0) for r in rs],
        "KV cache": [r.memory["kv_cache"] for r in rs],
    }
    for label, ys in mem.items():
        am.plot(*_positive(xs, ys), marker="o", ms=3, label=label)
    if r0.device is not None:
        am.axhline(r0.device.memory, color="red", ls=":", lw=1, label=f"{r0.device.name} memory")
    am.set_xlabel(sw.variable)
    am.set_ylabel("bytes")
    am.legend(fontsize=8)
    return _save(fig, path)


def plot_compare(sweeps: list[Sweep], path: str) -> Path:
    var = sweeps[0].variable
    fig, (af, am) = _figure(f"cost against {var}")
    for sw in sweeps:
        name = sw.reports[0].name
        af.plot(*_positive(sw.values, [r.forward.total for r in sw.reports]), marker="o", ms=3, label=name)
        am.plot(
            *_positive(sw.values, [r.memory["activations"] for r in sw.reports]),
            marker="o",
            ms=3,
            label=f"{name} activations",
        )
        am.plot(
            *_positive(sw.values, [r.memory["kv_cache"] for r in sw.reports]), ls="--", label=f"{name} KV cache/state"
        )
    af.set_xlabel(var)
    af.set_ylabel("forward FLOPs")
    af.legend(fontsize=8)
    am.set_xlabel(var)
    am.set_ylabel("bytes")
    am.legend(fontsize=8)
    return _save(fig, path)
