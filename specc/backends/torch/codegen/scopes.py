"""The scope tree of a layer graph: which ops each module owns, what flows in and out, which scopes share a class.

Every dotted prefix of an op name is a scope (``blocks.3.attn``); a scope whose children are all numbered
(``blocks``) is a container, realised as an ``nn.ModuleList``. A scope's *region* is its ops; its inputs are the
values its ops read from outside (a tied parameter is not one: the tied module holds the owner's Parameter, see
``Model.tie_weights``), its outputs the values read outside or returned by the graph. Scopes with the same
structure and wiring share one class; constructor attributes that differ between them become that class's
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ....ir.graph import LayerGraph, Op
from .emitters import EMITTERS, ctor_attrs


@dataclass
class Unit:
    """One statement of a scope's forward: a leaf op, or a call of a child scope."""

    key: str  # child name relative to the owner ("qkv", "attn", "blocks.3")
    op: Op | None = None
    scope: Scope | None = None
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


@dataclass
class Scope:
    path: str  # "" for the model
    ops: list[Op] = field(default_factory=list)  # every op below, in graph order
    units: list[Unit] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    children: dict[str, Scope] = field(default_factory=dict)  # direct child scopes by name
    sig: Any = None
    needs_state: bool = False
    static: set[str] = field(default_factory=set)  # unit keys computed once per generated sequence

    def rel(self, name: str) -> str:
        return name[len(self.path) + 1 :] if self.path else name


def is_container(scope: Scope) -> bool:
    """Numbered children only (``blocks.0``, ``blocks.1``, ...) and no op of its own: an nn.ModuleList."""
    own = any("." not in scope.rel(op.name) for op in scope.ops)
    return bool(scope.children) and all(k.isdigit() for k in scope.children) and not own


def op_reads(op: Op) -> list[str]:
    return list(op.inputs)


def build_tree(graph: LayerGraph) -> Scope:
    root = Scope("")
    for op in graph.ops():
        parts = op.name.split(".")
        node = root
        node.ops.append(op)
        for i in range(len(parts) - 1):
            name = parts[i]
            if name not in node.children:
                node.children[name] = Scope(".".join(parts[: i + 1]))
            node = node.children[name]
            node.ops.append(op)
    consumers: dict[str, list[str]] = {}
    for op in graph.ops():
        for v in op_reads(op):
            consumers.setdefault(v, []).append(op.name)
    graph_outputs = set(graph.outputs.values())
    _wire(root, consumers, graph_outputs)
    return root


def _owner_key(scope: Scope, op: Op) -> str:
    """The unit of ``scope`` that runs ``op``: its direct child (two levels for a container's member)."""
    parts = scope.rel(op.name).split(".")
    head = parts[0]
    child = scope.children.get(head)
    if child is not None and len(parts) > 1 and is_container(child):
        return f"{head}.{parts[1]}"
    return head


def _region_io(ops: list[Op], consumers: dict[str, list[str]], graph_outputs: set[str]) -> tuple[list, list]:
    names = {op.name for op in ops}
    inputs: list[str] = []
    for op in ops:
        for v in op_reads(op):
            if v not in names and v not in inputs:
                inputs.append(v)
    outputs = [
        op.name for op in ops if op.name in graph_outputs or any(c not in names for c in consumers.get(op.name, []))
    ]
    return inputs, outputs


def _wire(scope: Scope, consumers: dict[str, list[str]], graph_outputs: set[str]) -> None:
    scope.inputs, scope.outputs = _region_io(scope.ops, consumers, graph_outputs)
    seen: dict[str, Unit] = {}
    for op in scope.ops:
        key = _owner_key(scope, op)
        if key in seen and scope.units[-1].key != key:
            raise AssertionError(f"ops of scope {scope.path}.{key} are not contiguous in graph order")
        if key not in seen:
            seen[key] = Unit(key)
            scope.units.append(seen[key])
        if scope.rel(op.name) == key:
            seen[key].op = op  # a leaf op; a child scope's ops are wired below
    for unit in scope.units:
        if unit.op is not None:
            unit.inputs, unit.outputs = op_reads(unit.op), [unit.op.name]
            continue
        head, _, index = unit.key.partition(".")
        child = scope.children[head].children[index] if index else scope.children[head]
        _wire(child, consumers, graph_outputs)
        unit.scope, unit.inputs, unit.outputs = child, child.inputs, child.outputs


# ----------------------------------------------------------------------------------------- classes


LOGIT_TRANSFORMS = ("scale", "softcap")  # per-position ops that may follow the head


def head_op(graph: LayerGraph) -> str | None:
    """The op whose input is cut to the last position while decoding: the head before the logit transforms."""
    name = graph.outputs.get("logits")
    while name is not None and name in graph.graph and graph.op(name).kind in LOGIT_TRANSFORMS:
        name = graph.op(name).inputs[0]
    return name


def signatures(scope: Scope, graph: LayerGraph, dynamic: set[str]) -> None:
    """Fill ``sig`` (structure + wiring), ``needs_state`` and ``static`` bottom-up."""
    logits = head_op(graph) if dynamic else None  # cut to the last position while decoding
    for unit in scope.units:
        if unit.scope is not None:
            signatures(unit.scope, graph, dynamic)
    has_dynamic = any(v in dynamic for u in scope.units for v in u.outputs)
    refs: dict[str, Any] = {v: ("in", i, _input_kind(v, graph)) for i, v in enumerate(scope.inputs)}
    parts = []
    for j, unit in enumerate(scope.units):
        static = has_dynamic and bool(dynamic) and not any(v in dynamic for v in unit.outputs)
        static = static and (unit.scope is not None or EMITTERS[unit.op.kind].ctor is not None)  # type: ignore[union-attr]
        if static:
            scope.static.add(unit.key)
        wiring = tuple(refs[v] for v in unit.inputs)
        if unit.op is not None:
            op = unit.op
            e = EMITTERS[op.kind]
            structural = (*((k, repr(getattr(op.attrs, k))) for k in e.structural), e.variant(op))
            part: tuple = ("op", unit.key, op.kind, structural, wiring, static, op.name == logits)
            scope.needs_state |= e.state(op) or static or op.name == logits
        else:
            assert unit.scope is not None
            part = ("scope", unit.key.split(".")[0] if "." in unit.key else unit.key, unit.scope.sig, wiring, static)
            scope.needs_state |= unit.scope.needs_state or static
        parts.append(part)
        for k, v in enumerate(unit.outputs):
            refs[v] = ("u", j, k)
    scope.sig = (tuple(parts), tuple(refs[v] for v in scope.outputs))


def _input_kind(value: str, graph: LayerGraph) -> str:
    return value if value in graph.inputs else "value"


def flat_attrs(scope: Scope) -> dict[tuple[str, str], Any]:
    """Constructor attributes of every module op below ``scope``, by (path relative to scope, key)."""
    out: dict[tuple[str, str], Any] = {}
    for op in scope.ops:
        for k, v in ctor_attrs(op).items():
            out[(scope.rel(op.name), k)] = v
    return out


def dynamic_values(graph: LayerGraph, step_input: str | None, growing: list[str]) -> set[str]:
    """Values that depend on the tokens being generated (empty for models that do not generate)."""
    if step_input is None:
        return set()
    moving = {step_input, *growing}
    for op in graph.ops():
        if any(i in moving for i in op.inputs):
            moving.add(op.name)
    return moving
