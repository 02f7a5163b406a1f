"""Mixture of experts: top-A routing with softmax gates, experts as batched MatMuls over [E, out, in] weights.

Every expert runs on every token and the gates (zero outside each token's top-A) weight the sum: exact,
static-shaped and fast for the small token counts of inference, at E/A times the FLOPs of sparse dispatch.
Gates come from ``exp(logit - logsumexp)`` (over all experts, or over the top-A when renormalised, which
equals softmax → top-A → renormalise) so the graph has no Softmax node to confuse with attention.
"""

from __future__ import annotations

from ...ir.graph import Op
from .builder import GraphBuilder
from .emit import emits
from .ops_dense import activation, weight_t


def _experts_linear(b: GraphBuilder, op: Op, x: str, w: str, bias: str | None) -> str:
    """x [1|E, T, in] @ W[e]ᵀ (+ b[e]) → [E, T, out]."""
    y = b.op("MatMul", [x, weight_t(b, f"{op.name}.{w}", (0, 2, 1))], scope=op.name)
    if bias:
        y = b.op("Add", [y, b.op("Unsqueeze", [b.param(f"{op.name}.{bias}"), b.i64(1)], scope=op.name)])
    return y


@emits("moe")
def make_moe(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    a = op.attrs
    x, logits = xs
    e, d, k = a["experts"], a["dim"], a["active"]
    has_bias = bool(a.get("bias"))
    tokens = b.op("Reshape", [x, b.i64(1, -1, d)], scope=op.name)  # [1, T, D]
    if a["expert"] == "swiglu":
        gate = _experts_linear(b, op, tokens, "w_gate", "b_gate" if has_bias else None)
        up = _experts_linear(b, op, tokens, "w_up", "b_up" if has_bias else None)
        hidden = b.op("Mul", [activation(b, gate, a["activation"], op.name), up], scope=op.name)
        y = _experts_linear(b, op, hidden, "w_down", "b_down" if has_bias else None)
    else:
        hidden = activation(
            b, _experts_linear(b, op, tokens, "w_in", "b_in" if has_bias else None), a["activation"], op.name
        )
        y = _experts_linear(b, op, hidden, "w_out", "b_out" if has_bias else None)  # [E, T, D]

    scores = b.op("Reshape", [logits, b.i64(-1, e)], scope=op.name)  # [T, E]
    top, idx = b.op("TopK", [scores, b.i64(k)], scope=op.name, outputs=2, axis=-1, largest=1, sorted=1)
    norm = top if a.get("normalize", True) else scores
    lse = b.op("ReduceLogSumExp", [norm, b.i64(-1)], scope=op.name, keepdims=1)
    gates = b.op("Exp", [b.op("Sub", [top, lse], scope=op.name)], scope=op.name)  # [T, A]
    dense = b.op("ScatterElements", [b.op("Mul", [scores, b.const(0.0, "zero")]), idx, gates], scope=op.name, axis=1)
    dense = b.op("Unsqueeze", [b.op("Transpose", [dense], scope=op.name, perm=[1, 0]), b.i64(2)])  # [E, T, 1]
    mixed = b.op("ReduceSum", [b.op("Mul", [y, dense], scope=op.name), b.i64(0)], scope=op.name, keepdims=0)
    return b.op("Reshape", [mixed, b.op("Shape", [x], scope=op.name)], scope=op.name)
