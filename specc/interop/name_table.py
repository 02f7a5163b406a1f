"""A family's weight names as data: specc parameter name ← checkpoint (HF) names + a tensor operation.

A ``Table`` row maps a pattern of specc names to alternatives (the first one a checkpoint holds wins), each a
checkpoint name to copy, or ``(op, *names)``. In patterns and names, ``*`` is the block index, ``{k}`` the
parameter's last name part (``weight``, ``bias``), ``{s}`` the stack (``encoder``, ``decoder``), ``{p}`` the
wrapper prefix a task model adds (``transformer.``, absent in a bare model's checkpoint), ``{e}`` an expert
index (``stack`` over the experts) and ``{tf}`` the TensorFlow-era name of a LayerNorm part (gamma, beta).
The operations (``op`` or ``(op, *args)``):

- ``t``: transposed (GPT-2's Conv1D ``[in, out]``);
- ``cat``: concatenated along the output axis, split by heads: q, k, v (or k, v) of the attention's sizes;
- ``stack``: per-expert tensors stacked into ``[E, out, in]``;
- ``("half", axis, i)``: half ``i`` of a fused tensor twice as long on ``axis`` (``gate_up_proj``), and
  ``("half", axis, i, True)`` of one stored ``[.., in, out]`` (the half taken, then the last two axes swapped:
  Llama 4's experts);
  ``("parts", axis, sizes, i)``: part ``i`` of a tensor packed from parts of relative ``sizes`` on ``axis``;
- ``squeeze``: stored with a leading unit axis; ``unsqueeze``: stored without the leading unit axes;
  ``("rows", n)``: the first n rows are never read;
- ``("regroup", layout)``: fused q/k/v rows stored per head or per KV group (``hf_fused_qkv``);
- ``swap``: stored ``[.., in, out]`` (GPT-OSS's experts); ``("every", axis, start, step, swapped)``: entries
  ``start::step`` of ``axis`` (GPT-OSS's interleaved gate / up), then the last two axes swapped when ``swapped``.

``plan`` expands a table against a graph into the rules (``weight_map``) that import, the standalone model.py's
loader and export all run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SpecError
from ..ir.graph import LayerGraph
from .hf_fused_qkv import fused_rule
from .weight_map import Plan, Rule, ShapeT, concat, copy, part, rows_from, squeezed, stacked, transposed

Alternative = str | tuple[Any, ...]  # a name to copy, or (op | (op, *args), *names)
_TF = {"weight": "gamma", "bias": "beta"}


@dataclass(frozen=True)
class Table:
    family: str  # for messages: "GPT-2"
    rows: Mapping[str, Alternative | list[Alternative]]
    prefix: str = ""  # what ``{p}`` stands for when the checkpoint's names carry it
    tied: tuple[tuple[str, ...], ...] = ()  # groups of checkpoint names holding one tensor
    ignore: tuple[str, ...] = ()  # regular expressions of checkpoint tensors that are not weights
    dropped: tuple[str, ...] = ()  # ... and of weights of heads the spec does not build (dropped with a warning)
    after: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # target → a reordering of the built tensor


def plan(table: Table, g: LayerGraph, names: set[str]) -> Plan:
    """The rules for every parameter of ``g``; a parameter no row names is an error naming it."""
    p = table.prefix if table.prefix and any(n.startswith(table.prefix) for n in names) else ""
    rows = [(_pattern(key), alts if isinstance(alts, list) else [alts]) for key, alts in table.rows.items()]
    rules: dict[str, list[Rule]] = {}
    orphans: list[str] = []
    for target, param in g.params().items():
        found = next(((m, alts) for rx, alts in rows if (m := rx.fullmatch(target))), None)
        if found is None:
            orphans.append(target)
            continue
        m, alts = found
        fields = {"p": p, "k": target.rsplit(".", 1)[1], **{k: v for k, v in m.groupdict().items() if v is not None}}
        rules[target] = [_rule(g, target, param.shape, alt, fields) for alt in alts]
    if orphans:
        family = table.family
        raise SpecError(
            f"{family} checkpoints have no tensor for {', '.join(orphans[:8])}" + (" ..." if len(orphans) > 8 else ""),
            hint=f"the spec has parts a {family} model does not (e.g. biases, heads): import its config.json with "
            "`specc import-hf` to get a matching spec",
        )
    return Plan(
        table.family,
        rules,
        tied=[tuple(_name(n, {"p": p}) for n in group) for group in table.tied],
        ignore="|".join(_name(r, {"p": re.escape(p)}) for r in table.ignore),
        dropped="|".join(_name(r, {"p": re.escape(p)}) for r in table.dropped),
        after=dict(table.after),
    )


def _pattern(key: str) -> re.Pattern[str]:
    rx = re.escape(key).replace(r"\*", r"(?P<i>\d+)", 1).replace(r"\{k\}", r"(?P<k>[A-Za-z_]+)")
    return re.compile(rx.replace(r"\{s\}", r"(?P<s>encoder|decoder)"))


def _name(template: str, fields: Mapping[str, str]) -> str:
    out = template.replace("*", fields["i"]) if "i" in fields else template
    for key, value in fields.items():
        out = out.replace(f"{{{key}}}", value)
    if "k" in fields and fields["k"] in _TF:
        out = out.replace("{tf}", _TF[fields["k"]])
    return out


def _rule(g: LayerGraph, target: str, shape: ShapeT, alt: Alternative, fields: Mapping[str, str]) -> Rule:
    op, *templates = ("copy", alt) if isinstance(alt, str) else alt
    name, *args = op if isinstance(op, tuple) else (op,)
    src = [_name(t, fields) for t in templates]
    if name == "copy":
        return copy(src[0], shape)
    if name == "t":
        return transposed(src[0], shape)
    if name == "cat":
        return concat(src, shape, attention_sizes(g, target))
    if name == "stack":
        return stacked([src[0].replace("{e}", str(j)) for j in range(shape[0])], shape)
    if name == "half" and len(args) == 3 and args[2]:  # stored [.., in, out]: halve, then swap the last two axes
        axis, i, _ = args
        inner = (*shape[:-2], shape[-1], shape[-2])
        full = tuple(n * 2 if a == axis else n for a, n in enumerate(inner))
        start, stop = inner[axis] * i, inner[axis] * (i + 1)
        how = f"slice {start}:{stop} of axis {axis}, last two axes swapped"
        return Rule((src[0],), (full,), how, ("narrow_swap", axis, start, stop))
    if name == "half":
        axis, i = args[:2]
        full = tuple(n * 2 if a == axis else n for a, n in enumerate(shape))
        return part(src[0], shape, full, axis, shape[axis] * i)
    if name == "parts":  # part i of a tensor packed from parts of relative sizes along axis (in_proj: q | k v)
        axis, sizes, i = args
        unit = shape[axis] // sizes[i]
        full = tuple(unit * sum(sizes) if a == axis else n for a, n in enumerate(shape))
        return part(src[0], shape, full, axis, unit * sum(sizes[:i]))
    if name == "squeeze":
        return squeezed(src[0], shape)
    if name == "unsqueeze":  # stored without the leading unit axes (CLIP's class embedding [D])
        stored = tuple(shape[next((i for i, n in enumerate(shape) if n != 1), len(shape)) :])  # CLIP's logit_scale: []
        return Rule((src[0],), (stored,), "leading unit axes added", ("reshape", shape))
    if name == "rows":
        return rows_from(src[0], shape, args[0])
    if name == "regroup":
        return fused_rule(g, target, src[0], shape, args[0])
    if name == "swap":  # [.., in, out] stored: the last two axes exchanged
        return Rule((src[0],), ((*shape[:-2], shape[-1], shape[-2]),), "last two axes swapped", ("swap",))
    if name == "every":  # entries start, start + step, .. of an axis (interleaved halves), maybe then swapped
        axis, start, step, swapped = args
        inner = (*shape[:-2], shape[-1], shape[-2]) if swapped else shape
        full = tuple(n * step if a == axis else n for a, n in enumerate(inner))
        how = f"entries {start}::{step} of axis {axis}{', last two axes swapped' if swapped else ''}"
        return Rule((src[0],), (full,), how, ("every", axis, start, step, swapped))
    raise ValueError(f"unknown weight operation {name!r} in the {target} row")


def attention_sizes(g: LayerGraph, target: str) -> list[int]:
    """Output widths of the pieces of a packed projection: [q, k, v] for ``.qkv``, [k, v] for ``.kv``; of a
    bias on some pieces only (Whisper's, none on k), the biased pieces'."""
    op = target.rsplit(".", 1)[0]  # blocks.0.attn.qkv
    spans = g.op(op).attrs.bias_spans if target.endswith(".bias") else None
    if spans is not None:
        return [b - a for a, b in spans]
    core = g.op(op.rsplit(".", 1)[0] + ".core").attrs
    q, kv = core.heads * core.head_dim, core.kv_heads * core.head_dim
    return [q, kv, kv] if op.endswith(".qkv") else [kv, kv]


def tied_head(g: LayerGraph, op: str = "lm_head") -> bool:
    """Does the spec tie ``op`` (the LM head, or a decoder's embedding) to another parameter?"""
    return g.op(op).tied_to is not None
