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
from typing import Any

import onnx
from onnx import helper

from ...errors import SpecError
from ...ir.graph import LayerGraph
from . import quantize_embed
from .builder import NUMPY_TYPES, LazyModel, placeholder
from .quantize_fold import all_nodes, find_sites, fold_weights, prune, quantizable
from .recipes import Cast, NBits

BITS = {"int4": 4, "int8": 8}
BLOCK_SIZES = (16, 32, 64, 128)
METHODS = ("nbits", "dynamic")
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations per block on CPU (genai's CPU setting)
QUANT_DTYPES = ("fp32", "fp16")
CONTRIB_DOMAIN = "com.microsoft"  # MatMulNBits has CPU kernels for float and float16, not bfloat16


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
            op.attrs.tied_to or f"{op.name}.weight": int(op.attrs.dim) for op in g.ops() if op.kind == "embedding"
        }
        tied_heads = [op for op in g.ops() if op.kind == "linear" and op.attrs.tied_to in tables]
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


def quantize_model(lazy: LazyModel, g: LayerGraph, q: Quantization, dtype: str, source: Any = None) -> LazyModel:
    """``lazy`` (built from ``g``, export dtype ``dtype``) with its weights quantized (``q`` resolved); the graph
    I/O is unchanged.

    nbits: the graph is rewritten (MatMul → MatMulNBits, Gather → GatherBlockQuantized) and each quantized
    weight becomes a recipe run as the weights stream in (recipes.NBits: onnxruntime's kernel, per tensor).
    dynamic: onnxruntime's whole-model ``quantize_dynamic``, on the model with its weights from ``source``."""
    linears, experts = quantizable(g, q.head)
    if q.method == "dynamic":
        from .stream import materialize

        model = materialize(lazy, source)
        folded = fold_weights(model, linears, experts)
        return LazyModel(_dynamic(model, folded.matmuls) if folded.matmuls else model, {})
    graph = lazy.model.graph
    sites = find_sites(graph, linears, experts)
    tables = {op.attrs.tied_to or f"{op.name}.weight" for op in g.ops() if op.kind == "embedding"}
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0] in tables] if q.embedding else []
    if not sites and not gathers:
        return lazy
    if not any(o.domain == CONTRIB_DOMAIN for o in lazy.model.opset_import):
        lazy.model.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    dims = {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer}
    ftype = NUMPY_TYPES[dtype]
    made: dict[str, NBits] = {}
    heads: dict[str, onnx.NodeProto] = {}  # table → the MatMulNBits of the head tied to it
    for site in sites:
        if site.name not in made:
            shape = dims[site.source][1:] if site.expert is not None else dims[site.source]
            made[site.name] = _recipe(lazy, _param(lazy, site.source), site.expert, shape, q, ftype, site.name)
        recipe = made[site.name]
        n, k = shape_of(recipe)
        node = helper.make_node(
            "MatMulNBits", [site.matmul.input[0], recipe.b_name, recipe.scales_name], list(site.matmul.output),
            name=f"{site.matmul.name}_Q{q.bits}", domain=CONTRIB_DOMAIN, K=k, N=n, bits=q.bits,
            block_size=q.block_size, accuracy_level=ACCURACY_LEVEL,
        )  # fmt: skip
        _replace_node(graph, site.matmul, node)
        if site.tied:
            heads[site.source] = node
    for gather in gathers:
        table = gather.input[0]
        v, k = dims[table]
        if table in heads:
            b, scales = heads[table].input[1], heads[table].input[2]
        else:
            if f"{table}_Q{q.bits}" not in made:
                made[f"{table}_Q{q.bits}"] = _recipe(lazy, _param(lazy, table), None, (v, k), q, ftype, table)
            b, scales = made[f"{table}_Q{q.bits}"].b_name, made[f"{table}_Q{q.bits}"].scales_name
        quantize_embed.replace_gather(graph, gather, b, scales, (v, k * q.bits // 8), q.bits, q.block_size)
    prune(graph)
    present = {t.name for t in graph.initializer}
    lazy.recipes = {name: r for name, r in lazy.recipes.items() if name in present}
    _check_quantized(lazy.model, {s.matmul.name for s in sites} | {n.name for n in gathers})
    return lazy


def _param(lazy: LazyModel, name: str) -> str:
    """The parameter an initializer casts (quantized from the parameter itself, in the export dtype)."""
    recipe = lazy.recipes[name]
    assert isinstance(recipe, Cast), f"{name} is not a parameter"
    return recipe.param


def _recipe(lazy: LazyModel, param: str, expert: int | None, shape: tuple[int, ...], q: Quantization, ftype: Any,
            name: str) -> NBits:  # fmt: skip
    """MatMulNBitsQuantizer's naming: ``<weight>_Q<bits>`` and ``<weight>_scales``."""
    n, k = shape
    recipe = NBits(param, expert, n, k, q.bits, q.block_size, ftype, f"{name}_Q{q.bits}", f"{name}_scales")
    for out in recipe.outs:
        lazy.model.graph.initializer.append(placeholder(out))
        lazy.recipes[out.name] = recipe
    return recipe


def shape_of(recipe: NBits) -> tuple[int, int]:
    return recipe.n, recipe.k


def _replace_node(graph: onnx.GraphProto, old: onnx.NodeProto, new: onnx.NodeProto) -> bool:
    """``old`` swapped for ``new`` in place, in ``graph`` or the subgraph (If branch) that holds it."""
    for at, node in enumerate(graph.node):
        if node is old or node == old:
            del graph.node[at]
            graph.node.insert(at, new)
            return True
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                if _replace_node(sub, old, new):
                    return True
    return False


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
