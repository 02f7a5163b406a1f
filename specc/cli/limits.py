"""Bounds of the numeric command-line options, checked before any work.

Each out-of-range value is a ``SpecError`` of one line naming the option and the allowed range, e.g.
``error: --threads 100000 is out of range (allowed 1..8: 4 × 2 cores)``. The caps are stated here:

- threads (``train``, ``run``): 1 .. 4 × the machine's cores (more only thrash, and huge counts crash torch);
- ``generate -n``: 1 .. the model's context (and at most ``MAX_NEW_TOKENS``); learned position tables also
  bound prompt + new tokens, which the model itself checks;
- ``train``: lengths up to ``MAX_TRAIN_LEN``, evaluation sets up to ``MAX_EVAL_SIZE`` sequences, batches up to
  ``MAX_BATCH``, steps up to ``MAX_STEPS``;
- ``run --bench``: ``MAX_ITERS`` timed and ``MAX_WARMUP`` untimed repetitions; ``run --generate``: up to
  ``MAX_NEW_TOKENS`` (the model's positions checked by the runtime);
- sizes for the analyzer (batch, lengths): up to ``MAX_SYMBOLIC`` (costs stay exact integers and finite floats);
- seeds: 0 .. 2**63 − 1; sampling temperature 0 (greedy) or ``MIN_TEMPERATURE`` .. ``MAX_TEMPERATURE``.
"""

from __future__ import annotations

import math
import os

from ..errors import SpecError

MAX_NEW_TOKENS = 65_536
MAX_TRAIN_LEN = 4_096
MAX_EVAL_SIZE = 16_384
MAX_BATCH = 65_536
MAX_STEPS = 10_000_000
MAX_ITERS = 10_000
MAX_WARMUP = 1_000
MAX_TOP_K = 1 << 20
MAX_SYMBOLIC = 1 << 32
MAX_SEED = (1 << 63) - 1
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
MAX_LR = 10.0
MAX_ARGUMENT = 2_000  # characters of a list-like argument (--sweep, --prompt-ids are checked separately)


def cores() -> int:
    return os.cpu_count() or 1


def max_threads() -> int:
    return 4 * cores()


def _show(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}" if isinstance(x, float) else str(x)


def bounded(value: float | None, option: str, lo: float, hi: float, why: str = "") -> None:
    """Refuse ``value`` outside ``lo..hi`` (NaN and infinities too); None means the default and passes."""
    if value is None:
        return
    ok = lo <= value <= hi and not (isinstance(value, float) and not math.isfinite(value))
    if not ok:
        text = f"{option} {_show(value)} is out of range (allowed {_show(lo)}..{_show(hi)}{': ' + why if why else ''})"
        raise SpecError(text, hint=None)


def threads(value: int | None, option: str = "--threads") -> None:
    bounded(value, option, 1, max_threads(), f"4 × {cores()} cores")


def seed(value: int | None, option: str = "--seed") -> None:
    bounded(value, option, 0, MAX_SEED)


def temperature(value: float | None, option: str = "--temperature") -> None:
    if value is None or value == 0:
        return
    if not (MIN_TEMPERATURE <= value <= MAX_TEMPERATURE) or not math.isfinite(value):
        allowed = f"0 for greedy, or {MIN_TEMPERATURE:g}..{MAX_TEMPERATURE:g}"
        raise SpecError(f"{option} {_show(value)} is out of range (allowed {allowed})")


def argument_length(text: str | None, option: str, limit: int = MAX_ARGUMENT) -> None:
    """A list-like argument of absurd length is refused before it is parsed (and never echoed back)."""
    if text is not None and len(text) > limit:
        raise SpecError(f"{option} is {len(text):,} characters long (at most {limit:,})")
