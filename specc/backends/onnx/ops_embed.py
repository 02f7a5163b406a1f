"""Embeddings and positions: token / type embeddings, learned and sinusoidal positions (1-D, 2-D), patches."""

from __future__ import annotations

import numpy as np

from ...ir.graph import Op
from .builder import GraphBuilder
from .op_registry import emits
from .positions import new_tokens_mask, position_ids
from .tables import sinusoid_2d, sinusoid_rows


@emits("embedding")
def make_embedding(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    table = b.param(op.attrs.tied_to or f"{op.name}.weight")
    y = b.op("Gather", [table, xs[0]], scope=op.name)
    scale = float(op.attrs.scale)
    if scale != 1.0:
        y = b.op("Mul", [y, b.const(np.array(scale), "scale")], scope=op.name)
    return y


@emits("type_embedding")
def make_type_embedding(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    x, types = xs
    return b.op("Add", [x, b.op("Gather", [b.param(f"{op.name}.weight"), types], scope=op.name)], scope=op.name)


@emits("learned_pos")
def make_learned_pos(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    # table rows at this call's position ids [B or 1, N] (past length + arange, or following attention_mask)
    ids = position_ids(b, xs[0], op.stack)
    offset = int(op.attrs.offset)
    if offset:  # rows before position 0; a padded slot reads row offset - 1 (HF: cumsum(mask) * mask - 1 + offset)
        ids = b.op("Add", [ids, b.scalar_i64(offset)], scope=op.name)
        real = new_tokens_mask(b, xs[0], op.stack)
        if real:
            ids = b.op("Where", [real, ids, b.scalar_i64(offset - 1)], scope=op.name)
    rows = b.op("Gather", [b.param(f"{op.name}.weight"), ids], scope=op.name, axis=0)
    return b.op("Add", [xs[0], rows], scope=op.name)


@emits("sinusoidal_pos")
def make_sinusoidal_pos(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    # computed in-graph for this call's position ids: no table, no length limit
    table = sinusoid_rows(b, position_ids(b, xs[0], op.stack), op.attrs.dim, op.name)
    return b.op("Add", [xs[0], table], scope=op.name)


@emits("sinusoidal_pos_2d")
def make_sinusoidal_pos_2d(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    table = sinusoid_2d(op.attrs.grid, op.attrs.dim, bool(op.attrs.cls))  # fixed grid: a constant
    return b.op("Add", [xs[0], b.const(table, f"{op.name}.table")], scope=op.name)


@emits("learned_pos_2d")
def make_learned_pos_2d(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    # row[i] + col[j] for patch (i, j), row-major like the patch order; computed in-graph from the named
    # initializers (ORT folds it to a constant at load).
    g, d = op.attrs.grid, op.attrs.dim
    row = b.op("Unsqueeze", [b.param(f"{op.name}.row"), b.i64(1)], scope=op.name)  # [g, 1, d]
    col = b.op("Unsqueeze", [b.param(f"{op.name}.col"), b.i64(0)], scope=op.name)  # [1, g, d]
    pos = b.op("Reshape", [b.op("Add", [row, col], scope=op.name), b.i64(g * g, d)], scope=op.name)
    if op.attrs.cls:
        pos = b.op("Concat", [b.param(f"{op.name}.cls"), pos], scope=op.name, axis=0)
    return b.op("Add", [xs[0], pos], scope=op.name)


@emits("patch_embed")
def make_patch_embed(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    p, d = op.attrs.patch, op.attrs.dim
    ins = [xs[0], b.param(f"{op.name}.weight")]
    if op.attrs.bias:
        ins.append(b.param(f"{op.name}.bias"))
    y = b.op("Conv", ins, scope=op.name, kernel_shape=[p, p], strides=[p, p])  # [B, d, g, g]
    y = b.op("Reshape", [y, b.i64(0, d, -1)], scope=op.name)
    return b.op("Transpose", [y], scope=op.name, perm=[0, 2, 1])


@emits("conv1d")
def make_conv1d(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    a = op.attrs
    ins = [xs[0], b.param(f"{op.name}.weight")] + ([b.param(f"{op.name}.bias")] if a.bias else [])
    y = b.op("Conv", ins, scope=op.name, kernel_shape=[a.kernel], strides=[a.stride], pads=[a.padding, a.padding])
    return b.op("Transpose", [y], scope=op.name, perm=[0, 2, 1]) if a.tokens_out else y  # [B, T, C]


@emits("sinusoid_table")
def make_sinusoid_table(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    # the table's first N rows (the encoder runs whole: no cached offset)
    rows = b.op("Slice", [b.param(f"{op.name}.weight"), b.i64(0), b.dim(xs[0], 1), b.i64(0)], scope=op.name)
    return b.op("Add", [xs[0], rows], scope=op.name)


@emits("probe")
def make_probe(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    shape = b.op("Concat", [b.dim(xs[0], 0), b.i64(1, op.attrs.dim)], scope=op.name, axis=0)
    return b.op("Expand", [b.param(f"{op.name}.token"), shape], scope=op.name)


@emits("cls_token")
def make_cls_token(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    x = xs[0]
    shape = b.op("Concat", [b.dim(x, 0), b.i64(1, op.attrs.dim)], scope=op.name, axis=0)
    token = b.op("Expand", [b.param(f"{op.name}.token"), shape], scope=op.name)
    return b.op("Concat", [token, x], scope=op.name, axis=1)
