"""Parameter counts from the graph: total, active (MoE), embedding / head / the rest, by category."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ..ir.graph import LayerGraph, Op
from .costs import numel

EMBEDDING_CATEGORIES = ("embed", "pos")  # token, type and position tables, patch projection, class token
HEAD_CATEGORIES = ("lm_head", "head")


def active_fraction(op: Op) -> Fraction:
    """Share of an op's parameters one token uses: top-``active`` of ``experts`` for MoE, else all."""
    if op.kind == "moe":
        return Fraction(op.attrs["active"], op.attrs["experts"])
    return Fraction(1)


@dataclass
class ParamCounts:
    total: int = 0
    active: int = 0
    embedding: int = 0
    head: int = 0
    by_category: dict[str, int] = field(default_factory=dict)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    def to_dict(self) -> dict[str, object]:
        return {
            "total": self.total,
            "active": self.active,
            "embedding": self.embedding,
            "non_embedding": self.non_embedding,
            "head": self.head,
            "by_category": dict(self.by_category),
        }


def count_params(g: LayerGraph) -> ParamCounts:
    """Tied parameters are counted once, by the op that owns them."""
    pc = ParamCounts()
    for op in g.ops():
        n = sum(numel(p.shape) for p in op.params.values())
        if not n:
            continue
        pc.total += n
        pc.active += int(n * active_fraction(op))
        pc.by_category[op.category] = pc.by_category.get(op.category, 0) + n
        if op.category in EMBEDDING_CATEGORIES:
            pc.embedding += n
        elif op.category in HEAD_CATEGORIES:
            pc.head += n
    return pc
