"""A weight-mapping plan: how each specc parameter is built from checkpoint tensors, checked before it runs.

A family (``hf_gpt2.py``, ...) says, for every parameter of the graph, which checkpoint tensors it comes from
and how they combine (copy, transpose, concatenate, stack, slice). The plan is checked on shapes alone first
(so ``import-hf`` can check a checkpoint header without reading it), then run on tensors. Every problem names
the checkpoint tensor and the specc parameter involved, all of them at once.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import Diagnostic, SpecError
from . import tensor_ops as ops

ShapeT = tuple[int, ...]
MAX_LISTED = 12  # problems listed per kind before "... and N more"


@dataclass(frozen=True)
class Rule:
    """One way to build a target parameter from checkpoint tensors of the expected shapes, as data: ``op`` is a
    tensor operation of ``tensor_ops.OPS`` with its arguments, which the engine runs forwards (import, the
    standalone model.py's loader) and backwards (export)."""

    sources: tuple[str, ...]
    expect: tuple[ShapeT, ...]
    how: str  # for messages: "copy", "transposed (Conv1D)", ...
    op: tuple[Any, ...]  # (name, *args)

    def build(self, *xs: Any) -> Any:
        return ops.apply(self.op, list(xs))


def copy(src: str, shape: ShapeT) -> Rule:
    return Rule((src,), (shape,), "copy", ("copy",))


def transposed(src: str, shape: ShapeT) -> Rule:
    """GPT-2 ``Conv1D`` stores ``[in, out]``; specc's linear weight is ``[out, in]``."""
    return Rule((src,), (shape[::-1],), "transposed (Conv1D [in, out])", ("t",))


def concat(srcs: list[str], shape: ShapeT, sizes: list[int]) -> Rule:
    """Separate projections packed along the output axis (q, k, v → packed qkv)."""
    if sum(sizes) != shape[0]:
        raise ValueError(f"split sizes {sizes} do not add up to {shape[0]}")
    expect = tuple((n, *shape[1:]) for n in sizes)
    return Rule(tuple(srcs), expect, "concatenated", ("cat", 0))


def stacked(srcs: list[str], shape: ShapeT) -> Rule:
    """Per-expert matrices stacked into ``[E, out, in]``."""
    return Rule(tuple(srcs), (shape[1:],) * len(srcs), "stacked", ("stack",))


def squeezed(src: str, shape: ShapeT, lead: int = 1) -> Rule:
    """A tensor stored with leading unit axes (ViT positions ``[1, T, D]``, BART ``final_logits_bias [1, V]``)."""
    return Rule((src,), ((1,) * lead + shape,), "leading unit axes dropped", ("reshape", shape))


def rows_from(src: str, shape: ShapeT, offset: int) -> Rule:
    """A table whose first ``offset`` rows are never used (BART's learned positions start at 2)."""
    expect = (shape[0] + offset, *shape[1:])
    return Rule((src,), (expect,), f"first {offset} rows dropped", ("rows", offset))


def part(src: str, shape: ShapeT, full: ShapeT, axis: int, start: int) -> Rule:
    """A slice of a fused tensor (gate of a fused ``gate_up_proj``)."""
    stop = start + shape[axis]
    return Rule((src,), (full,), f"slice {start}:{stop} of axis {axis}", ("narrow", axis, start, stop))


@dataclass
class Plan:
    """Rules per target (first complete alternative wins), plus what the checkpoint may hold beyond them."""

    family: str
    rules: dict[str, list[Rule]]
    # groups of checkpoint tensors the spec ties into one parameter: those present must all be equal
    tied: list[tuple[str, ...]] = field(default_factory=list)
    # Both as regular expressions searched in a checkpoint name (data, so model.py can carry them; "" = none):
    # tensors that are not weights (buffers such as position_ids or a causal-mask table), and weights of heads
    # the spec does not build (BERT's NSP head, a ViT pooler), dropped with a warning
    ignore: str = ""
    dropped: str = ""
    # a last exact reordering of built tensors, as data: target → (op, *args) of tensor_ops (Marian's
    # residual-stream permutation: ("interleave", axis))
    after: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def ignores(self, name: str) -> bool:
        return bool(self.ignore) and re.search(self.ignore, name) is not None

    def drops(self, name: str) -> bool:
        return bool(self.dropped) and re.search(self.dropped, name) is not None

    def finish(self, built: dict[str, Any]) -> dict[str, Any]:
        """``built`` with the ``after`` operations applied."""
        for target, op in self.after.items():
            built[target] = ops.apply(op, [built[target]])
        return built


@dataclass
class Checked:
    chosen: dict[str, Rule]
    problems: list[Diagnostic]
    dropped: list[str]  # head tensors left out


def check(plan: Plan, shapes: Mapping[str, ShapeT]) -> Checked:
    """Pick a rule per target and collect missing, mis-shaped and unexpected tensors by name."""
    chosen: dict[str, Rule] = {}
    missing: list[str] = []
    misshaped: list[str] = []
    for target, options in plan.rules.items():
        rule = next((r for r in options if all(s in shapes for s in r.sources)), None)
        if rule is None:
            best = max(options, key=lambda r: sum(s in shapes for s in r.sources))
            absent = [s for s in best.sources if s not in shapes]
            missing.append(f"{', '.join(absent)} → {target}")
            continue
        chosen[target] = rule
        for s, want in zip(rule.sources, rule.expect, strict=True):
            got = tuple(shapes[s])
            if got != want:
                misshaped.append(f"{s}: shape {list(got)}, expected {list(want)} for {target} ({rule.how})")
    used = {s for r in chosen.values() for s in r.sources}
    skipped = {n for n in shapes if n not in used and (plan.ignores(n) or plan.drops(n))}
    tied = {n for group in plan.tied for n in group}
    unexpected = [n for n in shapes if n not in used and n not in tied and n not in skipped]
    for first, other in _tied_pairs(plan, shapes):
        if tuple(shapes[other]) != tuple(shapes[first]):
            misshaped.append(f"{other}: shape {list(shapes[other])} differs from {first} {list(shapes[first])}, tied")
    problems: list[Diagnostic] = []
    label = f"{plan.family} checkpoint"
    problems += listed(f"{label}: missing tensor", missing, "the spec needs these; does the checkpoint match it?")
    problems += listed(f"{label}: mis-shaped tensor", misshaped, "check the spec's sizes against config.json")
    hint = _layers_hint(unexpected) or "the spec does not use these; does it match the model?"
    problems += listed(f"{label}: unexpected tensor", unexpected, hint)
    return Checked(chosen, problems, sorted(n for n in skipped if plan.drops(n)))


def warn_dropped(plan: Plan, checked: Checked, stacklevel: int = 3) -> None:
    """One warning naming the checkpoint's tensors of heads the spec does not build (dropped, not an error)."""
    if checked.dropped:
        shown = ", ".join(checked.dropped[:6]) + (" ..." if len(checked.dropped) > 6 else "")
        warnings.warn(
            f"{plan.family} checkpoint: dropping {len(checked.dropped)} tensors of heads the spec does not build: "
            f"{shown}",
            stacklevel=stacklevel,
        )


def run(plan: Plan, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """Check, then build every target; tensors the spec ties together must hold equal values."""
    checked = check(plan, {k: tuple(ops.shape(v)) for k, v in tensors.items()})
    if checked.problems:
        raise SpecError(checked.problems)
    differing = [
        f"{b} differs from {a}" for a, b in _tied_pairs(plan, tensors) if not ops.equal(tensors[a], tensors[b])
    ]
    if differing:
        raise SpecError(
            listed(
                f"{plan.family} checkpoint: untied tensor",
                differing,
                "the spec ties these weights but the checkpoint holds different values: untie them in the spec "
                "(tie_embeddings: false / shared_embeddings: false)",
            )
        )
    warn_dropped(plan, checked, stacklevel=4)
    return plan.finish({t: r.build(*(tensors[s] for s in r.sources)) for t, r in checked.chosen.items()})


def _tied_pairs(plan: Plan, present: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(first present member, another present member) of every tied group."""
    pairs = []
    for group in plan.tied:
        here = [n for n in group if n in present]
        pairs += [(here[0], n) for n in here[1:]]
    return pairs


def _layers_hint(names: list[str]) -> str | None:
    """When surplus tensors belong to numbered layers, say how many layers the checkpoint has."""
    found = [int(m.group(1)) for n in names if (m := re.search(r"\.(?:h|layers|layer)\.(\d+)\.", n))]
    if not found:
        return None
    return f"the checkpoint has layers up to index {max(found)}: does the spec have as many blocks?"


def listed(what: str, items: list[str], hint: str) -> list[Diagnostic]:
    if not items:
        return []
    shown = [Diagnostic(f"{what}: {i}") for i in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        shown.append(Diagnostic(f"... and {len(items) - MAX_LISTED} more"))
    return [*shown[:-1], Diagnostic(shown[-1].message, hint=hint)]


def regrouped(src: str, shape: ShapeT, groups: int, sizes: tuple[int, ...], how: str) -> Rule:
    """Rows of a fused tensor stored group by group (``tensor_ops.regroup``): per-head or per-group q/k/v. A
    shape that does not split is a SpecError: the family's layout does not fit this spec (name-table search
    tries the next family; an import reports it located)."""
    if shape[0] % (groups * sum(sizes)):
        raise SpecError(f"{shape[0]} rows of {src} do not split into {groups} groups of {sum(sizes)} blocks")
    return Rule((src,), (shape,), f"rows regrouped ({how})", ("regroup", groups, sizes))


def reverse(plan: Plan, params: Mapping[str, Any], present: set[str]) -> dict[str, Any]:
    """Run the plan backwards: checkpoint tensors (HF names) from specc parameters. Per target the first rule
    whose sources are all among ``present`` (the names the checkpoint's class has) is inverted; a source several
    rules fill (slices of a fused tensor) is assembled, and one two rules give different values is refused."""
    out: dict[str, Any] = {}
    parts: dict[str, list[ops.Part]] = {}
    problems: list[str] = []
    for target, options in plan.rules.items():
        rule = next((r for r in options if all(s in present for s in r.sources)), None)
        if rule is None:
            problems.append(f"{target}: the class has none of {', '.join(options[0].sources[:3])}")
            continue
        value = params[target]
        if target in plan.after:  # undo the reordering first: it was applied last
            value = ops.unapply(plan.after[target], value, (ops.shape(value),))[0]
        for src, got in zip(rule.sources, ops.unapply(rule.op, value, rule.expect), strict=True):
            if isinstance(got, ops.Part):
                parts.setdefault(src, []).append(got)
            elif src in out and not ops.equal(out[src], got):
                problems.append(f"{src}: two parameters give it different values")
            else:
                out[src] = got
    for src, pieces in parts.items():
        whole = ops.assemble(pieces)
        if whole is None:
            problems.append(f"{src}: its slices do not cover it exactly")
        else:
            out[src] = whole
    if problems:
        raise SpecError(listed(f"{plan.family} export: cannot write tensor", problems, "the spec and the class differ"))
    return out
