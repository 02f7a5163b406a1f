"""Per-token ops: norms, linear, activations, GLU, residual add, dropout (identity), pooling."""

from __future__ import annotations

from ...ir.graph import Op
from .builder import GraphBuilder
from .emit import emits
from .fuse import mark_residual, skip_norm


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
    if fn == "tanh":
        return b.op("Tanh", [x], scope=scope)
    raise NotImplementedError(f"activation {fn}")


@emits("linear")
def make_linear(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    w = op.attrs.get("tied_to") or f"{op.name}.weight"
    y = b.op("MatMul", [xs[0], weight_t(b, w)], scope=op.name)
    if op.attrs.get("bias"):
        y = b.op("Add", [y, b.param(f"{op.name}.bias")], scope=op.name)
    return y


@emits("layernorm")
def make_layernorm(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    ins = [xs[0], b.param(f"{op.name}.weight")]
    if op.attrs.get("bias"):
        ins.append(b.param(f"{op.name}.bias"))
    fused = skip_norm(b, op, xs[0], ins[1], ins[2] if len(ins) > 2 else None, float(op.attrs["eps"]), rms=False)
    return fused or b.op("LayerNormalization", ins, scope=op.name, axis=-1, epsilon=float(op.attrs["eps"]))


@emits("rmsnorm")
def make_rmsnorm(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    # RMSNormalization is an opset-23 op (stash_type 1: computed in fp32 for fp16/bf16 models).
    fused = skip_norm(b, op, xs[0], b.param(f"{op.name}.weight"), None, float(op.attrs["eps"]), rms=True)
    if fused:
        return fused
    return b.op(
        "RMSNormalization",
        [xs[0], b.param(f"{op.name}.weight")],
        scope=op.name,
        axis=-1,
        epsilon=float(op.attrs["eps"]),
    )


@emits("activation")
def make_activation(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return activation(b, xs[0], op.attrs["fn"], op.name)


@emits("glu")
def make_glu(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return b.op("Mul", [activation(b, xs[0], op.attrs["fn"], op.name), xs[1]], scope=op.name)


@emits("add")
def make_add(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    y = b.op("Add", xs[:2], scope=op.name)
    mark_residual(b, y)  # a norm reading it may fuse with it (fuse.skip_norm)
    return y


@emits("dropout")
def make_dropout(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    return xs[0]  # inference graph


@emits("pool")
def make_pool(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    if op.attrs["mode"] == "mean":
        return b.op("ReduceMean", [xs[0], b.i64(1)], scope=op.name, keepdims=0)
    return b.op("Gather", [xs[0], b.scalar_i64(0)], scope=op.name, axis=1)
