"""Interconnect profiles: the bandwidth a device has to its peers inside a node and across nodes.

A profile file (``specs/devices/nvlink.yaml`` …, or any path)::

    name: DGX H100
    devices_per_node: 8
    intra_node: 450 GB/s     # per device, each direction (NVLink 4: 900 GB/s both ways)
    inter_node: 50 GB/s      # per device, each direction (one 400 Gb/s InfiniBand NDR port)
    source: NVIDIA H100 datasheet; DGX H100 user guide

A process group runs at ``intra_node`` when all its ranks share a node and at ``inter_node`` otherwise.
Ranks are laid out tp (innermost), cp, dp, pp, so a group of ``size`` ranks ``stride`` apart spans
``stride × size`` consecutive devices. Bandwidth only: latency is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import SpecError
from ...spec.yaml_source import Located, parse, read_text
from ..devices import parse_quantity

DEFAULT = "nvlink"
BUILTIN_NAMES = ("nvlink", "nvlink-a100", "pcie", "infiniband")  # profiles in specs/devices/
_KEYS = {"name", "devices_per_node", "intra_node", "inter_node", "source"}
MAX_DEVICES_PER_NODE = 1 << 16


@dataclass(frozen=True)
class Interconnect:
    name: str
    devices_per_node: int
    intra_node: float  # bytes/s per device, each direction
    inter_node: float
    source: str = ""

    def bandwidth(self, stride: int, size: int) -> float:
        return self.intra_node if stride * size <= self.devices_per_node else self.inter_node

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices_per_node": self.devices_per_node,
            "intra_node": self.intra_node,
            "inter_node": self.inter_node,
            "source": self.source,
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
    return Interconnect(
        str(data.get("name", default_name)), n, links["intra_node"], links["inter_node"], str(data.get("source", ""))
    )
