"""Costs per layer kind (``layer_kinds`` / ``layer_pattern``): lowering records each block's kind in the graph
meta; this groups the layers of each kind and reports one layer's FLOPs and KV cache, and the kind's count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.graph import LayerGraph
from ..ir.ops import ATTENTION_KINDS
from . import fmt
from .op_costs import OpCost, Totals
from .sections import Section


@dataclass(frozen=True)
class KindCosts:
    layers: list[int]  # block indices of this kind
    one: Totals  # FLOPs of its first layer
    kv_cache: int  # bytes one layer of this kind caches (sliding: at most the window; chunked: the chunk)
    attention: dict[str, Any]  # the mask (and window / chunk) of its self-attention

    def to_dict(self) -> dict[str, Any]:
        from .report_json import totals_dict

        return {
            "layers": len(self.layers),
            "indices": self.layers,
            **self.attention,
            "kv_cache_per_layer": self.kv_cache,
            **totals_dict(self.one, split=False),
        }


def per_kind(g: LayerGraph, costs: list[OpCost], decode: set[str] | None) -> dict[str, KindCosts] | None:
    pattern = g.meta.get("layer_kinds")
    if not pattern:
        return None
    out = {}
    for kind in dict.fromkeys(pattern):
        layers = [i for i, k in enumerate(pattern) if k == kind]
        first = [c for c in costs if c.op.layer == layers[0] and c.op.stack is None]
        attn = next((c.op for c in first if c.op.kind in ATTENTION_KINDS and not c.op.attrs.cross), None)
        shown = {}
        if attn is not None:
            a = attn.attrs
            shown = {k: v for k, v in (("mask", a.mask), ("window", a.window), ("chunk", a.chunk)) if v is not None}
        cache = sum(c.mem.kv_cache for c in first if decode is not None and c.op.name in decode)
        out[kind] = KindCosts(layers, Totals.of(first), cache, shown)
    return out


def kinds_section(kinds: dict[str, KindCosts]) -> Section:
    s = Section("Layer kinds", ["kind", "layers", "attention", "FLOPs/layer", "FLOPs (all)", "KV cache/layer"])
    for name, k in kinds.items():
        a = k.attention
        mask = a.get("mask", "-") + "".join(f" {key} {a[key]}" for key in ("window", "chunk") if key in a)
        n = len(k.layers)
        s.add(name, str(n), mask, fmt.flops(k.one.total), fmt.flops(n * k.one.total), fmt.nbytes(k.kv_cache))
    s.notes.append("KV cache per layer: a sliding-window layer holds at most its window, a chunked layer its chunk")
    s.notes.append("the per-layer column of Forward FLOPs shows block 0; the rows above are each kind's own")
    return s
