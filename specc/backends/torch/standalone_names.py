"""The Hugging Face name table of a standalone model.py, written from specc's weight-mapping plan.

The plan (specc/interop: a family's rules for every IR parameter) is computed for the graph and written as
data: specc name → alternatives (op | (op, *args), *HF names), with a block index folded into ``*`` wherever
every block follows the same rule and the experts of a stack into ``#``; ``layers/hf.py``'s ``from_hf``
applies it. Only the tensor operations the table uses are written (``HOW``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from ...errors import SpecError
from ...interop.registry import FAMILIES
from ...interop.weight_map import Plan, Rule
from ...ir.graph import LayerGraph

# torch equivalents of specc.interop.tensor_ops, by a rule's op name: (tensors, *args) → tensor
HOW = {
    "copy": "lambda xs: xs[0]",
    "t": "lambda xs: xs[0].t().contiguous()",
    "cat": "lambda xs, dim: torch.cat(xs, dim)",
    "stack": "lambda xs: torch.stack(xs)",
    "reshape": "lambda xs, shape: xs[0].reshape(shape)",
    "rows": "lambda xs, start: xs[0][start:]",
    # parts a..b of a tensor cut into `of` equal parts along dim: shares, so a smaller build(config=...) loads too
    "parts": "lambda xs, dim, a, b, of: torch.cat(xs[0].tensor_split(of, dim)[a:b], dim)",
    "interleave": "lambda xs, dim: xs[0].unflatten(dim, (2, -1)).transpose(dim, dim + 1).flatten(dim, dim + 1)",
    # rows stored group by group [g: sizes[0] blocks, sizes[1] blocks, ...] → part by part (NeoX/Falcon q/k/v)
    "regroup": "lambda xs, groups, sizes: torch.cat([p.flatten(0, 2) for p in xs[0].unflatten(0, "
    "(groups, sum(sizes), -1)).split(sizes, 1)])",
    "swap": "lambda xs: xs[0].transpose(-1, -2).contiguous()",
    "parts_swap": "lambda xs, dim, a, b, of: torch.cat(xs[0].tensor_split(of, dim)[a:b], dim)"
    ".transpose(-1, -2).contiguous()",
    # entries start::step of an axis (GPT-OSS's interleaved gate / up), then maybe the last two axes swapped
    "every": "lambda xs, dim, start, step, swapped: (lambda y: y.transpose(-1, -2) if swapped else y)("
    "xs[0][(slice(None),) * dim + (slice(start, None, step),)]).contiguous()",
}
_INDEX = re.compile(r"\.(\d+)\.")


def hf_plan(graph: LayerGraph) -> Plan | None:
    """The first Hugging Face family's plan that fills every parameter of the graph by renaming alone; for a
    spec imported from a config.json only its own family's (another family's names would refuse its checkpoint)."""
    source = str(graph.meta.get("source") or "")
    named = [f for f in FAMILIES if any(re.search(rf"\b{a}\b", source) for a in f.architectures)]
    for family in named or FAMILIES:
        if graph.meta.get("family") not in family.kinds:
            continue
        try:
            plan = family.plan(graph, set())
        except SpecError:  # the family has no tensor for some parameter: not this spec's family
            continue
        # every rule, and every reordering after it, must be written as data the table can carry
        if all(r.op for rules in plan.rules.values() for r in rules) and all(a[0] in HOW for a in plan.after.values()):
            return plan
    return None


def hf_table(plan: Plan, vectors: set[str] = frozenset()) -> dict[str, list[tuple[Any, ...]]]:  # type: ignore[assignment]
    """specc name → alternatives (op | (op, *args), *HF names); ``*`` stands for the block index where every
    block's rule is the same up to it; a module's parameters in one ``module.`` entry where they rename alike
    (``vectors``: the 1-D parameters, which ``t`` leaves as they are)."""
    exact = {t: [(_op(_shares(r), plan.after.get(t)), *r.sources) for r in rs] for t, rs in plan.rules.items()}
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
    folded = {t: [_every_expert(alt) for alt in alts] for t, alts in folded.items()}
    return _by_module(folded, vectors)


def _every_expert(alternative: tuple[Any, ...]) -> tuple[Any, ...]:
    """A stack of experts 0 .. E-1 stored one tensor each as one name with ``#`` for the expert: from_hf
    stacks as many as the parameter has (so a variant with fewer experts loads its own checkpoint)."""
    op, *sources = alternative
    if op != "stack" or len(sources) < 2:
        return alternative
    forms = [re.fullmatch(r"(.*\.)(\d+)(\..*)", s) for s in sources]
    if not all(forms) or len({(m[1], m[3]) for m in forms}) != 1:  # type: ignore[index]
        return alternative
    if [int(m[2]) for m in forms] != list(range(len(sources))):  # type: ignore[index]
        return alternative
    return (op, f"{forms[0][1]}#{forms[0][3]}")  # type: ignore[index]


def _by_module(table: dict[str, list[tuple[Any, ...]]], vectors: set[str]) -> dict[str, list[tuple[Any, ...]]]:
    """A module whose every parameter renames alike (``name.`` → ``hf.`` + its local name) as one ``name.``
    entry; ``copy`` of a 1-D parameter reads as ``t`` beside a transposed weight (``t`` leaves a vector as it is:
    Conv1D's weight and bias)."""
    modules: dict[str, dict[str, list[tuple[Any, ...]] | None]] = {}
    for key, alternatives in table.items():
        module, _, local = key.rpartition(".")
        shared: list[tuple[Any, ...]] | None = []
        for op, *sources in alternatives:
            if not all(s.endswith("." + local) for s in sources) or shared is None:
                shared = None
                continue
            shared.append((op, *(s[: -len(local)] for s in sources)))
        modules.setdefault(module + "." if module else key, {})[key] = shared
    out: dict[str, list[tuple[Any, ...]]] = {}
    for module, members in modules.items():
        forms = list(members.values())
        if all(f is not None for f in forms) and len(members) > 0 and module.endswith("."):
            if all(f == forms[0] for f in forms):
                out[module] = forms[0]  # type: ignore[assignment]
                continue
            t = {
                k: [("t" if op == "copy" and _vector(k, vectors) else op, *x) for op, *x in f]
                for k, f in members.items()
            }
            as_t = list(t.values())
            if all(f == as_t[0] for f in as_t) and any(op == "t" for op, *_ in as_t[0]):
                out[module] = as_t[0]
                continue
        out.update({k: table[k] for k in members})
    return out


def _vector(key: str, vectors: set[str]) -> bool:
    """Whether ``key`` (``*`` a block index) names 1-D parameters."""
    pattern = re.escape(key).replace(r"\*", r"\d+")
    return any(re.fullmatch(pattern, v) for v in vectors)


def _shares(rule: Rule) -> tuple[Any, ...]:
    """A slice of a fused tensor as parts of it (``narrow`` 0:11008 of 22016 → parts 0:1 of 2): the plan's
    families fuse in fixed ratios (gate | up, q | k v), so the parts hold for every size; the sizes do not."""
    if not rule.op or rule.op[0] not in ("narrow", "narrow_swap"):
        return rule.op
    name, axis, start, stop = rule.op
    size = rule.expect[0][axis]
    unit = math.gcd(start, stop, size)
    return ("parts" + name[len("narrow") :], axis, start // unit, stop // unit, size // unit)


def _op(op: tuple[Any, ...], after: tuple[Any, ...] | None) -> Any:
    """A rule's op as the table writes it: "name" | (name, *args); a reordering after it composes as
    ("name>then", *args, *then_args)."""
    if after is not None:
        op = (f"{op[0]}>{after[0]}", *op[1:], *after[1:])
    return op[0] if len(op) == 1 else op


def _how(name: str) -> str:
    """The HOW entry of an op name: a tensor operation, or ``a>b`` (b applied to a's result)."""
    first, _, then = name.partition(">")
    if not then:
        return HOW[first]
    return f'lambda xs, *a: HOW["{then}"]([HOW["{first}"](xs, *a[:-1])], *a[-1:])'


def skip_pattern(plan: Plan) -> str:
    """The checkpoint names the plan does not read and that are not errors: buffers and heads not built."""
    return "|".join(p for p in (plan.ignore, plan.dropped) if p) or "$^"


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
    table = hf_table(plan, {k for k, p in graph.params().items() if len(p.shape) == 1})
    ops = {alt[0] if isinstance(alt[0], str) else alt[0][0] for alts in table.values() for alt in alts}
    ops |= {part for name in ops for part in name.split(">")}  # a composed op calls its parts
    rows: list[str] = []
    for key, alternatives in table.items():  # a table: short entries share lines of ≤ 120 columns
        entry = _entry(key, alternatives)
        if len(entry) == 1 and rows and len(rows[-1]) + 1 + len(entry[0]) <= 116 and not rows[-1].endswith("],"):
            rows[-1] += " " + entry[0]
        else:
            rows += entry
    order = [*HOW, *sorted(n for n in ops if n not in HOW)]  # tensor operations first, compositions after
    how = ", ".join(f'"{k}": {_how(k)}' for k in sorted(ops, key=order.index))
    doc = f"# {plan.family} names (specc's weight plan): specc name ← (op | (op, *args), *HF names) | [...]; * = block"
    doc += ", # = expert" if any("#" in s for alts in table.values() for alt in alts for s in alt[1:]) else ""
    head = f"HF_NAMES = {{  {doc}" if len(doc) <= 104 else f"{doc}\nHF_NAMES = {{"
    body = "".join(f"    {r}\n" for r in rows)
    tied = f'HF_TIED, HF_SKIP = {_literal(hf_tied(plan))}, r"{skip_pattern(plan)}"'
    tied += "  # HF names that copy another tensor; that are not weights" if len(tied) <= 60 else ""
    return f"{head}\n{body}}}\n{tied}\nHOW = {{{how}}}\n"


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
