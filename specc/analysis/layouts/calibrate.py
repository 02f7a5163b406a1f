"""Fitting a device and interconnect profile's efficiency parameters to measured runs.

The objective is the mean squared log ratio of predicted to measured step time over the runs (a 5% error
weighs the same on a 1 s and a 100 s step). Parameters are few and physical — the matmul efficiency curve
(``matmul.max``, ``matmul.knee``), the memory system's (``memory.max``), the launch overhead
(``kernel_overhead``), the link efficiencies (``link.intra_node``, ``link.inter_node``) — each kept inside
its physical range by a smooth transform, minimised by Nelder–Mead. A fit is refused (``SpecError``) when it
is under-determined (fewer runs than parameters plus one, or a parameter no run's prediction depends on) or
does not converge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...errors import SpecError
from ..devices import Device
from .links import Interconnect
from .runs import Run, predict

# name → (lowest, highest): the physical range a fit may move a parameter in
PARAMETERS: dict[str, tuple[float, float]] = {
    "matmul.max": (0.05, 1.0),
    "matmul.knee": (1e3, 1e12),  # FLOPs
    "memory.max": (0.05, 1.0),
    "memory.knee": (1.0, 1e9),  # bytes
    "kernel_overhead": (0.0, 1e-3),  # seconds
    "link.intra_node": (0.05, 1.0),
    "link.inter_node": (0.05, 1.0),
}
DEFAULT_FIT = ("matmul.max", "matmul.knee", "memory.max", "link.intra_node")
LOG_SCALE = {"matmul.knee", "memory.knee"}


@dataclass
class Residual:
    name: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


def current(dev: Device, link: Interconnect, name: str) -> float:
    if name.startswith("link."):
        return link.efficiency[0 if name.endswith("intra_node") else 1]
    head, _, tail = name.partition(".")
    v = getattr(dev.efficiency, head)
    return float(getattr(v, tail) if tail else v)


def apply(dev: Device, link: Interconnect, values: dict[str, float]) -> tuple[Device, Interconnect]:
    eff = dev.efficiency.with_values(**{k: v for k, v in values.items() if not k.startswith("link.")})
    lk = list(link.efficiency)
    for k, v in values.items():
        if k.startswith("link."):
            lk[0 if k.endswith("intra_node") else 1] = v
    return replace(dev, efficiency=eff), replace(link, efficiency=(lk[0], lk[1]))


def residuals(runs: list[Run], dev: Device, link: Interconnect, cache: dict[str, Any] | None = None) -> list[Residual]:
    cache = {} if cache is None else cache
    out = []
    for r in runs:
        c = predict(r, dev, link, cache)
        out.append(Residual(r.name, r.measured_seconds(), float(c.step_time)))
    return out


def _to_unit(name: str, x: float) -> float:
    lo, hi = PARAMETERS[name]
    if name in LOG_SCALE:
        lo, hi, x = math.log(lo), math.log(hi), math.log(max(x, lo))
    f = min(max((x - lo) / (hi - lo), 1e-6), 1 - 1e-6)
    return math.log(f / (1 - f))


def _from_unit(name: str, u: float) -> float:
    lo, hi = PARAMETERS[name]
    f = 1 / (1 + math.exp(-max(min(u, 50.0), -50.0)))
    if name in LOG_SCALE:
        return math.exp(math.log(lo) + f * (math.log(hi) - math.log(lo)))
    return lo + f * (hi - lo)


@dataclass
class Fit:
    values: dict[str, float]
    before: list[Residual]
    after: list[Residual]
    iterations: int
    device: Device
    link: Interconnect


def fit(
    runs: list[Run], dev: Device, link: Interconnect, names: tuple[str, ...] = DEFAULT_FIT, max_iter: int = 400
) -> Fit:
    unknown = [n for n in names if n not in PARAMETERS]
    if unknown:
        raise SpecError(f"cannot fit '{unknown[0]}'", hint=f"fit any of {', '.join(PARAMETERS)}")
    cache: dict[str, Any] = {}
    before = residuals(runs, dev, link, cache)  # first: every run is checked against its model
    if len(runs) < len(names) + 1:
        raise SpecError(
            f"{len(runs)} runs cannot determine {len(names)} parameters",
            hint=f"give at least {len(names) + 1} runs, or fit fewer parameters",
        )

    def loss(u: list[float]) -> float:
        d, lk = apply(dev, link, {n: _from_unit(n, x) for n, x in zip(names, u, strict=True)})
        res = residuals(runs, d, lk, cache)
        return sum(math.log(r.predicted / r.measured) ** 2 for r in res) / len(res)

    start = [_to_unit(n, current(dev, link, n)) for n in names]
    _identifiable(loss, start, names)
    best, iters, converged = _nelder_mead(loss, start, max_iter)
    if not converged:
        raise SpecError(f"the fit did not converge in {max_iter} iterations", hint="fit fewer parameters")
    values = {n: _from_unit(n, x) for n, x in zip(names, best, strict=True)}
    d, lk = apply(dev, link, values)
    return Fit(values, before, residuals(runs, d, lk, cache), iters, d, lk)


def _identifiable(loss: Any, u: list[float], names: tuple[str, ...]) -> None:
    """Refuse a parameter that no run's prediction moves (the fit could set it to anything)."""
    base = loss(u)
    for i, n in enumerate(names):
        moved = [*u]
        moved[i] += 0.5
        lower = [*u]
        lower[i] -= 0.5
        if abs(loss(moved) - base) < 1e-12 and abs(loss(lower) - base) < 1e-12:
            raise SpecError(f"no run depends on '{n}': the fit is under-determined", hint=f"leave {n} out of the fit")


def _nelder_mead(f: Any, x0: list[float], max_iter: int, tol: float = 1e-7) -> tuple[list[float], int, bool]:
    n = len(x0)
    pts = [list(x0)] + [[x + (1.0 if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    for it in range(1, max_iter + 1):
        order = sorted(range(n + 1), key=lambda i: vals[i])
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol and it > n:  # squared log errors: 1e-7 ≈ 0.03% in time
            return pts[0], it, True
        centroid = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]

        worst = pts[-1]

        def toward(a: float, mid: list[float] = centroid, worst: list[float] = worst) -> list[float]:
            return [c + a * (w - c) for c, w in zip(mid, worst, strict=True)]

        r = toward(-1.0)
        fr = f(r)
        if fr < vals[0]:
            e = toward(-2.0)
            fe = f(e)
            pts[-1], vals[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = r, fr
        else:
            c = toward(0.5)
            fc = f(c)
            if fc < vals[-1]:
                pts[-1], vals[-1] = c, fc
            else:
                pts = [pts[0]] + [[b + 0.5 * (x - b) for b, x in zip(pts[0], p, strict=True)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[0], max_iter, False
