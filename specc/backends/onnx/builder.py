"""A small graph builder over ``onnx.helper``: nodes, initializers, constants, graph I/O, unique names.

Why emit ONNX directly instead of ``torch.onnx.export(dynamo=True)``: the exporter maps SDPA to the fused
``Attention`` op only for 4-D inputs without dropout and never for a causal mask combined with a padding
mask (every decoder with ``attention_mask``), cannot produce the contrib ``MultiHeadAttention`` /
``GroupQueryAttention`` nodes, and traces one shape path per wrapper module (KV cache, RNN step graph,
padding variants). Emitting from the IR gives exactly one fused node per attention layer by construction,
names every initializer after its IR parameter, exports in a second instead of tracing, and keeps each op's
mapping in one small ``make_<op>`` function (as onnxruntime-genai's builder does).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from ...errors import SpecError
from ...ir.ops import Shape
from .recipes import Cast, Concat, Out, Recipe

FLOAT_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
NUMPY_TYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}
CONTRIB = "com.microsoft"

Dim = int | str | None
SYMBOLS = {"B": "batch", "N": "sequence", "N_dec": "decoder_sequence"}


def symbolic(shape: Shape, overrides: Mapping[int, str] | None = None) -> list[int | str]:
    """IR shape → ONNX dims: ints stay, ``B``/``N``/``N_dec`` become named dynamic axes."""
    out: list[int | str] = []
    for i, d in enumerate(shape):
        if overrides and i in overrides:
            out.append(overrides[i])
        elif isinstance(d, int):
            out.append(d)
        else:
            out.append("+".join("*".join(SYMBOLS.get(f, f) for f in p.split("*")) for p in d.split("+")))  # 2*N
    return out


@dataclass
class ExportOptions:
    dtype: str = "fp32"  # fp32 | fp16 | bf16: parameters, activations, float inputs/outputs and the KV cache
    opset: int = 23  # 23 | 24 (ORT 1.31 rejects opset 25's Attention window attributes)
    attention: str = "standard"  # standard: ai.onnx Attention; contrib: com.microsoft MHA / GQA
    kv_cache: bool = False
    padding_mask: bool = True  # False drops the attention_mask input (all keys valid): lets CUDA pick Flash
    moe: str = "sparse"  # sparse: experts run on their routed tokens only; dense: static shapes (ops_moe.py)

    def validate(self) -> None:
        if self.dtype not in FLOAT_TYPES:
            raise SpecError(f"unknown dtype {self.dtype!r}", hint="fp32 | fp16 | bf16")
        if self.opset not in (23, 24):
            raise SpecError(
                f"opset {self.opset} is not supported", hint="use 23 or 24 (onnxruntime 1.31 rejects opset 25)"
            )
        if self.attention not in ("standard", "contrib"):
            raise SpecError(f"unknown attention op {self.attention!r}", hint="standard | contrib")
        if self.moe not in ("sparse", "dense"):
            raise SpecError(f"unknown MoE form {self.moe!r}", hint="sparse | dense")


@dataclass
class LazyModel:
    """An exported graph whose weights are placeholders, and how each is made (written by stream.py)."""

    model: onnx.ModelProto
    recipes: dict[str, Recipe]  # initializer name → its recipe (a recipe with two outputs appears twice)


@dataclass
class GraphBuilder:
    """Accumulates one ONNX graph. ``values`` maps IR value names (op / input names) to ONNX tensor names.

    Weights never enter the graph: a parameter becomes a placeholder initializer (name, dtype, shape) and a
    recipe in ``deferred`` that ``stream.py`` runs when the export writes the file (recipes.py)."""

    name: str
    opts: ExportOptions
    params: Mapping[str, tuple[int, ...]]  # IR parameter name → shape
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: dict[str, np.ndarray] = field(default_factory=dict)  # constants, serialised by model()
    deferred: dict[str, Recipe] = field(default_factory=dict)  # weight initializer name → how it is made
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    value_info: list[onnx.ValueInfoProto] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    memo: dict[Any, Any] = field(default_factory=dict)  # shared subgraphs: masks, positions, transposed weights
    cache: Any = None  # kv_cache.KVCache when the graph takes past_key_values
    positions: Any = None  # positions.PositionPlan when a stack's positions follow its padding mask
    _names: set[str] = field(default_factory=set)
    _consts: dict[tuple[bytes, int, tuple[int, ...]], str] = field(default_factory=dict)
    uses_contrib: bool = False

    # -- dtypes ---------------------------------------------------------------------------------------

    @property
    def ftype(self) -> int:
        return FLOAT_TYPES[self.opts.dtype]

    @property
    def np_ftype(self) -> Any:
        return NUMPY_TYPES[self.opts.dtype]

    # -- names ----------------------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        """An unused name (not yet reserved: pass it as an explicit output of ``op``)."""
        name, k = base, 1
        while name in self._names:
            name = f"{base}_{k}"
            k += 1
        return name

    def unique(self, base: str) -> str:
        name = self.fresh(base)
        self._names.add(name)
        return name

    # -- nodes ----------------------------------------------------------------------------------------

    def op(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        scope: str = "",
        outputs: int | Sequence[str] = 1,
        domain: str = "",
        **attrs: Any,
    ) -> Any:
        """Add a node; returns its output name (one output) or list of names. Empty input = omitted optional."""
        stem = f"{scope}/{op_type}" if scope else op_type
        if isinstance(outputs, int):
            outs = [self.unique(stem if outputs == 1 else f"{stem}:{i}") for i in range(outputs)]
        else:
            outs = [o if o == "" else self._claim(o) for o in outputs]
        if domain == CONTRIB:
            self.uses_contrib = True
        node = helper.make_node(op_type, list(inputs), outs, name=self.unique(f"{stem}#node"), domain=domain)
        node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items() if v is not None)
        self.nodes.append(node)
        return outs[0] if len(outs) == 1 else outs

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"tensor name {name} used twice")
        self._names.add(name)
        return name

    # -- initializers ---------------------------------------------------------------------------------

    def param(self, full_name: str) -> str:
        """The IR parameter as an initializer of the same name, cast to the export dtype (a placeholder)."""
        if full_name not in self.deferred:
            if full_name not in self.params:
                raise SpecError(f"weights have no tensor {full_name}", hint="the weights do not match this spec")
            shape = tuple(int(d) for d in self.params[full_name])
            self.deferred[full_name] = Cast(full_name, Out(full_name, self.np_ftype, shape))
            self._names.add(full_name)
        return full_name

    def concat_params(self, names: Sequence[str], hint: str) -> str:
        """Parameters (1-D or stacked along axis 0) joined along axis 0 as one initializer."""
        recipes = [self.deferred[n] for n in names]
        assert all(isinstance(r, Cast) for r in recipes), "only parameters are concatenated"
        rows = sum(r.outs[0].shape[0] for r in recipes)
        shape = (rows, *recipes[0].outs[0].shape[1:])
        name = self.unique(f"const/{hint}")
        self.deferred[name] = Concat(tuple(r.params[0] for r in recipes), Out(name, self.np_ftype, shape))
        return name

    def init_shape(self, name: str) -> tuple[int, ...] | None:
        """The shape of an initializer (constant or weight placeholder); None for any other tensor."""
        if name in self.initializers:
            return tuple(self.initializers[name].shape)
        if name in self.deferred:
            return next(o.shape for o in self.deferred[name].outs if o.name == name)
        return None

    def const(self, value: Any, hint: str = "const", dtype: Any = None) -> str:
        """A constant initializer (deduplicated). Float constants take the export dtype unless told."""
        arr = np.asarray(value)
        if dtype is None:
            dtype = self.np_ftype if arr.dtype.kind == "f" else arr.dtype
        arr = arr.astype(dtype)
        key = (arr.tobytes(), str(arr.dtype), arr.shape)
        if key not in self._consts:
            name = self.unique(f"const/{hint}")
            self.initializers[name] = arr
            self._consts[key] = name
        return self._consts[key]

    def i64(self, *values: int, hint: str = "i64") -> str:
        return self.const(np.array(values, np.int64), hint)

    def scalar_i64(self, value: int) -> str:
        return self.const(np.array(value, np.int64), f"i{value}")

    # -- shapes ---------------------------------------------------------------------------------------

    def dim(self, x: str, axis: int) -> str:
        """``x.shape[axis]`` as an int64 [1] tensor (memoised)."""
        key = ("dim", x, axis)
        if key not in self.memo:
            self.memo[key] = self.op("Shape", [x], scope=x, start=axis, end=axis + 1)
        return self.memo[key]

    def scalar_dim(self, x: str, axis: int) -> str:
        key = ("sdim", x, axis)
        if key not in self.memo:
            self.memo[key] = self.op("Squeeze", [self.dim(x, axis), self.i64(0)], scope=x)
        return self.memo[key]

    # -- graph I/O ------------------------------------------------------------------------------------

    def add_input(self, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        self._claim(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def add_output(self, name: str, tensor: str, elem_type: int, shape: Sequence[Dim]) -> None:
        if tensor != name:  # graph outputs carry the ecosystem's names; rename with an Identity
            self.op("Identity", [tensor], outputs=[name], scope=name)
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def declare(self, tensor: str, elem_type: int, shape: Sequence[Dim]) -> None:
        """Shape of a tensor onnx cannot infer (contrib op outputs)."""
        self.value_info.append(helper.make_tensor_value_info(tensor, elem_type, list(shape)))

    # -- result ---------------------------------------------------------------------------------------

    def lazy(self, doc: str = "") -> LazyModel:
        """The graph and the recipes of its weight placeholders."""
        return LazyModel(self.model(doc), dict(self.deferred))

    def model(self, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, value_info=self.value_info, doc_string=doc
        )
        opsets = [helper.make_opsetid("", self.opts.opset)]
        if self.uses_contrib:
            opsets.append(helper.make_opsetid(CONTRIB, 1))
        m = helper.make_model(graph, opset_imports=opsets, producer_name="specc")
        m.ir_version = helper.find_min_ir_version_for(opsets[:1])  # 11 for opset 23, 12 for 24: the oldest that works
        # Tensors are written straight into the model: make_graph / make_model would copy every byte twice.
        for name, arr in self.initializers.items():
            t = m.graph.initializer.add()
            t.name = name
            t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
            t.dims.extend(arr.shape)
            t.raw_data = np.ascontiguousarray(arr if sys.byteorder == "little" else arr.byteswap()).tobytes()
        for name, recipe in self.deferred.items():
            m.graph.initializer.append(placeholder(next(o for o in recipe.outs if o.name == name)))
        return m


PENDING = "specc:pending"  # the location of a weight not yet written (stream.py replaces it)


def placeholder(out: Out) -> onnx.TensorProto:
    """An initializer that names its dtype and shape and holds no data: the weight comes when the file is written."""
    t = onnx.TensorProto()
    t.name = out.name
    t.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(out.dtype))
    t.dims.extend(out.shape)
    t.data_location = onnx.TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", PENDING
    return t
