"""Fusions onnxruntime does not apply to the emitted graph by itself, emitted directly as its contrib ops.

Only in the onnxruntime-specific graph (``--attention contrib``, which already uses com.microsoft ops); the
standard graph stays standard ops for every runtime.

``skip_norm``: a residual ``Add`` feeding a norm — and the bias ``Add`` of the linear that feeds the residual —
become one ``SkipLayerNormalization`` (LayerNorm) or ``SkipSimplifiedLayerNormalization`` (RMSNorm), whose
``input_skip_bias_sum`` output takes over the residual sum's tensor name, so later readers of the residual
stream need no rewiring. ORT's own SkipLayerNorm fusion needs static shapes and does not fire on a graph with
dynamic batch and sequence (checked with ``SessionOptions.optimized_model_filepath``): per pre-norm block it
leaves 2 residual Adds, 2 bias Adds and 2 norms, each a full pass over [B, N, D].

``bias_add`` also finds the qkv projection's bias, which MultiHeadAttention takes as its ``bias`` input
(ops_attention.py).
"""

from __future__ import annotations

from onnx import NodeProto, helper

from ...ir.graph import Op
from .builder import CONTRIB, GraphBuilder, symbolic

RESIDUALS = "fuse.residuals"  # memo key: tensors that are residual sums (make_add)


def mark_residual(b: GraphBuilder, tensor: str) -> None:
    b.memo.setdefault(RESIDUALS, set()).add(tensor)


def _producer(b: GraphBuilder, tensor: str) -> NodeProto | None:
    for node in reversed(b.nodes):
        if tensor in node.output:
            return node
    return None


def _readers(b: GraphBuilder, tensor: str) -> int:
    return sum(tensor in node.input for node in b.nodes)


def bias_add(b: GraphBuilder, tensor: str, readers: int = 0) -> tuple[NodeProto, str, str] | None:
    """``tensor = y + bias`` with bias a 1-D initializer and ``readers`` readers so far: (node, y, bias)."""
    node = _producer(b, tensor)
    if node is None or node.op_type != "Add" or node.domain or _readers(b, tensor) != readers:
        return None
    for y, bias in (node.input, node.input[::-1]):
        shape = b.init_shape(bias)
        if shape is not None and len(shape) == 1 and b.init_shape(y) is None:
            return node, y, bias
    return None


def skip_norm(b: GraphBuilder, op: Op, x: str, gamma: str, beta: str | None, eps: float, rms: bool) -> str | None:
    """The fused norm of ``x`` if ``x`` is a residual sum that nothing has read yet; else None."""
    if b.opts.attention != "contrib" or x not in b.memo.get(RESIDUALS, ()) or _readers(b, x):
        return None
    add = _producer(b, x)
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return None
    branch, skip = add.input[1], add.input[0]
    bias = ""
    for i, j in ((1, 0), (0, 1)):  # a linear's bias folds into the fused op (the branch is usually input 1)
        found = bias_add(b, add.input[i], readers=1)
        if found:
            node, branch, bias = found
            skip = add.input[j]
            b.nodes.remove(node)
            break
    b.nodes.remove(add)
    y = b.unique(f"{op.name}/Skip{'Simplified' if rms else ''}LayerNormalization")
    kind = "SkipSimplifiedLayerNormalization" if rms else "SkipLayerNormalization"
    ins = [branch, skip, gamma, bias] if rms else [branch, skip, gamma, beta or "", bias]
    while ins[-1] == "":  # omitted trailing optionals
        ins.pop()
    node = helper.make_node(kind, ins, [y, "", "", x], name=b.unique(f"{op.name}/{kind}#node"), domain=CONTRIB)
    node.attribute.append(helper.make_attribute("epsilon", float(eps)))
    b.nodes.append(node)
    b.uses_contrib = True
    for t in (y, x):  # onnx cannot infer contrib outputs
        b.declare(t, b.ftype, symbolic(op.shape))
    return y
