"""Where the quadratic attention term overtakes the linear terms: solve A(N) = R(N) exactly.

Every FLOP count is a polynomial of degree ≤ 2 in the sequence length, so three evaluations fix it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

from .op_costs import Totals

QUADRATIC = ("qk", "av", "softmax", "cross_qk", "cross_av", "cross_softmax")


def _fit(xs: list[int], ys: list[int]) -> tuple[Fraction, Fraction, Fraction]:
    """Coefficients (a, b, c) of a·x² + b·x + c through three points."""
    (x0, x1, x2), (y0, y1, y2) = xs, [Fraction(y) for y in ys]
    d01, d12 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
    a = (d12 - d01) / (x2 - x0)
    b = d01 - a * (x0 + x1)
    return a, b, y0 - a * x0 * x0 - b * x0


def solve(totals_at: Callable[[int], tuple[Totals, Totals]], base: int = 1024) -> tuple[float | None, float | None]:
    """Sequence length at which attention (QKᵀ, softmax, AV) equals everything else: (full, causal-useful)."""
    xs = [base, 2 * base, 3 * base]
    points = [totals_at(x) for x in xs]
    out: list[float | None] = []
    for k in (0, 1):
        att = [p[k].sum_of(QUADRATIC) for p in points]
        rest = [p[k].total - a for p, a in zip(points, att, strict=True)]
        a, b, c = (p - q for p, q in zip(_fit(xs, att), _fit(xs, rest), strict=True))
        out.append(_root(a, b, c))
    return out[0], out[1]


def _root(a: Fraction, b: Fraction, c: Fraction) -> float | None:
    """Smallest positive N with a·N² + b·N + c = 0 where the difference turns positive."""
    if a <= 0:
        return None if b <= 0 else (float(-c / b) if -c / b > 0 else None)
    disc = float(b * b - 4 * a * c)
    if disc < 0:
        return None
    root = (-float(b) + math.sqrt(disc)) / (2 * float(a))
    return root if root > 0 else None
