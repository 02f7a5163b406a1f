"""Accelerator profiles for the roofline: built-in (H100 SXM, H200, A100) or a user YAML file.

A profile file::

    name: my-gpu
    peak_flops: {bf16: 989 TFLOP/s, fp16: 989 TFLOP/s, fp32: 67 TFLOP/s}   # dense matmul peaks
    vector_flops: 67 TFLOP/s      # elementwise work (optional; default: the fp32 peak)
    bandwidth: 3.35 TB/s          # memory bandwidth
    memory: 80 GB                 # memory size

Numbers may be plain (``3.35e12``) or carry a unit (k/M/G/T/P, ``Gi``-style binary prefixes for bytes). Every
number must be finite and between ``MIN_QUANTITY`` and ``MAX_QUANTITY``; ``peak_flops`` names at least one dtype.
The file is read like a spec (``specc.read``: a regular YAML file of at most 1 MiB).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Diagnostic, SpecError
from ..spec.yaml_source import Located, parse, read_text


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: dict[str, float]  # dtype → dense matmul FLOP/s
    vector_flops: float  # FLOP/s for non-matmul work
    bandwidth: float  # bytes/s
    memory: int  # bytes
    source: str = ""

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
        }


# Dense (no 2:4 sparsity) tensor-core peaks; fp32 = the non-tensor fp32 peak (PyTorch does not use TF32 for
# matmuls by default). Memory in decimal GB as sold.
BUILTIN = {
    "h100": Device(
        "H100 SXM", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}, 66.9e12, 3.35e12,
        80 * 10**9, "NVIDIA H100 Tensor Core GPU datasheet (SXM5)",
    ),
    "h200": Device(
        "H200 SXM", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}, 66.9e12, 4.8e12,
        141 * 10**9, "NVIDIA H200 Tensor Core GPU datasheet (SXM)",
    ),
    "a100": Device(
        "A100 SXM 80GB", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}, 19.5e12, 2.039e12,
        80 * 10**9, "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB)",
    ),
}  # fmt: skip
ALIASES = {"h100-sxm": "h100", "h100_sxm": "h100", "h200-sxm": "h200", "a100-80gb": "a100", "a100-sxm": "a100"}

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BINARY = {"ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30, "ti": 2.0**40, "pi": 2.0**50}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]i?)?\s*([A-Za-z/]*)\s*$")
_UNITS = {"flops": ("flop/s", "flops", ""), "bandwidth": ("b/s", "bps", ""), "memory": ("b", "")}
MIN_QUANTITY, MAX_QUANTITY = 1.0, 1e24  # 1 FLOP/s, byte or byte/s … a yotta: anything outside is a typo


def parse_quantity(value: Any, kind: str) -> float:
    """``3.35 TB/s`` → 3.35e12; ``80 GiB`` → 85899345920; plain numbers pass through."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number or a quantity such as '3.35 TB/s', got {type(value).__name__}")
    if isinstance(value, (int, float)):
        return float(value)
    m = _QUANTITY.match(value)
    if not m:
        raise ValueError(f"cannot read '{value}' as a quantity")
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
    if problems:
        raise SpecError(problems)
    if not vec:
        vec = min(peaks.values())  # peaks is not empty: checked above
    return Device(str(data.get("name", default_name)), peaks, vec, bandwidth, int(memory), str(data.get("source", "")))


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
