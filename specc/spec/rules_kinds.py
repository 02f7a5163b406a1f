"""Rules of ``layer_kinds`` / ``layer_pattern``: the pattern names defined kinds, every kind is used, a kind
overrides only what may vary per layer, and each kind's effective spec passes the attention, mlp and position
rules (blamed on the kind's own key when the kind sets it)."""

from __future__ import annotations

import difflib
from typing import Any

from . import kinds
from .rules_fields import attention_rules, kind_name, mlp_rules, position_rules, vit_rules
from .schema import EncoderDecoderSpec, ViTSpec, _Transformer
from .violation import Violation

SAME_EVERY_LAYER = ("heads", "kv_heads", "head_dim")  # the K/V cache layout and the projections' shapes


def layer_kinds(spec: _Transformer) -> Any:
    defined, pat = spec.layer_kinds, spec.layer_pattern
    if defined is None and pat is None:
        return
    if isinstance(spec, EncoderDecoderSpec):
        yield Violation(
            ("layer_kinds",) if defined is not None else ("layer_pattern",),
            f"layer kinds are not supported for kind {kind_name(spec)}",
            "use them on a decoder, encoder or ViT",
        )
        return
    if pat is None:
        yield Violation(("layer_kinds",), "layer_kinds needs layer_pattern", "add layer_pattern: [<kind>, ...]")
        return
    if not defined:
        yield Violation(("layer_pattern",), "layer_pattern needs layer_kinds", "define each kind under layer_kinds")
        return
    blocks = kinds.blocks_of(spec)
    if len(pat) > blocks:
        yield Violation(
            ("layer_pattern",),
            f"layer_pattern has {len(pat)} entries but the model has {blocks} blocks",
            "a pattern repeats over the blocks; an explicit per-layer list has exactly one entry per block",
            also=(("blocks",),),
        )
    bad = False
    for i, name in enumerate(pat):
        if name not in defined:
            bad = True
            near = difflib.get_close_matches(name, list(defined), 1)
            hint = f"did you mean {near[0]}?" if near else f"defined kinds: {', '.join(defined)}"
            yield Violation(("layer_pattern", i), f"unknown layer kind {name!r}", hint)
    if bad:
        return
    used = set(kinds.pattern(spec) or ())
    for name in defined:
        if name not in used:
            yield Violation(
                ("layer_kinds", name),
                f"layer kind {name!r} is never used by layer_pattern over {blocks} blocks",
                "remove it or name it in layer_pattern",
            )
    for name in defined:
        yield from _kind_rules(spec, name)


def _kind_rules(spec: _Transformer, name: str) -> Any:
    at = ("layer_kinds", name)
    for key in sorted(kinds.given(spec, name, "attention") & set(SAME_EVERY_LAYER)):
        yield Violation(
            (*at, "attention", key),
            f"attention.{key} is the same in every layer; layer kind {name!r} cannot change it",
            "set it at the top level",
        )
    pos = spec.layer_kinds[name].position  # type: ignore[index]
    if pos is not None and pos.model_fields_set:
        if "type" in pos.model_fields_set and pos.type not in ("rotary", "none"):
            yield Violation((*at, "position", "type"), f"a layer kind's position is rotary or none, not {pos.type}")
            return
        if pos.type == "none" and pos.model_fields_set != {"type"}:
            key = sorted(pos.model_fields_set - {"type"})[0]
            yield Violation((*at, "position", key), f"position.{key} is not used by a layer kind without positions")
            return
        if spec.position.type not in ("rotary", "none"):
            yield Violation(
                (*at, "position"),
                f"layer kinds vary rotary positions per layer, but the model's positions are {spec.position.type} "
                "(added once, at the embedding)",
                "use position: rotary (or none) at the top level",
                also=(("position", "type"),),
            )
            return
    eff = kinds.effective(spec, name)
    if eff is spec:
        return
    rules = (attention_rules, mlp_rules, position_rules, *((vit_rules,) if isinstance(spec, ViTSpec) else ()))
    top = {(v.path, v.message) for rule in rules for v in rule(spec)}
    for rule in rules:
        for v in rule(eff):
            if (v.path, v.message) in top:
                continue  # reported once, at the top level
            part = str(v.path[0])
            keys = kinds.given(spec, name, part)
            own = "*" in keys or (len(v.path) > 1 and v.path[1] in keys)
            path = (*at, *v.path) if own else v.path
            also = v.also if own else ((*at, part), *v.also)
            yield Violation(path, f"layer kind {name!r}: {v.message}", v.hint, also=also)
