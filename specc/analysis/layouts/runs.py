"""Measured training runs: reading them (JSON or CSV), predicting them, comparing.

A run is one fully specified training step that was measured: the model (a spec: a preset name, a path, or
a mapping with ``extends``), dtype, sequence length, layout (``tp``, ``pp``, ``dp``, ``cp``), micro and
global batch, recompute, sequence parallelism, ZeRO stage, pipeline schedule and virtual stages, attention
kernel, whether the gradient sync overlaps backward, and what was measured: ``step_time_s`` (seconds per
iteration) or ``tflops_per_gpu`` with the source's FLOP convention (``flops``; Narayanan et al. 2021 eq. 3:
96·B·s·l·h²·(1 + s/6h + V/16lh) per iteration with full recompute), optionally ``peak_memory_bytes``.

JSON: ``{"rows": [...]}`` or a list; CSV: one run a line with the flat keys above and ``model`` a preset name
or path. Bad input is a ``SpecError`` located at the row and key.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import Diagnostic, SpecError
from ...io.read import read_bytes
from ...spec.yaml_source import Loc, parse
from .layout import RECOMPUTE, SCHEDULES, Layout, Training

MAX_RUNS_BYTES = 8 << 20
_INT = ("seq", "tp", "pp", "dp", "cp", "micro_batch", "global_batch", "zero", "virtual_stages")
_REQUIRED = ("model", "micro_batch", "global_batch")
_KNOWN = {
    "name", "source", "model", "dtype", "seq", "gpus", "tp", "pp", "dp", "cp", "micro_batch", "global_batch",
    "recompute", "sequence_parallel", "zero", "schedule", "virtual_stages", "attention", "dp_overlap", "device",
    "interconnect", "measured", "flops", "assumed", "approx", "step_time_s", "tflops_per_gpu", "peak_memory_bytes",
    "notes",
}  # fmt: skip


@dataclass
class Run:
    name: str
    model: Any
    layout: Layout
    training: Training
    dtype: str
    seq: int | None
    quantity: str  # step_time_s | tflops_per_gpu
    value: float
    flops: dict[str, Any] = field(default_factory=dict)
    peak_memory: float | None = None
    where: Where | None = None  # the row's location, for messages

    def measured_seconds(self) -> float:
        if self.quantity == "step_time_s":
            return self.value
        f = self.flops
        B, s, L, h, V = (float(f[k]) for k in ("B", "s", "l", "h", "V"))
        total = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
        return total / (self.layout.devices * self.value * 1e12)


Where = Callable[[str | None], Loc]  # key (None: the row) → its location in the runs file


def _err(where: Where | str, msg: str, hint: str | None = None, key: str | None = None) -> SpecError:
    if isinstance(where, str):
        return SpecError([Diagnostic(msg, where, None, None, hint)])
    return SpecError([where(key).diag(msg, hint)])


def _row(raw: dict[str, Any], where: Where) -> Run:
    unknown = sorted(k for k in raw if k not in _KNOWN)
    if unknown:
        raise _err(where, f"unknown column '{unknown[0]}'", f"known: {', '.join(sorted(_KNOWN))}", unknown[0])
    for k in _REQUIRED:
        if raw.get(k) in (None, ""):
            raise _err(where, f"missing '{k}'")
    vals: dict[str, Any] = {}
    for k in _INT:
        v = raw.get(k)
        if v in (None, ""):
            continue
        if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():
            v = int(v.strip())
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 24:
            raise _err(where, f"{k} must be a whole number, got {v!r}", key=k)
        vals[k] = v
    for k in ("tp", "pp", "dp", "cp", "micro_batch", "global_batch", "virtual_stages"):
        if vals.get(k, 1) < 1:
            raise _err(where, f"{k} must be at least 1", key=k)
    flags = {}
    for k, default in (("sequence_parallel", False), ("dp_overlap", True)):
        v = raw.get(k, default)
        if isinstance(v, str):
            if v.strip().lower() not in ("true", "false", "1", "0", ""):
                raise _err(where, f"{k} must be true or false, got {v!r}", key=k)
            v = v.strip().lower() in ("true", "1") if v.strip() else default
        if not isinstance(v, bool):
            raise _err(where, f"{k} must be true or false, got {v!r}", key=k)
        flags[k] = v
    recompute = str(raw.get("recompute") or "none")
    if recompute not in RECOMPUTE:
        raise _err(where, f"recompute '{recompute}' is unknown", f"use one of {', '.join(RECOMPUTE)}", "recompute")
    schedule = str(raw.get("schedule") or "1f1b")
    if schedule not in SCHEDULES:
        raise _err(where, f"schedule '{schedule}' is unknown", f"use one of {', '.join(SCHEDULES)}", "schedule")
    attention = raw.get("attention") or None
    if attention not in (None, "flash", "math"):
        raise _err(where, f"attention '{attention}' is unknown", "use flash or math", "attention")
    quantity, value = _measured(raw, where)
    peak = raw.get("peak_memory_bytes")
    if peak not in (None, ""):
        peak = _positive(peak, "peak_memory_bytes", where)
    else:
        peak = None
    lay = Layout(tp=vals.get("tp", 1), pp=vals.get("pp", 1), dp=vals.get("dp", 1), cp=vals.get("cp", 1))
    gpus = raw.get("gpus")
    if gpus not in (None, "") and int(gpus) != lay.devices:
        raise _err(where, f"gpus {gpus} is not tp × pp × cp × dp = {lay.devices}", key="gpus")
    t = Training(
        zero=vals.get("zero", 0),
        sequence_parallel=flags["sequence_parallel"],
        recompute=recompute,
        micro_batch=vals["micro_batch"],
        global_batch=vals["global_batch"],
        schedule=schedule,
        virtual_stages=vals.get("virtual_stages", 1),
        attention=attention,
        dp_overlap=flags["dp_overlap"],
    )
    flops = raw.get("flops") or {}
    if quantity == "tflops_per_gpu" and not (isinstance(flops, dict) and {"B", "s", "l", "h", "V"} <= set(flops)):
        raise _err(where, "tflops_per_gpu needs 'flops' {convention, B, s, l, h, V} to convert to seconds", key="flops")
    name = str(raw.get("name") or where(None).diag("").where().strip(": "))
    dtype = str(raw.get("dtype") or "bf16")
    return Run(name, raw["model"], lay, t, dtype, vals.get("seq"), quantity, value, flops, peak, where)


def _positive(v: Any, key: str, where: Where) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise _err(where, f"{key} must be a number, got {v!r}", key=key.split(".")[0]) from None
    if isinstance(v, bool) or not math.isfinite(x) or x <= 0:
        raise _err(where, f"{key} must be a positive finite number, got {v!r}", key=key.split(".")[0])
    return x


def _measured(raw: dict[str, Any], where: Where) -> tuple[str, float]:
    m = raw.get("measured")
    if isinstance(m, dict):
        q = {"iteration_time_s": "step_time_s"}.get(str(m.get("quantity")), str(m.get("quantity")))
        if q not in ("step_time_s", "tflops_per_gpu"):
            hint = "step_time_s or tflops_per_gpu"
            raise _err(where, f"measured quantity '{m.get('quantity')}' is unknown", hint, "measured")
        return q, _positive(m.get("value"), "measured.value", where)
    for q in ("step_time_s", "tflops_per_gpu"):
        if raw.get(q) not in (None, ""):
            return q, _positive(raw[q], q, where)
    raise _err(where, "no measurement", "give step_time_s (or tflops_per_gpu with flops)")


def read_runs(path: str | Path) -> list[Run]:
    p = Path(path)
    text = read_bytes(p, "a runs file", MAX_RUNS_BYTES).decode("utf-8", errors="replace")
    rows: list[tuple[dict[str, Any], Where]] = []
    if p.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        for i, r in enumerate(reader, start=2):
            here: Where = lambda key, i=i: Loc(str(p), i, 1)
            if None in r:
                raise _err(here, "more fields than the header names")
            rows.append(({k: v for k, v in r.items() if v not in (None, "")}, here))
    else:
        # JSON is YAML: the same reader keeps each key's line and column (a bare list is read as the rows of a
        # mapping opened on its first line, so its lines keep their numbers)
        bare = text.lstrip().startswith("[")
        doc = parse('{"rows": ' + text + "}" if bare else text, str(p))
        data = doc.data
        base: tuple[Any, ...] = ("rows",)
        items = data.get("rows") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise SpecError([doc.loc(()).diag('a runs file is a list of runs or {"rows": [...]}')])
        for i, r in enumerate(items):
            here = lambda key, i=i: doc.loc((*base, i, key) if key else (*base, i))
            if not isinstance(r, dict):
                raise _err(here, "a run is a mapping")
            rows.append((r, here))
    if not rows:
        raise _err(str(p), "no runs")
    return [_row(r, w) for r, w in rows]


def graph_of(run: Run, cache: dict[str, Any] | None = None) -> Any:
    """The run's model lowered (graphs of equal specs shared through ``cache``)."""
    from ...ir.lower import lower
    from ...spec.loader import load_spec

    key = json.dumps(run.model, sort_keys=True) if not isinstance(run.model, str) else run.model
    if cache is not None and key in cache:
        return cache[key]
    try:
        g = lower(load_spec(run.model))
    except SpecError as e:
        where = run.where(None) if run.where else None
        first = e.diagnostics[0] if getattr(e, "diagnostics", None) else None
        msg = f"model: {first.message if first else e}"
        raise SpecError([where.diag(msg)] if where else msg) from None
    if cache is not None:
        cache[key] = g
    return g


def predict(run: Run, device: Any, link: Any, cache: dict[str, Any] | None = None) -> Any:
    """The LayoutCost of a run on ``device`` and ``link`` (a Device and an Interconnect)."""
    from .layout import LayoutError
    from .run import analyze_layout

    g = graph_of(run, cache)
    key = ("profile", id(g), run.seq, run.dtype)
    prof = cache.get(key) if cache is not None else None  # type: ignore[arg-type]
    try:
        if prof is None:
            from .profile import profile
            from .run import settings

            seq, dtype = settings(g, run.seq, run.dtype)
            prof = profile(g, seq, None, dtype, True)
            if cache is not None:
                cache[key] = prof  # type: ignore[index]
        return analyze_layout(g, run.layout, training=run.training, is_training=True, seq=run.seq, dtype=run.dtype,
                              device=device, interconnect=link, prof=prof)  # fmt: skip
    except LayoutError as e:
        raise _err(run.where, f"{e.message} (the layout does not match the model)") if run.where else e from None
