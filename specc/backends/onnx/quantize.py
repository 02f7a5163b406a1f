"""Weight-only quantization of an exported graph with onnxruntime's own quantizers.

What is quantized:
- the MatMul of every IR ``linear`` (lm_head too unless ``head=False``; routers stay float: their top-k choice
  is discrete) and of every sparse-MoE expert (``Transpose(Gather(W[E, out, in], e))`` folded per expert;
  the dense form's batched [E, ...] MatMuls stay float: MatMulNBits takes one 2-D weight);
- the token embeddings (``embedding=True``, the default where the onnxruntime in use runs it): com.microsoft
  ``GatherBlockQuantized`` at the same bits and block size, a table tied to a quantized head stored once for
  both (quantize_embed.py).
Everything else stays in the model dtype: norms, biases, positions, attention.

Methods:
- ``nbits`` (int4 and int8): ``MatMulNBitsQuantizer`` → com.microsoft ``MatMulNBits`` (bits 4 or 8), blockwise
  symmetric along the input dimension (``block_size`` 16 | 32 | 64 | 128), ``accuracy_level`` 4 (the CPU
  kernel quantizes activations per block to int8 and runs an integer dot product, as onnxruntime-genai's CPU
  int4 models do).
- ``dynamic`` (int8 only): ``quantize_dynamic`` → per-channel int8 weights with activations quantized at run
  time (``DynamicQuantizeLinear`` + ``MatMulInteger``). Kept for the benchmark's comparison; the CLI uses nbits.
  Embeddings stay float with it.

The quantizer reads MatMul weights as constant initializers: quantize_fold.py folds specc's Transposes first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper

from ...errors import SpecError
from ...ir.graph import LayerGraph
from . import quantize_embed
from .quantize_fold import Folded, all_nodes, fold_weights, prune, quantizable

BITS = {"int4": 4, "int8": 8}
BLOCK_SIZES = (16, 32, 64, 128)
METHODS = ("nbits", "dynamic")
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations per block on CPU (genai's CPU setting)
QUANT_DTYPES = ("fp32", "fp16")  # MatMulNBits has CPU kernels for float and float16, not bfloat16


@dataclass(frozen=True)
class Quantization:
    """``--quantize int8|int4 [--block-size N] [--quantize-head/--no-quantize-head]
    [--quantize-embedding/--no-quantize-embedding]``."""

    scheme: str  # int4 | int8
    block_size: int = 32
    head: bool = True  # quantize lm_head
    method: str = "nbits"  # nbits | dynamic (int8 only)
    embedding: bool | None = None  # token embeddings by GatherBlockQuantized; None: where possible (resolve)

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

    def resolve(self, g: LayerGraph, dtype: str) -> Quantization:
        """Validated, with ``embedding`` decided: on unless something rules it out (an error when asked for)."""
        self.validate(dtype)
        why = self._embedding_blocker(g, dtype)
        if why and self.embedding:
            raise SpecError(f"--quantize-embedding: {why}", hint="leave the embedding float: --no-quantize-embedding")
        return dataclasses.replace(self, embedding=not why and self.embedding is not False)

    def _embedding_blocker(self, g: LayerGraph, dtype: str) -> str | None:
        tables = {
            op.attrs.get("tied_to") or f"{op.name}.weight": int(op.attrs["dim"])
            for op in g.ops()
            if op.kind == "embedding"
        }
        tied_heads = [op for op in g.ops() if op.kind == "linear" and op.attrs.get("tied_to") in tables]
        if not tables:
            return "the model has no token embedding"
        if self.method != "nbits":
            return "embeddings are quantized with the nbits method only (GatherBlockQuantized)"
        if tied_heads and not self.head:
            return (
                "the head is tied to the embedding table and --no-quantize-head keeps it float: the table "
                "would be stored twice"
            )
        if odd := sorted({d for d in tables.values() if d % self.block_size}):
            return f"the embedding width {odd[0]} is not a multiple of --block-size {self.block_size}"
        if not quantize_embed.supported(self.bits, dtype):
            import onnxruntime

            return (
                f"onnxruntime {onnxruntime.__version__} has no CPU GatherBlockQuantized for {self.bits}-bit "
                f"uint8 data with {dtype} output (4-bit needs onnxruntime 1.22, 8-bit 1.23)"
            )
        return None

    def metadata(self) -> dict[str, str]:
        if self.method == "dynamic":
            how = "quantize_dynamic: per-channel int8 weights, dynamic int8 activations (MatMulInteger)"
        else:
            how = f"MatMulNBits bits={self.bits} block_size={self.block_size} symmetric accuracy_level={ACCURACY_LEVEL}"
        embed = f"GatherBlockQuantized bits={self.bits} block_size={self.block_size}" if self.embedding else ""
        return {
            "specc.quantize": self.scheme,
            "specc.quantize_method": how,
            "specc.quantize_block_size": str(self.block_size) if self.method == "nbits" else "",
            "specc.quantize_head": "1" if self.head else "0",
            "specc.quantize_embedding": "1" if self.embedding else "0",
            "specc.quantize_embedding_method": embed,
        }


def quantize_model(model: onnx.ModelProto, g: LayerGraph, q: Quantization) -> onnx.ModelProto:
    """``model`` (built from ``g``) with its weights quantized (``q`` resolved); the graph I/O is unchanged."""
    linears, experts = quantizable(g, q.head)
    folded = fold_weights(model, linears, experts)
    tables = {op.attrs.get("tied_to") or f"{op.name}.weight" for op in g.ops() if op.kind == "embedding"}
    gathers = [n.name for n in model.graph.node if n.op_type == "Gather" and n.input[0] in tables]
    gathers = gathers if q.embedding else []
    if not folded.matmuls and not gathers:
        return model
    if q.method == "dynamic":
        return _dynamic(model, folded.matmuls)
    out = _nbits(model, q, folded.matmuls) if folded.matmuls else model
    if gathers:
        _quantize_gathers(out, q, folded, tables)
    _check_quantized(out, set(folded.matmuls) | set(gathers))
    return out


def _nbits(model: onnx.ModelProto, q: Quantization, matmuls: list[str]) -> onnx.ModelProto:
    """onnxruntime's MatMulNBitsQuantizer on the MatMul nodes named ``matmuls`` (and on those alone)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    chosen = set(matmuls)
    exclude = [n.name for n in all_nodes(model.graph) if n.op_type == "MatMul" and n.name not in chosen]
    config = DefaultWeightOnlyQuantConfig(
        block_size=q.block_size,
        is_symmetric=True,
        accuracy_level=ACCURACY_LEVEL,
        op_types_to_quantize=("MatMul",),
        quant_axes=(("MatMul", 0),),
        bits=q.bits,
    )
    with _quiet():
        quantizer = MatMulNBitsQuantizer(model, nodes_to_exclude=exclude, algo_config=config)
        quantizer.process()
    return quantizer.model.model


def _quantize_gathers(model: onnx.ModelProto, q: Quantization, folded: Folded, tables: set[str]) -> None:
    """Each token-table Gather → GatherBlockQuantized: on the tied head's MatMulNBits weight (one copy), or on
    the table quantized alone by the same quantizer; float tables left unread are dropped."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    heads = {
        folded.tied[n.output[0]]: n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] in folded.tied
    }
    for gather in [n for n in graph.node if n.op_type == "Gather" and n.input[0] in tables]:
        table = gather.input[0]
        v, k = (int(d) for d in inits[table].dims)
        if table in heads:
            b, scales = heads[table].input[1], heads[table].input[2]
        else:
            b, scales = f"{table}_Q{q.bits}", f"{table}_scales"
            if b not in inits:
                data, s = quantize_embed.quantize_table(
                    numpy_helper.to_array(inits[table]), lambda m: _nbits(m, q, ["table/MatMul"])
                )
                graph.initializer.extend([numpy_helper.from_array(data, b), numpy_helper.from_array(s, scales)])
                inits[b], inits[scales] = graph.initializer[-2], graph.initializer[-1]
        quantize_embed.replace_gather(graph, gather, b, scales, (v, k * q.bits // 8), q.bits, q.block_size)
    prune(graph)


def _dynamic(model: onnx.ModelProto, matmuls: list[str]) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp, _quiet():
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save_model(model, src)
        quantize_dynamic(
            src,
            dst,
            op_types_to_quantize=["MatMul"],
            nodes_to_quantize=matmuls,
            per_channel=True,
            weight_type=QuantType.QInt8,
        )
        return onnx.load_model(dst)


def _check_quantized(model: onnx.ModelProto, chosen: set[str]) -> None:
    """Every chosen node became a quantized one (the quantizer skips silently what it cannot handle)."""
    left = [n.name for n in all_nodes(model.graph) if n.name in chosen]
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
