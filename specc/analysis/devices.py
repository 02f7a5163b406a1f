"""Accelerator profiles for the roofline: built-in (H100 SXM, H200, A100) or a user YAML file.

A profile file::

    name: my-gpu
    peak_flops: {bf16: 989 TFLOP/s, fp16: 989 TFLOP/s, fp32: 67 TFLOP/s}   # dense matmul peaks
    vector_flops: 67 TFLOP/s      # elementwise work (optional; default: the fp32 peak)
    bandwidth: 3.35 TB/s          # memory bandwidth
    memory: 80 GB                 # memory size
    efficiency:                   # optional (efficiency.py): how far below the peaks ops run
      matmul: {max: 0.8, knee: 0.5 GFLOP}
      dim_knee: 16
      memory: {max: 0.9, knee: 1 MB}
      overlap: 0                  # 0: compute + memory per op; 1: max of the two (roofline)
      kernel_overhead: 4 us
    attention: flash              # optional: the attention kernel by default (flash | math)
    runtime: {context: 1 GiB, reserve: 0.05, comm_buffers: 0.5 GiB}
    sources: {efficiency: "where each number comes from"}

Numbers may be plain (``3.35e12``) or carry a unit (k/M/G/T/P, ``Gi``-style binary prefixes for bytes). Every
number must be finite and between ``MIN_QUANTITY`` and ``MAX_QUANTITY``; ``peak_flops`` names at least one dtype.
The file is read like a spec (``specc.io.read``: a regular YAML file of at most 1 MiB).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Diagnostic, SpecError
from ..spec.yaml_source import Located, parse, read_text
from .efficiency import ATTENTION_IMPLS, Curve, Efficiency, Runtime


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: dict[str, float]  # dtype → dense matmul FLOP/s
    vector_flops: float  # FLOP/s for non-matmul work
    bandwidth: float  # bytes/s
    memory: int  # bytes
    source: str = ""
    efficiency: Efficiency = field(default_factory=Efficiency)
    attention: str = "flash"  # the attention kernel ops run with unless told otherwise
    runtime: Runtime = field(default_factory=Runtime)
    sources: dict[str, str] = field(default_factory=dict)  # profile key → where its number comes from

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise SpecError(f"device {self.name} has no peak for {dtype}", hint=f"add peak_flops.{dtype}")
        return self.peak_flops[dtype]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "peak_flops": dict(self.peak_flops),
            "vector_flops": self.vector_flops,
            "bandwidth": self.bandwidth,
            "memory": self.memory,
            "source": self.source,
            "efficiency": self.efficiency.to_dict(),
            "attention": self.attention,
            "runtime": self.runtime.to_dict(),
            "sources": dict(self.sources),
        }


# Built-in profiles are YAML files in specs/devices/ (dense tensor-core peaks, efficiency data, sources).
BUILTIN_FILES = {"h100": "h100", "h200": "h200", "a100": "a100"}


class _Builtin(Mapping[str, "Device"]):
    """The built-in profiles, read from their YAML files on first use."""

    def __init__(self) -> None:
        self._loaded: dict[str, Device] = {}

    def __getitem__(self, key: str) -> Device:
        if key not in BUILTIN_FILES:
            raise KeyError(key)
        if key not in self._loaded:
            from ..spec.presets import devices_dir

            path = devices_dir() / f"{BUILTIN_FILES[key]}.yaml"
            self._loaded[key] = _from_document(parse(read_text(path, "a device profile"), str(path)), key)
        return self._loaded[key]

    def __iter__(self) -> Iterator[str]:
        return iter(BUILTIN_FILES)

    def __len__(self) -> int:
        return len(BUILTIN_FILES)


BUILTIN = _Builtin()
ALIASES = {"h100-sxm": "h100", "h100_sxm": "h100", "h200-sxm": "h200", "a100-80gb": "a100", "a100-sxm": "a100"}

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_TIME = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(ns|us|µs|ms|s)?\s*$")
_TIME_SCALE = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]i?)?\s*([A-Za-z/]*)\s*$")
_UNITS = {
    "flops": ("flop/s", "flops", ""),
    "bandwidth": ("b/s", "bps", ""),
    "memory": ("b", ""),
    "flop": ("flop", ""),
    "time": ("s", ""),
    "number": ("",),
}
MIN_QUANTITY, MAX_QUANTITY = 1.0, 1e24  # 1 FLOP/s, byte or byte/s … a yotta: anything outside is a typo


def parse_quantity(value: Any, kind: str) -> float:
    """``3.35 TB/s`` → 3.35e12; ``80 GiB`` → 85899345920; plain numbers pass through."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number or a quantity such as '3.35 TB/s', got {type(value).__name__}")
    if isinstance(value, (int, float)):
        try:
            return float(value)  # non-finite floats pass: the caller says where they are not allowed
        except OverflowError:  # a 400-digit YAML integer is past float's range
            raise ValueError(f"{str(value)[:12]}… is out of range (at most {MAX_QUANTITY:g})") from None
    m = _QUANTITY.match(value)
    if not m:
        raise ValueError(f"cannot read '{value}' as a quantity")
    if kind == "time":  # 4 us, 0.5 ms (the SI prefix m would read as mega)
        t = _TIME.match(value)
        if not t:
            raise ValueError(f"cannot read '{value}' as a time (e.g. '4 us')")
        return float(t.group(1)) * _TIME_SCALE[t.group(2)]
    number, prefix, unit = m.groups()
    prefix = (prefix or "").lower()
    if unit.lower() not in _UNITS[kind]:
        raise ValueError(f"unit '{unit}' does not fit here (expected {' or '.join(u for u in _UNITS[kind] if u)})")
    scale = _BINARY[prefix] if prefix.endswith("i") else _PREFIX[prefix]
    return float(number) * scale


def load_device(ref: str) -> Device:
    """A built-in name (h100, h200, a100) or a YAML profile path."""
    key = ALIASES.get(ref.lower(), ref.lower())
    if key in BUILTIN:
        return BUILTIN[key]
    path = Path(ref)
    if not path.exists():
        from ..spec.presets import find_device_profile  # package data, plus $SPECC_PRESETS/*/devices

        found = find_device_profile(ref)
        if found is not None:
            path = found
        else:
            raise SpecError(
                f"no device named '{ref}'", file=ref, hint=f"use one of {', '.join(BUILTIN)} or a YAML profile path"
            )
    return _from_document(parse(read_text(path), str(path)), path.stem)


def _from_document(doc: Located, default_name: str) -> Device:
    data, problems = doc.data, []
    if not isinstance(data, dict):
        raise SpecError([doc.loc(()).diag("a device profile is a mapping", "see `specc analyze --help`")])
    allowed = {"name", "peak_flops", "vector_flops", "bandwidth", "memory", "source"}
    allowed |= {"efficiency", "attention", "runtime", "sources"}
    for key in data:
        if key not in allowed:
            problems.append(doc.loc((key,)).diag(f"unknown key '{key}'", f"allowed: {', '.join(sorted(allowed))}"))
    for key in ("peak_flops", "bandwidth", "memory"):
        if key not in data:
            problems.append(doc.loc(()).diag(f"missing '{key}'"))
    peaks: dict[str, float] = {}
    raw_peaks = data.get("peak_flops", {})
    if not isinstance(raw_peaks, dict):
        problems.append(doc.loc(("peak_flops",)).diag("peak_flops maps a dtype to FLOP/s", "e.g. {bf16: 989e12}"))
        raw_peaks = {}
    elif not raw_peaks and "peak_flops" in data:
        problems.append(doc.loc(("peak_flops",)).diag("peak_flops is empty", "give at least one, e.g. {bf16: 989e12}"))
    for key in ("name", "source"):
        if key in data and not isinstance(data[key], str):
            problems.append(doc.loc((key,)).diag(f"{key} must be text", f'quote it: {key}: "..."'))
    for dtype, v in raw_peaks.items():
        peaks[dtype] = _read(doc, ("peak_flops", dtype), v, "flops", problems)
    bandwidth = _read(doc, ("bandwidth",), data.get("bandwidth", 1), "bandwidth", problems)
    memory = _read(doc, ("memory",), data.get("memory", 1), "memory", problems)
    vector = data.get("vector_flops")
    vec = _read(doc, ("vector_flops",), vector, "flops", problems) if vector is not None else peaks.get("fp32", 0.0)
    eff = _efficiency(doc, data.get("efficiency"), problems)
    runtime = _runtime(doc, data.get("runtime"), problems)
    attention = data.get("attention", "flash")
    if attention not in ATTENTION_IMPLS:
        problems.append(doc.loc(("attention",)).diag(f"attention '{attention}' is unknown", "use flash or math"))
    sources = data.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        problems.append(doc.loc(("sources",)).diag("sources maps a profile key to text", 'e.g. {efficiency: "..."}'))
        sources = {}
    if problems:
        raise SpecError(problems)
    if not vec:
        vec = min(peaks.values())  # peaks is not empty: checked above
    name, source = str(data.get("name", default_name)), str(data.get("source", ""))
    return Device(name, peaks, vec, bandwidth, int(memory), source, eff, str(attention), runtime,
                  {str(k): v for k, v in sources.items()})  # fmt: skip


# key → (kind of quantity, smallest, largest); fractions are 0..1
_CURVE = {"max": ("fraction", 1e-3, 1.0), "knee": ("any", 0.0, MAX_QUANTITY)}
_EFFICIENCY = {"dim_knee": ("number", 0.0, 1e6), "overlap": ("fraction", 0.0, 1.0), "kernel_overhead": ("time", 0, 1)}
_EFFICIENCY["backward"] = ("fraction", 0.01, 1.0)
_EFFICIENCY["flash"] = ("fraction", 0.0, 1.0)
_RUNTIME = {"context": ("memory", 0.0, MAX_QUANTITY), "reserve": ("fraction", 0.0, 1.0)}
_RUNTIME |= {"comm_buffers": ("memory", 0.0, MAX_QUANTITY)}
_CURVE_UNIT = {"matmul": "flop", "vector": "flop", "memory": "memory"}


def _mapping(doc: Located, path: tuple[str, ...], value: Any, allowed: set[str], problems: list[Diagnostic]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(doc.loc(path).diag(f"{'.'.join(path)} must be a mapping"))
        return {}
    for k in value:
        if k not in allowed:
            hint = f"allowed: {', '.join(sorted(allowed))}"
            problems.append(doc.loc((*path, k)).diag(f"unknown key '{k}' in {'.'.join(path)}", hint))
    return value


def _bounded(doc: Located, path: tuple[str, ...], value: Any, kind: str, lo: float, hi: float,
             problems: list[Diagnostic]) -> float:  # fmt: skip
    name = ".".join(path)
    try:
        x = float(parse_quantity(value, "number" if kind in ("fraction", "any") else kind))
    except (ValueError, OverflowError) as e:
        problems.append(doc.loc(path).diag(f"{name}: {e}"))
        return lo
    if not math.isfinite(x) or not lo <= x <= hi:
        problems.append(doc.loc(path).diag(f"{name} = {x:.3g} is outside {lo:g}…{hi:g}"))
        return lo
    return x


def _efficiency(doc: Located, value: Any, problems: list[Diagnostic]) -> Efficiency:
    data = _mapping(doc, ("efficiency",), value, {*_CURVE_UNIT, *_EFFICIENCY}, problems)
    out: dict[str, Any] = {}
    for unit, knee_kind in _CURVE_UNIT.items():
        curve = _mapping(doc, ("efficiency", unit), data.get(unit), set(_CURVE), problems)
        got = {}
        for k, (kind, lo, hi) in _CURVE.items():
            if k in curve:
                got[k] = _bounded(doc, ("efficiency", unit, k), curve[k], knee_kind if kind == "any" else kind, lo, hi,
                                  problems)  # fmt: skip
        out[unit] = Curve(**got)
    for k, (kind, lo, hi) in _EFFICIENCY.items():
        if k in data:
            out[k] = _bounded(doc, ("efficiency", k), data[k], kind, lo, hi, problems)
    return Efficiency(**out)


def _runtime(doc: Located, value: Any, problems: list[Diagnostic]) -> Runtime:
    data = _mapping(doc, ("runtime",), value, set(_RUNTIME), problems)
    return Runtime(**{k: _bounded(doc, ("runtime", k), data[k], kind, lo, hi, problems)
                      for k, (kind, lo, hi) in _RUNTIME.items() if k in data})  # fmt: skip


def _read(doc: Located, path: tuple[str, ...], value: Any, kind: str, problems: list[Diagnostic]) -> float:
    try:
        x = parse_quantity(value, kind)
    except ValueError as e:
        problems.append(doc.loc(path).diag(f"{'.'.join(path)}: {e}", "write e.g. 3.35e12 or '3.35 TB/s'"))
        return 1.0
    if not math.isfinite(x):
        problems.append(doc.loc(path).diag(f"{'.'.join(path)} must be a finite number, got {x}", "e.g. 3.35e12"))
        return 1.0
    if x <= 0:
        problems.append(doc.loc(path).diag(f"{'.'.join(path)} must be positive"))
        return 1.0
    if not MIN_QUANTITY <= x <= MAX_QUANTITY:
        problems.append(
            doc.loc(path).diag(
                f"{'.'.join(path)} = {x:.3g} is outside {MIN_QUANTITY:g}…{MAX_QUANTITY:g}", "check the unit prefix"
            )
        )
        return 1.0
    return x


def device_yaml(dev: Device, header: str = "") -> str:
    """A device profile as YAML that ``load_device`` reads back to the same Device."""
    import yaml

    eff = dev.efficiency
    doc: dict[str, Any] = {
        "name": dev.name,
        "peak_flops": {k: float(v) for k, v in dev.peak_flops.items()},
        "vector_flops": float(dev.vector_flops),
        "bandwidth": float(dev.bandwidth),
        "memory": int(dev.memory),
        "source": dev.source,
        "efficiency": {
            "matmul": {"max": eff.matmul.max, "knee": eff.matmul.knee},
            "dim_knee": eff.dim_knee,
            "vector": {"max": eff.vector.max, "knee": eff.vector.knee},
            "memory": {"max": eff.memory.max, "knee": eff.memory.knee},
            "overlap": eff.overlap,
            "kernel_overhead": eff.kernel_overhead,
            "backward": eff.backward,
            "flash": eff.flash,
        },
        "attention": dev.attention,
        "runtime": dev.runtime.to_dict(),
        "sources": dict(dev.sources),
    }
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body
