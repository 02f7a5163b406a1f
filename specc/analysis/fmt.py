"""Human-readable numbers for tables: 3 significant figures with SI prefixes."""

from __future__ import annotations

_SI = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(x: float, unit: str = "") -> str:
    for scale, prefix in _SI:
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}".rstrip()


def flops(x: float) -> str:
    return si(x, "FLOP")


def nbytes(x: float) -> str:
    return si(x, "B")


def count(x: int) -> str:
    return f"{x:,}"


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    if t >= 1e-6:
        return f"{t * 1e6:.3g} µs"
    return f"{t * 1e9:.3g} ns"
