"""Group scopes into classes and name them; work out each class's constructor parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .. import layers
from .scopes import Scope, flat_attrs

LIBRARY_NAMES = {*layers.__all__, "SpeccModel", "F", "Tensor", "nn", "torch", "Path"}  # names the source uses
SCOPE_CLASS_NAMES = {
    "blocks": "Block",
    "layers": "Layer",
    "attn": "Attention",
    "cross_attn": "CrossAttentionLayer",
    "mlp": "MLP",
    "shared": "SharedExpert",
    "encoder": "Encoder",
    "decoder": "Decoder",
    "pooler": "Pooler",
    "mlm": "MLMHead",
}
ROOT_NAMES = {
    "causal_lm": "CausalLM",
    "masked_lm": "MaskedLM",
    "pooled_encoder": "PooledEncoder",
    "encoder": "EncoderModel",
    "seq2seq": "Seq2Seq",
    "seq2seq_hidden": "Seq2SeqModel",
    "image_classification": "ImageClassifier",
    "image_encoder": "ImageEncoder",
    "image_text": "DualEncoder",
}


@dataclass
class ClassPlan:
    name: str
    members: list[Scope]
    params: dict[tuple[str, str], str] = field(default_factory=dict)  # (rel op path, attr) → parameter name
    order: list[int] = field(default_factory=list)  # forward's parameters: indices into the region inputs
    input_names: list[str] = field(default_factory=list)  # by region input index

    @property
    def rep(self) -> Scope:
        return self.members[0]


def class_scopes(root: Scope) -> list[Scope]:
    """Every scope that becomes a class, children before parents (first appearance order)."""
    out: list[Scope] = []

    def visit(s: Scope) -> None:
        for unit in s.units:
            if unit.scope is not None:
                visit(unit.scope)
        out.append(s)

    visit(root)
    return out


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^0-9A-Za-z]+", name) if p) or "Scope"


def _base_name(scope: Scope) -> str:
    parts = scope.path.split(".")
    if parts[-1].isdigit():  # member of a container: blocks.3 → Block, encoder.blocks.3 → EncoderBlock
        container = parts[-2]
        prefix = _camel(parts[-3]) if len(parts) > 2 else ""
        return prefix + SCOPE_CLASS_NAMES.get(container, _camel(container.rstrip("s")))
    return SCOPE_CLASS_NAMES.get(parts[-1], _camel(parts[-1]))


def plan_classes(root: Scope, task: str) -> dict[Any, ClassPlan]:
    """Scopes grouped by signature → one ClassPlan each (the model's own class last)."""
    groups: dict[Any, list[Scope]] = {}
    for s in class_scopes(root):
        groups.setdefault(s.sig if s is not root else ("root",), []).append(s)
    taken = set(LIBRARY_NAMES)
    plans: dict[Any, ClassPlan] = {}
    for sig, members in groups.items():
        base = ROOT_NAMES.get(task, "Model_") if members[0] is root else _base_name(members[0])
        name, k = base, 2
        while name in taken:
            name, k = f"{base}{k}", k + 1
        taken.add(name)
        plan = ClassPlan(name, members)
        plan.params = _params(members)
        plans[sig] = plan
    return plans


def _params(members: list[Scope]) -> dict[tuple[str, str], str]:
    """Constructor attributes whose values differ between the members, named by attribute where unique."""
    values = [flat_attrs(m) for m in members]
    varying = [k for k in values[0] if any(v.get(k) != values[0][k] for v in values[1:])]
    counts: dict[str, int] = {}
    for _, attr in varying:
        counts[attr] = counts.get(attr, 0) + 1
    return {(path, attr): attr if counts[attr] == 1 else f"{path.replace('.', '_')}_{attr}" for path, attr in varying}
