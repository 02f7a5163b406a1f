"""Mixture of experts: softmax → top-A routing (renormalised or not), experts over [E, out, in] weights.

Two forms, chosen by ``ExportOptions.moe``:
- ``sparse`` (default): each expert runs only on the tokens routed to it. Per expert, ``NonZero`` picks the
  (token, slot) assignments that chose it and ``Gather`` their rows; the expert's outputs are concatenated,
  put back in (token, slot) order by one ``ScatterND``, weighted by the gates and summed over the slots.
  Shapes stay dynamic (any B, N, and decode steps where most experts get no token: they run on 0 rows).
  FLOPs: A/E of the dense form's expert FLOPs.
- ``dense``: every expert runs on every token and gates that are zero outside each token's top-A weight the
  sum. Static shapes and no data-dependent ops (``NonZero``), for runtimes and compilers that need them, at
  E/A times the expert FLOPs.

DeepSeek routing (sigmoid scores, the selection-only ``score_bias``, group-limited top-k, ``routed_scale``) has
its own ``_route_deepseek``; GPT-OSS's clamped SwiGLU is ``_glu``. Gates come from ``exp(logit - logsumexp)``
(over all experts, or over the top-A when renormalised, which equals softmax → top-A → renormalise), computed in
fp32 as the torch layer does, so the graph has no Softmax node to confuse with attention. Per-expert weights are
``Gather``s of the [E, out, in] initializers (which keep their IR names); onnxruntime folds them into constants at
session creation and pre-packs them for MatMul.
"""

from __future__ import annotations

from onnx import TensorProto

from ...ir.graph import Op
from .builder import GraphBuilder
from .op_registry import emits
from .ops_dense import activation, weight_t

MOE_FORMS = ("sparse", "dense")


def _route(b: GraphBuilder, op: Op, logits: str) -> tuple[str, str]:
    """Router logits → (gates [T, A] in the export dtype, expert indices [T, A] int64)."""
    a = op.attrs
    scores = b.op("Reshape", [logits, b.i64(-1, a.experts)], scope=op.name)  # [T, E]
    if b.ftype != TensorProto.FLOAT:
        scores = b.op("Cast", [scores], scope=op.name, to=TensorProto.FLOAT)  # torch routes in fp32
    if a.score != "softmax" or a.score_bias or a.groups > 1:
        gates, idx = _route_deepseek(b, op, scores)
        if b.ftype != TensorProto.FLOAT:
            gates = b.op("Cast", [gates], scope=op.name, to=b.ftype)
        return gates, idx
    top, idx = b.op("TopK", [scores, b.i64(a.active)], scope=op.name, outputs=2, axis=-1, largest=1, sorted=1)
    norm = top if a.normalize else scores
    lse = b.op("ReduceLogSumExp", [norm, b.i64(-1)], scope=op.name, keepdims=1)
    gates = b.op("Exp", [b.op("Sub", [top, lse], scope=op.name)], scope=op.name)
    if b.ftype != TensorProto.FLOAT:
        gates = b.op("Cast", [gates], scope=op.name, to=b.ftype)
    return gates, idx


def _route_deepseek(b: GraphBuilder, op: Op, logits: str) -> tuple[str, str]:
    """DeepSeek routing on fp32 logits [T, E]: scores (softmax as exp(x - logsumexp), or sigmoid), experts chosen
    from scores + score_bias within the top_groups best groups, gates = the chosen unbiased scores
    (renormalised + 1e-20 when asked) × routed_scale."""
    a, f32 = op.attrs, TensorProto.FLOAT
    if a.score == "softmax":
        lse = b.op("ReduceLogSumExp", [logits, b.i64(-1)], scope=op.name, keepdims=1)
        scores = b.op("Exp", [b.op("Sub", [logits, lse], scope=op.name)], scope=op.name)
    else:
        scores = b.op("Sigmoid", [logits], scope=op.name)
    choice = scores
    if a.score_bias:
        bias = b.param(f"{op.name}.score_bias")
        if b.ftype != f32:
            bias = b.op("Cast", [bias], scope=op.name, to=f32)
        choice = b.op("Add", [scores, bias], scope=op.name)
    if a.groups > 1:
        per = a.experts // a.groups
        grouped = b.op("Reshape", [choice, b.i64(-1, a.groups, per)], scope=op.name)  # [T, G, E/G]
        if a.group_score == "max":
            best = b.op("ReduceMax", [grouped, b.i64(-1)], scope=op.name, keepdims=0)
        else:
            two = b.op("TopK", [grouped, b.i64(2)], scope=op.name, outputs=2, axis=-1, largest=1, sorted=1)[0]
            best = b.op("ReduceSum", [two, b.i64(-1)], scope=op.name, keepdims=0)  # [T, G]
        top = b.op("TopK", [best, b.i64(a.top_groups)], scope=op.name, outputs=2, axis=-1, largest=1, sorted=1)[1]
        zeros = b.op("Mul", [best, b.const(0.0, "zero", dtype="float32")], scope=op.name)
        one = b.const(1.0, "one", dtype="float32")
        ones = b.op("Expand", [one, b.op("Shape", [top], scope=op.name)], scope=op.name)
        keep = b.op("ScatterElements", [zeros, top, ones], scope=op.name, axis=1)  # [T, G]: 1 for kept groups
        keep = b.op("Unsqueeze", [keep, b.i64(-1)], scope=op.name)
        keep = b.op("Expand", [keep, b.op("Shape", [grouped], scope=op.name)], scope=op.name)
        keep = b.op("Cast", [b.op("Reshape", [keep, b.i64(-1, a.experts)], scope=op.name)], scope=op.name, to=9)
        choice = b.op("Where", [keep, choice, b.const(float("-inf"), "ninf", dtype="float32")], scope=op.name)
    idx = b.op("TopK", [choice, b.i64(a.active)], scope=op.name, outputs=2, axis=-1, largest=1, sorted=1)[1]
    gates = b.op("GatherElements", [scores, idx], scope=op.name, axis=1)
    if a.normalize:
        total = b.op("ReduceSum", [gates, b.i64(-1)], scope=op.name, keepdims=1)
        total = b.op("Add", [total, b.const(1e-20, "tiny", dtype="float32")], scope=op.name)
        gates = b.op("Div", [gates, total], scope=op.name)
    if a.routed_scale != 1.0:
        gates = b.op("Mul", [gates, b.const(a.routed_scale, "routed_scale", dtype="float32")], scope=op.name)
    return gates, idx


def _expert_param(b: GraphBuilder, op: Op, name: str, e: int, transpose: bool) -> str:
    """Expert ``e``'s slice of an [E, ...] parameter (a weight transposed to [in, out] for MatMul)."""
    key = ("moe", op.name, name, e)
    if key not in b.memo:
        full = f"{op.name}.{name}"
        w = b.op("Gather", [b.param(full), b.scalar_i64(e)], scope=f"{full}.{e}", axis=0)
        b.memo[key] = b.op("Transpose", [w], scope=f"{full}.{e}", perm=[1, 0]) if transpose else w
    return b.memo[key]


def _linear_e(b: GraphBuilder, op: Op, x: str, e: int, w: str, bias: str) -> str:
    y = b.op("MatMul", [x, _expert_param(b, op, w, e, transpose=True)], scope=f"{op.name}.{e}")
    if op.attrs.bias:
        y = b.op("Add", [y, _expert_param(b, op, bias, e, transpose=False)], scope=f"{op.name}.{e}")
    return y


def _glu(b: GraphBuilder, op: Op, gate: str, up: str, scope: str) -> str:
    """fn(gate) · up, or GPT-OSS's clamped form (up + 1) · gate · σ(α · gate), gate ≤ limit, |up| ≤ limit."""
    a = op.attrs
    if a.clamp_limit is None:
        return b.op("Mul", [activation(b, gate, a.activation, scope), up], scope=scope)
    hi, lo = b.const(float(a.clamp_limit), "clamp_limit"), b.const(-float(a.clamp_limit), "clamp_low")
    gate = b.op("Min", [gate, hi], scope=scope)
    up = b.op("Clip", [up, lo, hi], scope=scope)
    alpha = b.const(float(a.clamp_alpha), "clamp_alpha")
    glu = b.op("Mul", [gate, b.op("Sigmoid", [b.op("Mul", [gate, alpha], scope=scope)], scope=scope)], scope=scope)
    return b.op("Mul", [b.op("Add", [up, b.const(1.0, "one")], scope=scope), glu], scope=scope)


def _expert(b: GraphBuilder, op: Op, x: str, e: int) -> str:
    """Expert ``e`` on rows x [n, D] → [n, D]."""
    fn, scope = op.attrs.activation, f"{op.name}.{e}"
    if op.attrs.expert == "swiglu":
        gate, up = _linear_e(b, op, x, e, "w_gate", "b_gate"), _linear_e(b, op, x, e, "w_up", "b_up")
        return _linear_e(b, op, _glu(b, op, gate, up, scope), e, "w_down", "b_down")
    hidden = activation(b, _linear_e(b, op, x, e, "w_in", "b_in"), fn, scope)
    return _linear_e(b, op, hidden, e, "w_out", "b_out")


def _sparse(b: GraphBuilder, op: Op, tokens: str, gates: str, idx: str) -> str:
    """Σ_slots gate · expert(token) (Llama 4: expert(gate · token)), each expert on its routed rows only → [T, D]."""
    k, d = op.attrs.active, op.attrs.dim
    flat = b.op("Reshape", [idx, b.i64(-1)], scope=op.name)  # [T·A]: assignment t·A + slot → expert
    flat_gates = b.op("Reshape", [gates, b.i64(-1)], scope=op.name)
    outs, slots = [], []
    for e in range(op.attrs.experts):
        scope = f"{op.name}.{e}"
        chose = b.op("Equal", [flat, b.const(e, f"e{e}", dtype="int64")], scope=scope)
        where = b.op("Reshape", [b.op("NonZero", [chose], scope=scope), b.i64(-1)], scope=scope)
        rows = where if k == 1 else b.op("Div", [where, b.const(k, f"k{k}", dtype="int64")], scope=scope)
        x = b.op("Gather", [tokens, rows], scope=scope, axis=0)
        if op.attrs.weigh_input:
            gate = b.op("Unsqueeze", [b.op("Gather", [flat_gates, where], scope=scope, axis=0), b.i64(-1)], scope=scope)
            x = b.op("Mul", [x, gate], scope=scope)
        outs.append(_expert(b, op, x, e))
        slots.append(where)
    routed = b.op("Concat", outs, scope=op.name, axis=0)  # [T·A, D], grouped by expert
    where = b.op("Unsqueeze", [b.op("Concat", slots, scope=op.name, axis=0), b.i64(-1)], scope=op.name)
    blank = b.op("Expand", [b.const(0.0, "zero"), b.op("Shape", [routed], scope=op.name)], scope=op.name)
    ordered = b.op("ScatterND", [blank, where, routed], scope=op.name)  # back to (token, slot) order
    per_slot = b.op("Reshape", [ordered, b.i64(-1, k, d)], scope=op.name)  # [T, A, D]
    if op.attrs.weigh_input:
        return b.op("ReduceSum", [per_slot, b.i64(1)], scope=op.name, keepdims=0)
    weighted = b.op("Mul", [per_slot, b.op("Unsqueeze", [gates, b.i64(-1)], scope=op.name)], scope=op.name)
    return b.op("ReduceSum", [weighted, b.i64(1)], scope=op.name, keepdims=0)


def _experts_linear(b: GraphBuilder, op: Op, x: str, w: str, bias: str) -> str:
    """Dense form: x [1|E, T, in] @ W[e]ᵀ (+ b[e]) → [E, T, out]."""
    y = b.op("MatMul", [x, weight_t(b, f"{op.name}.{w}", (0, 2, 1))], scope=op.name)
    if op.attrs.bias:
        y = b.op("Add", [y, b.op("Unsqueeze", [b.param(f"{op.name}.{bias}"), b.i64(1)], scope=op.name)])
    return y


def _dense(b: GraphBuilder, op: Op, tokens: str, gates: str, idx: str) -> str:
    """Every expert on every token, gates zero outside the top-A → [T, D]; Llama 4's gates scale the experts'
    inputs, and a mask of the chosen experts keeps the others (whose bias would still add) out."""
    a = op.attrs
    x = b.op("Unsqueeze", [tokens, b.i64(0)], scope=op.name)  # [1, T, D]
    shape = b.op("Concat", [b.dim(idx, 0), b.i64(a.experts)], scope=op.name, axis=0)
    blank = b.op("Expand", [b.const(0.0, "zero"), shape], scope=op.name)  # [T, E] zeros

    def per_expert(values: str) -> str:  # [T, A] → [E, T, 1], zero outside the top-A
        dense = b.op("ScatterElements", [blank, idx, values], scope=op.name, axis=1)
        return b.op("Unsqueeze", [b.op("Transpose", [dense], scope=op.name, perm=[1, 0]), b.i64(2)])

    if a.weigh_input:
        x = b.op("Mul", [x, per_expert(gates)], scope=op.name)  # [E, T, D]
    if a.expert == "swiglu":
        gate, up = _experts_linear(b, op, x, "w_gate", "b_gate"), _experts_linear(b, op, x, "w_up", "b_up")
        y = _experts_linear(b, op, _glu(b, op, gate, up, op.name), "w_down", "b_down")
    else:
        hidden = activation(b, _experts_linear(b, op, x, "w_in", "b_in"), a.activation, op.name)
        y = _experts_linear(b, op, hidden, "w_out", "b_out")  # [E, T, D]
    if a.weigh_input:
        ones = b.op("Expand", [b.const(1.0, "one"), b.op("Shape", [gates], scope=op.name)], scope=op.name)
        dense = per_expert(ones)
    else:
        dense = per_expert(gates)
    return b.op("ReduceSum", [b.op("Mul", [y, dense], scope=op.name), b.i64(0)], scope=op.name, keepdims=0)


@emits("moe")
def make_moe(b: GraphBuilder, op: Op, xs: list[str]) -> str:
    x, logits = xs
    tokens = b.op("Reshape", [x, b.i64(-1, op.attrs.dim)], scope=op.name)  # [T, D]
    gates, idx = _route(b, op, logits)
    mixed = (_dense if b.opts.moe == "dense" else _sparse)(b, op, tokens, gates, idx)
    return b.op("Reshape", [mixed, b.op("Shape", [x], scope=op.name)], scope=op.name)
