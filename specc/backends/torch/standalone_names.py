"""The Hugging Face name table of a standalone model.py, written from specc's weight-mapping plan.

The plan (specc/interop: a family's rules for every IR parameter) is computed for the graph and written as
data: specc name → alternatives (op | (op, *args), *HF names), with a block index folded into ``*`` wherever
every block follows the same rule; ``layers/hf.py``'s ``from_hf`` applies it. Only the tensor operations
the table uses are written (``HOW``).
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

from ...errors import SpecError
from ...interop.plan import Plan
from ...interop.registry import FAMILIES
from ...ir.graph import LayerGraph

# torch equivalents of specc.interop.tensor_ops, by a rule's op name: (tensors, *args) → tensor
HOW = {
    "copy": "lambda xs: xs[0]",
    "t": "lambda xs: xs[0].t().contiguous()",
    "cat": "lambda xs, dim: torch.cat(xs, dim)",
    "stack": "lambda xs: torch.stack(xs)",
    "reshape": "lambda xs, shape: xs[0].reshape(shape)",
    "rows": "lambda xs, start: xs[0][start:]",
    "narrow": "lambda xs, dim, start, stop: xs[0].narrow(dim, start, stop - start).contiguous()",
}
_IDENTITY = next(f.default for f in fields(Plan) if f.name == "finish")
_INDEX = re.compile(r"\.(\d+)\.")


def hf_plan(graph: LayerGraph) -> Plan | None:
    """The first Hugging Face family's plan that fills every parameter of the graph by renaming alone."""
    for family in FAMILIES:
        if graph.meta.get("family") not in family.kinds:
            continue
        try:
            plan = family.plan(graph, set())
        except SpecError:  # the family has no tensor for some parameter: not this spec's family
            continue
        # a plan that also transforms the built tensors, or has a rule not written as data, does not fit a table
        if plan.finish is _IDENTITY and all(r.op for rules in plan.rules.values() for r in rules):
            return plan
    return None


def hf_table(plan: Plan) -> dict[str, list[tuple[Any, ...]]]:
    """specc name → alternatives (op | (op, *args), *HF names); ``*`` stands for the block index where every
    block's rule is the same up to it."""
    exact = {t: [(r.op[0] if len(r.op) == 1 else r.op, *r.sources) for r in rs] for t, rs in plan.rules.items()}
    folded: dict[str, list[tuple[Any, ...]]] = {}
    keys: dict[str, list[str]] = {}
    clash: set[str] = set()
    for target, alternatives in exact.items():
        m = _INDEX.search(target)
        if m is None:
            folded[target] = alternatives
            continue
        i = m.group(1)
        pattern = target.replace(f".{i}.", ".*.", 1)
        if any("*" in s for alt in alternatives for s in alt[1:]):
            clash.add(pattern)
        alt = [(a[0], *(s.replace(f".{i}.", ".*.", 1) for s in a[1:])) for a in alternatives]
        if folded.setdefault(pattern, alt) != alt:
            clash.add(pattern)
        keys.setdefault(pattern, []).append(target)
    for pattern in clash:  # blocks that differ: every one of them by its own name
        del folded[pattern]
        folded.update({t: exact[t] for t in keys[pattern]})
    return folded


def hf_tied(plan: Plan) -> dict[str, str]:
    """HF names a checkpoint may hold beside the ones it is read from: tied copies → the tensor they equal."""
    sources = {s for rules in plan.rules.values() for r in rules for s in r.sources}
    out = {}
    for group in plan.tied:
        read = next((n for n in group if n in sources), None)
        out.update({n: read for n in group if read is not None and n not in sources})
    return out


def names_source(graph: LayerGraph) -> str:
    """The HF_NAMES / HF_TIED / HOW data of model.py, or '' where no Hugging Face family fits the graph."""
    plan = hf_plan(graph)
    if plan is None:
        return ""
    table = hf_table(plan)
    ops = {alt[0] if isinstance(alt[0], str) else alt[0][0] for alts in table.values() for alt in alts}
    rows: list[str] = []
    for key, alternatives in table.items():  # a table: short entries share lines of ≤ 120 columns
        entry = _entry(key, alternatives)
        if len(entry) == 1 and rows and len(rows[-1]) + 1 + len(entry[0]) <= 116 and not rows[-1].endswith("],"):
            rows[-1] += " " + entry[0]
        else:
            rows += entry
    how = ", ".join(f'"{k}": {HOW[k]}' for k in sorted(ops, key=list(HOW).index))
    doc = f"# {plan.family} names (specc's weight plan): specc name ← (op | (op, *args), *HF names) | [...]; * = block"
    head = f"HF_NAMES = {{  {doc}" if len(doc) <= 104 else f"{doc}\nHF_NAMES = {{"
    body = "".join(f"    {r}\n" for r in rows)
    tied = f"HF_TIED = {_literal(hf_tied(plan))}  # HF names that hold a copy of another tensor"
    return f"# fmt: off\n{head}\n{body}}}\n# fmt: on\n{tied}\nHOW = {{{how}}}\n"


def _entry(key: str, alternatives: list[tuple[Any, ...]]) -> list[str]:
    """One table entry as lines of ≤ 116 columns: on one line, or one alternative (one HF name) a line."""
    one = f'"{key}": {_literal(alternatives[0] if len(alternatives) == 1 else alternatives)},'
    if len(one) <= 116:
        return [one]
    lines = [f'"{key}": [']
    for alt in alternatives:
        text = f"    {_literal(alt)},"
        if len(text) > 116:
            text = "\n".join([f"    ({_literal(alt[0])},", *(f'        "{s}",' for s in alt[1:]), "    ),"])
        lines += text.split("\n")
    return [*lines, "],"]


def _literal(value: Any) -> str:
    """repr with double quotes, as ruff writes string literals (the names hold no quotes or backslashes)."""
    return repr(value).replace("'", '"')
