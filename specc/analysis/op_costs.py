"""Evaluate the cost rules (``rules.RULES``) over a graph at concrete sizes: one ``OpCost`` per op, then totals."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import networkx as nx

from ..ir.graph import LayerGraph, Op, dims
from .costs import Ctx, Flop, Mem
from .rules import rules_for

# The graph input a generated token enters through, and the length symbol that grows, per task.
GENERATION = {"causal_lm": ("input_ids", "N"), "seq2seq": ("decoder_input_ids", "N_dec")}

# Display order of categories; unknown ones go last in first-seen order.
ORDER = [
    "embed", "pos", "norm", "qkv_proj", "qk", "softmax", "av", "out_proj",
    "cross_qkv_proj", "cross_qk", "cross_softmax", "cross_av", "cross_out_proj",
    "router", "mlp", "activation", "residual", "rnn", "rnn_attention", "head", "lm_head",
]  # fmt: skip
ATTENTION_PARTS = ("qk", "av", "softmax")


def category(op: Op, part: str | None) -> str:
    """The cost category of one part of an op: its own, or e.g. ``qk`` / ``cross_qk`` for attention."""
    if part is None:
        return op.category
    if op.category.startswith("cross_") and part in ATTENTION_PARTS:
        return f"cross_{part}"
    return part


@dataclass(frozen=True)
class OpCost:
    op: Op
    flops: tuple[Flop, ...]
    mem: Mem

    @property
    def matmul(self) -> int:
        return sum(f.matmul for f in self.flops)

    @property
    def total(self) -> int:
        return sum(f.matmul + f.other for f in self.flops)


# Kinds whose ``saved`` is their first input, whole: a later reader of a tensor one already keeps adds nothing.
# (Not RMSNorm: in half precision specc's composite keeps its own normalised tensor in that place.)
KEEP_THEIR_INPUT = ("linear", "layernorm")
# Activations whose backward reads their output: what they keep is the tensor the next op (the down projection)
# reads, and keeps, as its input.
KEEP_THEIR_OUTPUT = ("relu", "sigmoid", "tanh")


def kept_by_several_blocks(g: LayerGraph) -> set[str]:
    """Tensors that ops of more than one block keep as their input (the encoder output every decoder layer's
    cross-attention K/V reads): one storage, a checkpoint input of each of those blocks, kept once."""
    readers: dict[str, set[tuple[str | None, int]]] = {}
    for op in g.ops():
        if op.kind in KEEP_THEIR_INPUT and op.layer is not None:
            readers.setdefault(op.inputs[0], set()).add((op.stack, op.layer))
    return {t for t, blocks in readers.items() if len(blocks) > 1}


def evaluate(g: LayerGraph, env: dict[str, int], ctx: Ctx, only: set[str] | None = None) -> list[OpCost]:
    """Costs of every op (or of the ops named in ``only``) with symbols bound by ``env``."""
    out: list[OpCost] = []
    kept: set[str] = set()  # tensors an op already keeps for its backward (autograd keeps a storage once)
    for op in g.ops():
        keeps_input = op.kind in KEEP_THEIR_INPUT
        shared = keeps_input and op.inputs[0] in kept
        if keeps_input:
            kept.add(op.inputs[0])
        if op.kind == "activation" and op.attrs.fn in KEEP_THEIR_OUTPUT:
            kept.add(op.name)
        if only is not None and op.name not in only:
            continue
        flops, memory = rules_for(op.kind, op.name)
        ins = [dims(g.shape_of(i), env) for i in op.inputs]
        shape = dims(op.shape, env)
        mem = memory(op.attrs, ins, shape, ctx)
        if shared:  # a tensor several ops keep (gate and up, MLA's q_a and kv_a, parallel blocks' norms, the
            # encoder output of every cross-attention's K/V): once; a pipeline stage its own copy (profile.py)
            mem = replace(mem, saved=0, saved_fused=None)
        out.append(OpCost(op, tuple(flops(op.attrs, ins, shape, ctx)), mem))
    return out


def decode_ops(g: LayerGraph) -> set[str] | None:
    """Ops that run again for every generated token (``None`` when the model does not generate)."""
    gen = GENERATION.get(g.meta.get("task", ""))
    if gen is None or gen[0] not in g.inputs:
        return None
    return {n for n in nx.descendants(g.graph, gen[0]) if n not in g.inputs}


@dataclass
class Totals:
    """FLOPs by category, matmul and non-matmul apart; ``useful`` counts visible attention pairs only."""

    matmul: dict[str, int] = field(default_factory=dict)
    other: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, costs: Iterable[OpCost], useful: bool = False) -> Totals:
        t = cls()
        for c in costs:
            for f in c.flops:
                cat = category(c.op, f.part)
                t.matmul[cat] = t.matmul.get(cat, 0) + (f.useful_matmul if useful else f.matmul)
                t.other[cat] = t.other.get(cat, 0) + (f.useful_other if useful else f.other)
        return t

    def categories(self) -> list[str]:
        seen = list(self.matmul)
        return [c for c in ORDER if c in self.matmul] + [c for c in seen if c not in ORDER]

    def by_category(self) -> dict[str, int]:
        return {c: self.matmul[c] + self.other[c] for c in self.categories()}

    @property
    def total_matmul(self) -> int:
        return sum(self.matmul.values())

    @property
    def total_other(self) -> int:
        return sum(self.other.values())

    @property
    def total(self) -> int:
        return self.total_matmul + self.total_other

    def sum_of(self, cats: Iterable[str]) -> int:
        return sum(self.matmul.get(c, 0) + self.other.get(c, 0) for c in cats)
