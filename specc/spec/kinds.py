"""Layer kinds: which kind each block is (``layer_pattern`` repeated over the blocks) and the effective spec of
a kind (its attention / position overrides merged onto the top level, its mlp replacing the top level's).

Rules and lowering both read a kind through ``effective``: every existing rule and lowering helper then works
on it unchanged.
"""

from __future__ import annotations

from typing import Any

from .schema import Attention, Position, _Transformer

OVERRIDES = ("attention", "position", "mlp")


def blocks_of(spec: _Transformer) -> int:
    b = getattr(spec, "blocks", 0)
    return b if isinstance(b, int) else 0


def pattern(spec: _Transformer) -> list[str] | None:
    """The kind name of every block, or None when the spec has no layer kinds."""
    p = spec.layer_pattern
    if not p or not spec.layer_kinds:
        return None
    n = blocks_of(spec)
    return [p[i % len(p)] for i in range(n)]


def given(spec: _Transformer, name: str, part: str) -> set[str]:
    """The keys of ``part`` that kind ``name`` sets (``{"*"}`` for an mlp, which is replaced whole)."""
    kind = (spec.layer_kinds or {}).get(name)
    value = getattr(kind, part, None) if kind is not None else None
    if value is None:
        return set()
    return {"*"} if part == "mlp" else set(value.model_fields_set)


def effective(spec: _Transformer, name: str) -> Any:
    """The spec as the layers of kind ``name`` see it (the spec itself for a kind that overrides nothing)."""
    kind = (spec.layer_kinds or {})[name]
    update: dict[str, Any] = {}
    if kind.attention is not None and kind.attention.model_fields_set:
        update["attention"] = Attention.model_validate(
            {**spec.attention.model_dump(), **kind.attention.model_dump(include=kind.attention.model_fields_set)}
        )
    if kind.position is not None and kind.position.type == "none":
        update["position"] = Position(type="none")  # NoPE: none of the top level's rotary settings apply
    elif kind.position is not None and kind.position.model_fields_set:
        update["position"] = Position.model_validate(
            {**spec.position.model_dump(), **kind.position.model_dump(include=kind.position.model_fields_set)}
        )
    if kind.mlp is not None:
        update["mlp"] = kind.mlp
    if not update:
        return spec
    return spec.model_copy(update={**update, "layer_kinds": None, "layer_pattern": None})
