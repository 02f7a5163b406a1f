"""Interconnect profiles: the bandwidth a device has to its peers inside a node and across nodes.

A profile file (``specs/devices/nvlink.yaml`` …, or any path)::

    name: DGX H100
    devices_per_node: 8
    intra_node: 450 GB/s     # per device, each direction (NVLink 4: 900 GB/s both ways)
    inter_node: 50 GB/s      # per device, each direction (one 400 Gb/s InfiniBand NDR port)
    source: NVIDIA H100 datasheet; DGX H100 user guide

A process group runs at ``intra_node`` when all its ranks share a node and at ``inter_node`` otherwise.
Ranks are laid out tp (innermost), cp, dp, pp, so a group of ``size`` ranks ``stride`` apart spans
``stride × size`` consecutive devices.

Optional per tier: ``latency`` (seconds per algorithm step: a ring collective over n ranks takes n − 1 steps
for an all-gather or reduce-scatter, 2(n − 1) for an all-reduce) and ``efficiency`` (the fraction of the link
bandwidth NCCL's bus bandwidth reaches on large messages)::

    latency: {intra_node: 5 us, inter_node: 10 us}
    efficiency: {intra_node: 0.8, inter_node: 0.9}

A collective of B bus bytes (the algorithm factor is in B, see ``comm.py``) on a group takes
``steps × latency + B / (bandwidth × efficiency)``. Without them: no latency, efficiency 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import SpecError
from ...spec.yaml_source import Located, parse, read_text
from ..devices import parse_quantity

DEFAULT = "nvlink"
BUILTIN_NAMES = ("nvlink", "nvlink-a100", "pcie", "infiniband")  # profiles in specs/devices/
_KEYS = {"name", "devices_per_node", "intra_node", "inter_node", "source", "latency", "efficiency", "sources"}
TIERS = ("intra_node", "inter_node")
MAX_DEVICES_PER_NODE = 1 << 16


@dataclass(frozen=True)
class Interconnect:
    name: str
    devices_per_node: int
    intra_node: float  # bytes/s per device, each direction
    inter_node: float
    source: str = ""
    latency: tuple[float, float] = (0.0, 0.0)  # seconds per step, (intra, inter)
    efficiency: tuple[float, float] = (1.0, 1.0)

    def tier(self, stride: int, size: int) -> int:
        return 0 if stride * size <= self.devices_per_node else 1

    def bandwidth(self, stride: int, size: int) -> float:
        """The link bandwidth of the group's tier (bytes/s per device, each direction)."""
        return (self.intra_node, self.inter_node)[self.tier(stride, size)]

    def achieved(self, stride: int, size: int) -> float:
        """Bytes/s a collective reaches on the group (link bandwidth × efficiency of its tier)."""
        return self.bandwidth(stride, size) * self.efficiency[self.tier(stride, size)]

    def seconds(self, stride: int, size: int, nbytes: float, steps: float) -> float:
        """``steps`` latencies plus the bytes at the tier's achieved bandwidth."""
        if nbytes <= 0:
            return 0.0
        return steps * self.latency[self.tier(stride, size)] + nbytes / self.achieved(stride, size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices_per_node": self.devices_per_node,
            "intra_node": self.intra_node,
            "inter_node": self.inter_node,
            "source": self.source,
            "latency": dict(zip(TIERS, self.latency, strict=True)),
            "efficiency": dict(zip(TIERS, self.efficiency, strict=True)),
        }


def load_interconnect(ref: str) -> Interconnect:
    """A profile name (``nvlink``, ``pcie``, ``infiniband``, ``nvlink-a100``) or a YAML path."""
    path = Path(ref)
    if not path.is_file():
        from ...spec.presets import find_device_profile

        found = find_device_profile(ref)
        if found is None:
            hint = f"use one of {', '.join(BUILTIN_NAMES)} (specs/devices/) or a YAML path"
            raise SpecError(f"no interconnect named '{ref}'", hint=hint)
        path = found
    return _from_document(parse(read_text(path, "an interconnect profile"), str(path)), path.stem)


def _from_document(doc: Located, default_name: str) -> Interconnect:
    data = doc.data
    if not isinstance(data, dict):
        raise SpecError([doc.loc(()).diag("an interconnect profile is a mapping", "see specs/devices/nvlink.yaml")])
    problems = [
        doc.loc((k,)).diag(f"unknown key '{k}'", f"allowed: {', '.join(sorted(_KEYS))}") for k in data if k not in _KEYS
    ]
    required = ("devices_per_node", "intra_node", "inter_node")
    problems += [doc.loc(()).diag(f"missing '{k}'") for k in required if k not in data]
    if problems:
        raise SpecError(problems)
    n = data["devices_per_node"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DEVICES_PER_NODE:
        raise SpecError([doc.loc(("devices_per_node",)).diag(f"devices_per_node must be 1..{MAX_DEVICES_PER_NODE}")])
    links = {}
    for key in ("intra_node", "inter_node"):
        try:
            links[key] = parse_quantity(data[key], "bandwidth")
        except ValueError as e:
            raise SpecError([doc.loc((key,)).diag(f"{key}: {e}", "write e.g. '450 GB/s'")]) from None
        if not 1.0 <= links[key] <= 1e18:
            raise SpecError([doc.loc((key,)).diag(f"{key} must be between 1 B/s and 1 EB/s")])
    sources = data.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise SpecError([doc.loc(("sources",)).diag("sources maps a profile key to text")])
    latency = _tiers(doc, data, "latency", "time", 0.0, 1.0, 0.0)
    efficiency = _tiers(doc, data, "efficiency", "number", 1e-3, 1.0, 1.0)
    return Interconnect(
        str(data.get("name", default_name)),
        n,
        links["intra_node"],
        links["inter_node"],
        str(data.get("source", "")),
        latency,
        efficiency,
    )


def _tiers(doc: Located, data: dict, key: str, kind: str, lo: float, hi: float, default: float) -> tuple[float, float]:
    value = data.get(key)
    if value is None:
        return (default, default)
    if not isinstance(value, dict) or set(value) - set(TIERS):
        raise SpecError([doc.loc((key,)).diag(f"{key} maps intra_node and inter_node to a number")])
    out = []
    for tier in TIERS:
        if tier not in value:
            out.append(default)
            continue
        try:
            x = parse_quantity(value[tier], kind)
        except (ValueError, OverflowError) as e:
            raise SpecError([doc.loc((key, tier)).diag(f"{key}.{tier}: {e}")]) from None
        if not math.isfinite(x) or not lo <= x <= hi:
            raise SpecError([doc.loc((key, tier)).diag(f"{key}.{tier} = {x:.3g} is outside {lo:g}…{hi:g}")])
        out.append(x)
    return (out[0], out[1])


def interconnect_yaml(link: Interconnect, header: str = "") -> str:
    import yaml

    doc = {
        "name": link.name,
        "devices_per_node": link.devices_per_node,
        "intra_node": float(link.intra_node),
        "inter_node": float(link.inter_node),
        "latency": dict(zip(TIERS, link.latency, strict=True)),
        "efficiency": dict(zip(TIERS, link.efficiency, strict=True)),
        "source": link.source,
    }
    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body
