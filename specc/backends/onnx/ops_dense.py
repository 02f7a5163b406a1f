"""Per-token ops: norms, linear, activations, GLU, residual add, dropout (identity), pooling."""

from __future__ import annotations

import numpy as np

from ...ir.graph import Op
from .builder import GraphBuilder
from .fuse import mark_residual, skip_norm
from .op_registry import emits


def weight_t(b: GraphBuilder, name: str, perm: tuple[int, ...] = (1, 0)) -> str:
    """``weightᵀ`` for MatMul. The initializer keeps the PyTorch [out, in] layout and its IR name; ORT folds
    this Transpose of a constant at session creation (and then pre-packs it), so it costs nothing per run."""
    key = ("T", name, perm)
    if key not in b.memo:
        b.memo[key] = b.op("Transpose", [b.param(name)], scope=name, perm=list(perm))
    return b.memo[key]


def activation(b: GraphBuilder, x: str, fn: str, scope: str) -> str:
    if fn == "relu":
        return b.op("Relu", [x], scope=scope)
    if fn == "gelu":
        return b.op("Gelu", [x], scope=scope)  # opset 20: exact erf form
    if fn == "gelu_tanh":
        return b.op("Gelu", [x], scope=scope, approximate="tanh")
    if fn == "silu":
        return b.op("Mul", [x, b.op("Sigmoid", [x], scope=scope)], scope=scope)
    if fn == "quick_gelu":  # x·σ(1.702x) (CLIP)
        k = b.op("Mul", [x, b.const(1.702, "quick_gelu")], scope=scope)
        return b.op("Mul", [x, b.op("Sigmoid", [k], scope=scope)], scope=scope)
    if fn == "tanh":
        return b.op("Tanh", [x], scope=scope)
    raise NotImplementedError(f"activation {fn}")


def linear_bias(b: GraphBuilder, op: Op) -> str:
    """The linear's bias over every output feature: its parameter, or (``bias_spans``) the parameter's pieces
    between zeros where a feature has none (ORT folds the constant Concat at session creation)."""
    a, name = op.attrs, f"{op.name}.bias"
    if a.bias_spans is None:
        return b.param(name)
    key = ("full_bias", name)
    if key not in b.memo:
        parts, at, used = [], 0, 0
        for lo, hi in a.bias_spans:
            if lo > at:
                parts.append(b.const(np.zeros(lo - at), f"{op.name}.no_bias"))
            parts.append(b.op("Slice", [b.param(name), b.i64(used), b.i64(used + hi - lo)], scope=op.name))
            at, used = hi, used + hi - lo
        if a.out_features > at:
            parts.append(b.const(np.zeros(a.out_features - at), f"{op.name}.no_bias"))
        b.memo[key] = b.op("Concat", parts, scope=op.name, axis=0)
    return b.memo[key]


@emits("linear")
def make_linear(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    w = op.attrs.tied_to or f"{op.name}.weight"
    y = b.op("MatMul", [xs[0], weight_t(b, w)], scope=op.name)
    if op.attrs.bias:
        y = b.op("Add", [y, linear_bias(b, op)], scope=op.name)
    return y


@emits("layernorm")
def make_layernorm(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    ins = [xs[0], b.param(f"{op.name}.weight")]
    if op.attrs.bias:
        ins.append(b.param(f"{op.name}.bias"))
    fused = skip_norm(b, op, xs[0], ins[1], ins[2] if len(ins) > 2 else None, float(op.attrs.eps), rms=False)
    return fused or b.op("LayerNormalization", ins, scope=op.name, axis=-1, epsilon=float(op.attrs.eps))


def _rms_weight(b: GraphBuilder, op: Op) -> str:
    """The norm's scale: its weight, or (1 + weight) for a unit-offset RMSNorm (ORT folds the constant add), or
    ones for a norm without a weight (RMSNormalization's scale is required)."""
    if not getattr(op.attrs, "affine", True):
        return b.const(np.ones(op.attrs.dim), f"ones{op.attrs.dim}")
    w = b.param(f"{op.name}.weight")
    return b.op("Add", [w, b.const(np.array(1.0), "one")], scope=op.name) if op.attrs.unit_offset else w


@emits("rmsnorm")
def make_rmsnorm(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    # RMSNormalization is an opset-23 op (stash_type 1: computed in fp32 for fp16/bf16 models).
    w = _rms_weight(b, op)
    fused = skip_norm(b, op, xs[0], w, None, float(op.attrs.eps), rms=True)
    return fused or b.op("RMSNormalization", [xs[0], w], scope=op.name, axis=-1, epsilon=float(op.attrs.eps))


@emits("slice_rmsnorm")
def make_slice_rmsnorm(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    """QK-norm on a packed [B, N, F] projection: split off the slice, normalise it in groups of ``dim``, rejoin."""
    a = op.attrs
    start, width, total = a.start, a.width, op.shape[-1]
    sizes = [n for n in (start, width, total - start - width) if n]
    parts = b.op("Split", [xs[0], b.i64(*sizes)], scope=op.name, outputs=len(sizes), axis=-1)
    parts = [parts] if isinstance(parts, str) else list(parts)
    i = 1 if start else 0
    grouped = b.op("Reshape", [parts[i], b.i64(0, 0, -1, a.dim)], scope=op.name)
    normed = b.op("RMSNormalization", [grouped, _rms_weight(b, op)], scope=op.name, axis=-1, epsilon=float(a.eps))
    parts[i] = b.op("Reshape", [normed, b.i64(0, 0, width)], scope=op.name)
    return parts[0] if len(parts) == 1 else b.op("Concat", parts, scope=op.name, axis=-1)


@emits("activation")
def make_activation(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return activation(b, xs[0], op.attrs.fn, op.name)


@emits("glu")
def make_glu(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return b.op("Mul", [activation(b, xs[0], op.attrs.fn, op.name), xs[1]], scope=op.name)


@emits("add")
def make_add(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    y = b.op("Add", xs[:2], scope=op.name)
    mark_residual(b, y)  # a norm reading it may fuse with it (fuse.skip_norm)
    return y


@emits("scale")
def make_scale(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return b.op("Mul", [xs[0], b.const(np.array(float(op.attrs.factor)), "factor")], scope=op.name)


@emits("softcap")
def make_softcap(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    cap = b.const(np.array(float(op.attrs.cap)), "cap")
    return b.op("Mul", [b.op("Tanh", [b.op("Div", [xs[0], cap], scope=op.name)], scope=op.name), cap], scope=op.name)


@emits("sigmoid_gate")
def make_sigmoid_gate(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return b.op("Mul", [b.op("Sigmoid", [xs[1]], scope=op.name), xs[0]], scope=op.name)


@emits("dropout")
def make_dropout(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return xs[0]  # inference graph


@emits("pool")
def make_pool(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    if op.attrs.mode == "mean":
        return b.op("ReduceMean", [xs[0], b.i64(1)], scope=op.name, keepdims=0)
    if op.attrs.mode == "eos":  # the first position of the EOS id (or of the largest id) per row
        ids = xs[1]
        if op.attrs.eos_token_id is not None:
            ids = b.op("Equal", [ids, b.const(np.array(op.attrs.eos_token_id, np.int64), "eos")], scope=op.name)
        ids = b.op("Cast", [ids], scope=op.name, to=6)  # int32: ArgMax has no int64/bool kernel
        at = b.op("ArgMax", [ids], scope=op.name, axis=1, keepdims=1, select_last_index=0)  # [B, 1]
        at = b.op("Unsqueeze", [at, b.i64(2)], scope=op.name)  # [B, 1, 1]
        shape = b.op("Shape", [xs[0]], scope=op.name)
        d = b.op("Slice", [shape, b.i64(2), b.i64(3)], scope=op.name)
        at = b.op("Expand", [at, b.op("Concat", [b.i64(1, 1), d], scope=op.name, axis=0)], scope=op.name)
        y = b.op("GatherElements", [xs[0], at], scope=op.name, axis=1)  # [B, 1, D]
        return b.op("Squeeze", [y, b.i64(1)], scope=op.name)
    last = op.attrs.mode == "last"  # SigLIP text: the last position, padded or not
    return b.op("Gather", [xs[0], b.scalar_i64(-1 if last else 0)], scope=op.name, axis=1)
