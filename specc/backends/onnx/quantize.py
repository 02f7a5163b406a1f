"""Weight-only quantization of an exported graph with onnxruntime's own quantizers.

What is quantized: the MatMul of every IR ``linear`` (lm_head too unless ``head=False``) and, for int4, the
token embedding's Gather (com.microsoft ``GatherBlockQuantized``; onnxruntime quantizes Gather at 4 bits only).
Everything else stays in the model dtype: norms, biases, positions, MoE experts (batched 3-D weights, which
onnxruntime's quantizer skips), attention.

Methods:
- ``nbits`` (int4 and int8): ``MatMulNBitsQuantizer`` → com.microsoft ``MatMulNBits`` (bits 4 or 8), blockwise
  symmetric along the input dimension (``block_size`` 16 | 32 | 64 | 128), ``accuracy_level`` 4 (the CPU
  kernel quantizes activations per block to int8 and runs an integer dot product, as onnxruntime-genai's CPU
  int4 models do).
- ``dynamic`` (int8 only): ``quantize_dynamic`` → per-channel int8 weights with activations quantized at run
  time (``DynamicQuantizeLinear`` + ``MatMulInteger``). Kept for the benchmark's comparison; the CLI uses nbits.

The quantizer reads MatMul weights as constant initializers; specc's linears keep the PyTorch [out, in] layout
behind a Transpose (``ops_dense.weight_t``), so the Transpose of each weight to be quantized is folded first:
the [in, out] array replaces the initializer under its IR name, or under ``lm_head.weight`` when the head is
tied to the embedding table (the table itself stays for the Gather).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import SpecError
from ...ir.graph import LayerGraph

BITS = {"int4": 4, "int8": 8}
BLOCK_SIZES = (16, 32, 64, 128)
METHODS = ("nbits", "dynamic")
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations per block on CPU (genai's CPU setting)
QUANT_DTYPES = ("fp32", "fp16")  # MatMulNBits has CPU kernels for float and float16, not bfloat16


@dataclass(frozen=True)
class Quantization:
    """``--quantize int8|int4 [--block-size N] [--quantize-head/--no-quantize-head]``."""

    scheme: str  # int4 | int8
    block_size: int = 32
    head: bool = True  # quantize lm_head (with a tied head, also the token embedding's Gather at int4)
    method: str = "nbits"  # nbits | dynamic (int8 only)

    @property
    def bits(self) -> int:
        return BITS[self.scheme]

    def validate(self, dtype: str) -> None:
        if self.scheme not in BITS:
            raise SpecError(f"unknown --quantize {self.scheme!r}", hint="int8 | int4")
        if self.block_size not in BLOCK_SIZES:
            raise SpecError(f"--block-size {self.block_size} is not supported", hint="16 | 32 | 64 | 128")
        if self.method not in METHODS:
            raise SpecError(f"unknown quantization method {self.method!r}", hint=" | ".join(METHODS))
        if self.method == "dynamic" and self.scheme != "int8":
            raise SpecError("dynamic quantization is int8 only", hint="use the nbits method for int4")
        if dtype not in QUANT_DTYPES:
            raise SpecError(
                f"--quantize {self.scheme} needs fp32 or fp16 activations; the export dtype is {dtype}",
                hint="onnxruntime's MatMulNBits has no bfloat16 CPU kernel: export with --dtype fp32 or fp16",
            )

    def metadata(self) -> dict[str, str]:
        if self.method == "dynamic":
            how = "quantize_dynamic: per-channel int8 weights, dynamic int8 activations (MatMulInteger)"
        else:
            how = f"MatMulNBits bits={self.bits} block_size={self.block_size} symmetric accuracy_level={ACCURACY_LEVEL}"
        return {
            "specc.quantize": self.scheme,
            "specc.quantize_method": how,
            "specc.quantize_block_size": str(self.block_size) if self.method == "nbits" else "",
            "specc.quantize_head": "1" if self.head else "0",
        }


def quantize_model(model: onnx.ModelProto, g: LayerGraph, q: Quantization) -> onnx.ModelProto:
    """``model`` (built from ``g``) with its linears' weights quantized; the graph I/O is unchanged."""
    linears = [op for op in g.ops() if op.kind == "linear" and (q.head or op.name not in g.outputs.values())]
    matmuls = _fold_weights(model, linears)
    gathers = _embedding_gathers(model, g, q) if q.bits == 4 and q.method == "nbits" else []
    chosen = set(matmuls) | set(gathers)
    if not chosen:
        return model
    if q.method == "dynamic":
        return _dynamic(model, matmuls)
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    types = ("MatMul", "Gather") if gathers else ("MatMul",)
    exclude = [n.name for n in _all_nodes(model.graph) if n.op_type in types and n.name not in chosen]
    config = DefaultWeightOnlyQuantConfig(
        block_size=q.block_size,
        is_symmetric=True,
        accuracy_level=ACCURACY_LEVEL,
        op_types_to_quantize=types,
        quant_axes=(("MatMul", 0), ("Gather", 1)),
        bits=q.bits,
    )
    with _quiet():
        quantizer = MatMulNBitsQuantizer(model, nodes_to_exclude=exclude, algo_config=config)
        quantizer.process()
    out = quantizer.model.model
    _check_quantized(out, chosen)
    return out


def _all_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                yield from _all_nodes(sub)


def _fold_weights(model: onnx.ModelProto, linears: list) -> list[str]:
    """Replace ``Transpose(W)`` → MatMul by an initializer Wᵀ for each linear; returns those MatMul nodes."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in _all_nodes(graph):
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    prefixes = {f"{op.name}/MatMul": op for op in linears}
    folded: dict[str, str] = {}  # Transpose output → initializer name
    chosen: list[str] = []
    for node in list(_all_nodes(graph)):
        op = prefixes.get(node.name.split("#", 1)[0])  # builder names nodes "<scope>/<op type>#node"
        if node.op_type != "MatMul" or op is None or len(node.input) < 2:
            continue
        t_out = node.input[1]
        tr = producers.get(t_out)
        if tr is None or tr.op_type != "Transpose" or tr.input[0] not in inits:
            continue
        if t_out not in folded:
            src = inits[tr.input[0]]
            arr = numpy_helper.to_array(src)
            if arr.ndim != 2:
                continue
            shared = any(c.name != tr.name for c in consumers.get(src.name, []))  # the builder names nodes uniquely
            name = src.name if not shared else f"{op.name}.weight"
            if shared and (name in inits or name == src.name):
                name = f"{op.name}.weight_t"
            t = numpy_helper.from_array(np.ascontiguousarray(arr.T), name)
            if shared:
                graph.initializer.append(t)
            else:
                src.CopyFrom(t)
            folded[t_out] = name
        node.input[1] = folded[t_out]
        chosen.append(node.name)
    used = {i for n in _all_nodes(graph) for i in n.input}
    keep = [
        n for n in graph.node if not (n.op_type == "Transpose" and n.output[0] in folded and n.output[0] not in used)
    ]
    del graph.node[:]
    graph.node.extend(keep)
    return chosen


def _embedding_gathers(model: onnx.ModelProto, g: LayerGraph, q: Quantization) -> list[str]:
    """Token-embedding Gathers to quantize at int4: not when their table also feeds an unquantized head."""
    tables = {op.attrs.get("tied_to") or f"{op.name}.weight": op.name for op in g.ops() if op.kind == "embedding"}
    still_fp = {i for n in _all_nodes(model.graph) if n.op_type == "Transpose" for i in n.input}
    return [
        n.name
        for n in _all_nodes(model.graph)
        if n.op_type == "Gather" and n.input[0] in tables and n.input[0] not in still_fp
    ]


def _dynamic(model: onnx.ModelProto, matmuls: list[str]) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp, _quiet():
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save_model(model, src)
        quantize_dynamic(src, dst, op_types_to_quantize=["MatMul"], nodes_to_quantize=matmuls, per_channel=True,
                         weight_type=QuantType.QInt8)  # fmt: skip
        return onnx.load_model(dst)


def _check_quantized(model: onnx.ModelProto, chosen: set[str]) -> None:
    """Every chosen node became a quantized one (the quantizer skips silently what it cannot handle)."""
    left = [n.name for n in _all_nodes(model.graph) if n.name in chosen]
    if left:
        raise SpecError(f"onnxruntime's quantizer left {len(left)} weight(s) unquantized, e.g. {left[0]}")


@contextlib.contextmanager
def _quiet():
    """onnxruntime's quantizers log every node at INFO (and advice at WARNING) through the root logger."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
            yield
    finally:
        logger.setLevel(level)
