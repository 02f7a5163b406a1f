"""The four attention matmuls of one layer, written as the seed's table writes them (batch left out)."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import LayerGraph, Op, dims
from .op_costs import OpCost


@dataclass(frozen=True)
class MatmulShape:
    stack: str
    step: str
    symbolic: str
    numeric: str
    flops: int  # of one layer, batch included

    def to_dict(self) -> dict[str, object]:
        return {
            "stack": self.stack,
            "step": self.step,
            "symbolic": self.symbolic,
            "shape": self.numeric,
            "flops": self.flops,
        }


def _mm(a: list[object], b: list[object], c: list[object]) -> str:
    def t(x: list[object]) -> str:
        return "[" + ",".join(str(v) for v in x) + "]"

    return f"{t(a)}×{t(b)}→{t(c)}"


def _len_symbol(op: Op, index: int = 1) -> str:
    d = op.shape[index]
    return d if isinstance(d, str) and d.isidentifier() else "N"


def attention_shapes(g: LayerGraph, costs: list[OpCost], env: dict[str, int]) -> list[MatmulShape]:
    """Rows for the first attention layer of each stack (self and cross)."""
    by_name = {c.op.name: c for c in costs}
    rows: list[MatmulShape] = []
    seen: set[tuple[str | None, bool]] = set()
    for c in costs:
        op = c.op
        if op.kind != "attention" or (key := (op.stack, bool(op.attrs.cross))) in seen:
            continue
        seen.add(key)
        rows += _rows(g, op, by_name, env)
    return rows


def _projection(g: LayerGraph, value: str) -> Op:
    """The linear feeding an attention input, past the QK-norms applied to its output."""
    op = g.op(value)
    while op.kind == "slice_rmsnorm":
        op = g.op(op.inputs[0])
    return op


def _rows(g: LayerGraph, op: Op, by_name: dict[str, OpCost], env: dict[str, int]) -> list[MatmulShape]:
    a = op.attrs
    h, kv, hd = a.heads, a.kv_heads, a.head_dim
    cross = bool(a.cross)
    stack = op.stack or "blocks"
    proj = _projection(g, op.inputs[0])
    out = g.op(next(iter(g.graph.successors(op.name))))
    d = proj.attrs.in_features
    nq_sym = _len_symbol(op)
    nq = dims(op.shape, env)[1]
    core = by_name[op.name]
    qk = next(f.matmul for f in core.flops if f.part == "qk")
    av = next(f.matmul for f in core.flops if f.part == "av")
    label = "cross " if cross else ""
    rows: list[MatmulShape] = []

    def row(step: str, sym: tuple[list[object], ...], num: tuple[list[object], ...], flops: int) -> None:
        rows.append(MatmulShape(stack, step, _mm(*sym), _mm(*num), flops))

    if cross:
        kvp = _projection(g, op.inputs[1])
        nk_sym, nk = _len_symbol(kvp), dims(kvp.shape, env)[1]
        w = "2HD_H" if kv == h else "2H_kvD_H"
        q_sym = ([nq_sym, "D"], ["D", "HD_H"], [nq_sym, "HD_H"])
        row("cross Q projection", q_sym, ([nq, d], [d, h * hd], [nq, h * hd]), by_name[proj.name].matmul)
        kv_num = ([nk, d], [d, 2 * kv * hd], [nk, 2 * kv * hd])
        row("cross KV projection", ([nk_sym, "D"], ["D", w], [nk_sym, w]), kv_num, by_name[kvp.name].matmul)
    else:
        nk_sym, nk = nq_sym, nq
        w = "3HD_H" if kv == h else "(H+2H_kv)D_H"
        width = (h + 2 * kv) * hd
        qkv_num = ([nq, d], [d, width], [nq, width])
        row("QKV projection", ([nq_sym, "D"], ["D", w], [nq_sym, w]), qkv_num, by_name[proj.name].matmul)
    row(
        f"{label}QK similarity",
        (["H", nq_sym, "D_H"], ["H", "D_H", nk_sym], ["H", nq_sym, nk_sym]),
        ([h, nq, hd], [h, hd, nk], [h, nq, nk]),
        qk,
    )
    row(
        f"{label}V-weighting",
        (["H", nq_sym, nk_sym], ["H", nk_sym, "D_H"], ["H", nq_sym, "D_H"]),
        ([h, nq, nk], [h, nk, hd], [h, nq, hd]),
        av,
    )
    d_out = out.attrs.out_features
    row(
        f"{label}output projection",
        ([nq_sym, "HD_H"], ["HD_H", "D"], [nq_sym, "D"]),
        ([nq, h * hd], [h * hd, d_out], [nq, d_out]),
        by_name[out.name].matmul,
    )
    return rows
