"""``analyze_layout``: the costs of one spec under one parallel layout (``specc analyze --parallel``)."""

from __future__ import annotations

from ...ir.graph import LayerGraph
from ...spec.schema import DTYPE_BYTES
from ..devices import Device, load_device
from .estimate import Estimator, LayoutCost
from .layout import Layout, LayoutError, Training, check_layout, check_training
from .links import DEFAULT, Interconnect, load_interconnect
from .profile import GraphProfile, profile
from .stages import block_count


def settings(g: LayerGraph, seq: int | None, dtype: str | None) -> tuple[int, str]:
    """The sequence length (default: the context) and the dtype (default: the spec's)."""
    dtype = dtype or g.meta.get("dtype") or "fp32"
    if dtype not in DTYPE_BYTES:
        raise LayoutError(f"unknown dtype '{dtype}'", hint=f"use one of {', '.join(DTYPE_BYTES)}")
    return (seq if seq is not None else int(g.meta.get("tokens") or g.meta.get("context") or 1)), dtype


def devices_and_links(
    device: str | Device | None, interconnect: str | Interconnect | None
) -> tuple[Device | None, Interconnect | None]:
    dev = load_device(device) if isinstance(device, str) else device
    if interconnect is not None and dev is None:
        raise LayoutError("--interconnect prices the links of a step: give --device too")
    link = interconnect if isinstance(interconnect, Interconnect) else None
    if dev is not None and link is None:  # an A100 sits in DGX A100-class nodes; anything else: DGX H100-class
        default = "nvlink-a100" if dev.name.startswith("A100") else DEFAULT
        link = load_interconnect(interconnect if isinstance(interconnect, str) else default)
    return dev, link


def analyze_layout(
    g: LayerGraph,
    layout: Layout,
    *,
    training: Training | None = None,
    is_training: bool = False,
    seq: int | None = None,
    dec_seq: int | None = None,
    dtype: str | None = None,
    device: str | Device | None = None,
    interconnect: str | Interconnect | None = None,
    prof: GraphProfile | None = None,
) -> LayoutCost:
    t = training or Training(global_batch=layout.dp)
    n, dtype = settings(g, seq, dtype)
    check_layout(g, layout, n)
    micro_batches = check_training(layout, t, is_training)
    blocks = block_count(g)
    if t.virtual_stages > 1 and blocks < layout.pp * t.virtual_stages:
        raise LayoutError(f"{blocks} blocks cannot fill pp={layout.pp} × {t.virtual_stages} virtual stages",
                          key=("blocks",))  # fmt: skip
    dev, link = devices_and_links(device, interconnect)
    prof = prof or profile(g, n, dec_seq, dtype, is_training)
    return Estimator(prof, dev, link).cost(layout, t, micro_batches)
