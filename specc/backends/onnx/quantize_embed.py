"""Quantized token embeddings: com.microsoft ``GatherBlockQuantized`` over MatMulNBits' own weight layout.

``MatMulNBits`` stores a weight of N output and K input channels as uint8 ``B [N, K/block, block·bits/8]``
(symmetric: no zero points, so the implied zero point is 2^(bits-1)) with ``scales [N, K/block]``.
``GatherBlockQuantized`` on uint8 data (``gather_axis`` 0, ``quantize_axis`` the last, ``bits`` 4 or 8, the
same implied zero point when none is given) reads rows of ``[N, K·bits/8]`` with scales ``[N, K/block]``: the
same bytes, reshaped. So, as onnxruntime-genai's "shared embeddings" do:
- a table tied to a quantized head is stored once: the Gather becomes ``Reshape(B_head)`` → GatherBlockQuantized
  on the head's scales (onnxruntime folds the Reshape of a constant at session creation);
- any other table is quantized by onnxruntime's MatMulNBits kernel as the weight of ``table @ x`` (N =
  vocabulary, K = width; recipes.NBits, as the linears), and its B (reshaped) and scales feed the Gather.

onnxruntime versions (CPU kernel): uint8 data came with PR 24239 (4-bit, no zero points; spring 2025, so 1.22)
and the ``bits`` attribute with bits=8 with PR 25214 (CPU only at first; summer 2025, so 1.23) -- versions
inferred from the merge dates; ``supported`` runs one tiny model on the onnxruntime in use to know for sure.
K must be a multiple of the block size (MatMulNBits pads the last block, which the Gather would read as
extra columns).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OP = "GatherBlockQuantized"
DOMAIN = "com.microsoft"
_FLOAT = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}


@functools.cache
def supported(bits: int, dtype: str) -> bool:
    """Whether the onnxruntime in use runs GatherBlockQuantized on uint8 data at ``bits`` with ``dtype``
    output on CPU, and reads MatMulNBits' layout (two rows of a known 4- or 8-bit pattern)."""
    import onnxruntime as ort

    k, block, ftype = 32, 16, _FLOAT[dtype]
    levels = np.arange(k) % (2**bits)  # unsigned codes; symmetric zero point 2^(bits-1)
    packed = levels if bits == 8 else levels[0::2] | (levels[1::2] << 4)
    data = np.stack([packed, packed[::-1]]).astype(np.uint8)
    scales = np.full((2, k // block), 0.5, np.float32 if dtype == "fp32" else np.float16)
    node = gather_node("data", "ids", "scales", "y", bits, block, "probe")
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", ftype, None)],
        [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")],
    )
    model = helper.make_model(
        graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = sess.run(None, {"ids": np.array([0], np.int64)})[0]
    except Exception:  # any failure (unknown op, type or attribute): not supported
        return False
    return bool(np.array_equal(got.astype(np.float32), 0.5 * (levels - 2 ** (bits - 1))[None].astype(np.float32)))


def gather_node(data: str, ids: str, scales: str, out: str, bits: int, block: int, name: str) -> onnx.NodeProto:
    return helper.make_node(
        OP,
        [data, ids, scales],
        [out],
        name=name,
        domain=DOMAIN,
        bits=bits,
        block_size=block,
        gather_axis=0,
        quantize_axis=1,
    )


def replace_gather(
    graph: onnx.GraphProto, gather: onnx.NodeProto, b: str, scales: str, shape: tuple[int, int], bits: int, block: int
) -> None:
    """Swap ``gather`` (a Gather of a float table) for Reshape(``b``, ``shape``) → GatherBlockQuantized."""
    scope = gather.name.split("/", 1)[0]
    shape_name = f"{b}/rows"
    if shape_name not in {t.name for t in graph.initializer}:
        graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), shape_name))
    rows = f"{scope}/Reshape_{OP}"
    nodes = [
        helper.make_node("Reshape", [b, shape_name], [rows], name=f"{scope}/Reshape#{OP}"),
        gather_node(rows, gather.input[1], scales, gather.output[0], bits, block, f"{scope}/{OP}#node"),
    ]
    at = list(graph.node).index(gather)
    graph.node.remove(gather)
    for i, n in enumerate(nodes):
        graph.node.insert(at + i, n)
