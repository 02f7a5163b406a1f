"""T5's relative position bias: the bucket of each distance k - q computed in-graph (no length limit), a Gather
from the [buckets, H] table, laid out [1, H, N_q, N_k] as the attention node's additive mask."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from ...ir.graph import Op
from .builder import GraphBuilder
from .masks import full_keep
from .op_registry import emits
from .positions import span


@emits("relative_bias")
def make_relative_bias(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    """As ``specc.backends.torch.layers.relative.relative_buckets`` (transformers' float32 arithmetic)."""
    a, s = op.attrs, op.name
    start, end = span(b, xs[0], op.stack)
    one, zero = b.scalar_i64(1), b.scalar_i64(0)
    qpos = b.op("Unsqueeze", [b.op("Range", [start, end, one], scope=s), b.i64(1)], scope=s)  # [Nq, 1]
    kpos = b.op("Unsqueeze", [b.op("Range", [zero, end, one], scope=s), b.i64(0)], scope=s)  # [1, Nk]
    dist = b.op("Sub", [kpos, qpos], scope=s)  # int64 k - q
    n = a.buckets
    if a.bidirectional:
        n //= 2
        base = b.op("Mul", [b.op("Cast", [b.op("Greater", [dist, zero], scope=s)], scope=s, to=7), b.scalar_i64(n)])
        dist = b.op("Abs", [dist], scope=s)
    else:
        base = ""
        dist = b.op("Neg", [b.op("Min", [dist, zero], scope=s)], scope=s)
    exact = n // 2
    f32 = np.float32
    ratio = b.op("Div", [b.op("Cast", [dist], scope=s, to=1), b.const(np.array(exact, f32), "rb_exact", f32)])
    log = b.op("Div", [b.op("Log", [ratio], scope=s), b.const(np.array(math.log(a.max_distance / exact), f32),
                                                              "rb_log", f32)], scope=s)  # fmt: skip
    steps = b.op("Cast", [b.op("Mul", [log, b.const(np.array(n - exact, f32), "rb_span", f32)], scope=s)], to=7)
    large = b.op("Min", [b.op("Add", [steps, b.scalar_i64(exact)], scope=s), b.scalar_i64(n - 1)], scope=s)
    small = b.op("Less", [dist, b.scalar_i64(exact)], scope=s)
    bucket = b.op("Where", [small, dist, large], scope=s)
    if base:
        bucket = b.op("Add", [bucket, base], scope=s)
    rows = b.op("Gather", [b.param(f"{s}.weight"), bucket], scope=s, axis=0)  # [Nq, Nk, H]
    return b.op("Unsqueeze", [b.op("Transpose", [rows], scope=s, perm=[2, 0, 1]), b.i64(0)], scope=s)


def biased_mask(b: GraphBuilder, op: Op, q: str, bias: str, pad: str) -> str:
    """The given bias [1, H, N_q, N_k] where the structural, causal and padding masks keep a key, the dtype's
    lowest value elsewhere: every mask in the node's one additive input (is_causal 0)."""
    key = ("relative", bias, op.attrs.mask, op.stack, pad)
    if key not in b.memo:
        out = bias  # the table's export dtype already
        keep = full_keep(b, op, q, pad)
        if keep is not None:
            low = b.const(np.array(ml_dtypes.finfo(b.np_ftype).min, dtype=b.np_ftype), "mask_min")
            out = b.op("Where", [keep, out, low], scope="relative")
        b.memo[key] = out
    return b.memo[key]
