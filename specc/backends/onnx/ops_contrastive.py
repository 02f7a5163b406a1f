"""A dual encoder's scoring: L2-normalised embeddings, the image-text logits and their transpose."""

from __future__ import annotations

from ...ir.graph import Op
from .builder import GraphBuilder
from .op_registry import emits


@emits("l2_normalize")
def make_l2_normalize(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    norm = b.op("ReduceL2", [xs[0], b.i64(-1)], scope=op.name, keepdims=1)
    return b.op("Div", [xs[0], norm], scope=op.name)


@emits("contrastive")
def make_contrastive(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    text, image = xs
    cos = b.op("MatMul", [text, b.op("Transpose", [image], scope=op.name, perm=[1, 0])], scope=op.name)
    scale = b.op("Exp", [b.param(f"{op.name}.logit_scale")], scope=op.name)
    y = b.op("Mul", [cos, scale], scope=op.name)
    if op.attrs.logit_bias is not None:
        y = b.op("Add", [y, b.param(f"{op.name}.logit_bias")], scope=op.name)
    return y


@emits("transpose")
def make_transpose(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return b.op("Transpose", [xs[0]], scope=op.name, perm=[1, 0])
