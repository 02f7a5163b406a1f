"""The layer-graph IR: a networkx DiGraph of ops, each with a stable scope name, symbolic shapes and params.

Node names are scope names (``blocks.3.attn.qkv``); a parameter's full name is ``<scope>.<local>``
(``blocks.3.attn.qkv.weight``), which is also its PyTorch state_dict key and ONNX initializer name. Values
flow along edges: an op's ``inputs`` are the names of the ops (or graph inputs) it reads, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from .attrs import OpAttrs
from .ops import CATALOGUE, Dim, EmbeddingAttrs, LinearAttrs, ParamSpec, Shape


@dataclass(frozen=True)
class GraphInput:
    name: str
    shape: Shape
    dtype: str  # "int64" | "float32"
    optional: bool = False


@dataclass
class Op:
    name: str
    kind: str
    inputs: tuple[str, ...]
    attrs: OpAttrs  # an instance of the kind's class in the catalogue (CATALOGUE[kind].attrs)
    shape: Shape  # output shape
    params: dict[str, ParamSpec]  # local name → spec; full name is f"{name}.{local}"
    category: str  # cost category (qkv_proj, qk, mlp, ...), see analysis
    layer: int | None = None  # block index within its stack
    stack: str | None = None  # "encoder" | "decoder" | None

    @property
    def tied_to(self) -> str | None:
        """The parameter this op uses as its weight (``embed.weight``) when tied; None for every other op."""
        return self.attrs.tied_to if isinstance(self.attrs, LinearAttrs | EmbeddingAttrs) else None

    def param_names(self) -> dict[str, str]:
        return {local: f"{self.name}.{local}" for local in self.params}


@dataclass
class LayerGraph:
    """One model as ops in topological (insertion) order plus graph inputs/outputs and model-wide facts."""

    meta: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, GraphInput] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)  # output name → op name
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    _ops: dict[str, Op] = field(default_factory=dict)

    # -- building -------------------------------------------------------------------------------------

    def add_input(self, name: str, shape: Shape, dtype: str, optional: bool = False) -> str:
        self.inputs[name] = GraphInput(name, tuple(shape), dtype, optional)
        self.graph.add_node(name, kind="input")
        return name

    def add(
        self,
        kind: str,
        name: str,
        inputs: list[str] | tuple[str, ...],
        category: str,
        layer: int | None = None,
        stack: str | None = None,
        **attrs: Any,
    ) -> str:
        if name in self.graph:
            raise ValueError(f"duplicate scope name {name}")
        opdef = CATALOGUE[kind]
        typed = opdef.attrs.build(name, attrs)  # OpAttrsError naming the op and field: a lowering bug
        in_shapes = [self.shape_of(i) for i in inputs]
        op = Op(
            name=name,
            kind=kind,
            inputs=tuple(inputs),
            attrs=typed,
            shape=tuple(opdef.shape(typed, in_shapes)),
            params=opdef.params(typed, in_shapes) if opdef.params else {},
            category=category,
            layer=layer,
            stack=stack,
        )
        self._ops[name] = op
        self.graph.add_node(name, kind=kind, op=op)
        for i in inputs:
            self.graph.add_edge(i, name)
        return name

    def set_output(self, name: str, op_name: str) -> None:
        self.outputs[name] = op_name

    # -- reading --------------------------------------------------------------------------------------

    def shape_of(self, value: str) -> Shape:
        if value in self.inputs:
            return self.inputs[value].shape
        return self._ops[value].shape

    def op(self, name: str) -> Op:
        return self._ops[name]

    def ops(self) -> Iterator[Op]:
        """Ops in topological order (the order lowering added them)."""
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    def params(self) -> dict[str, ParamSpec]:
        return {f"{op.name}.{k}": p for op in self.ops() for k, p in op.params.items()}

    def num_params(self) -> int:
        total = 0
        for p in self.params().values():
            n = 1
            for d in p.shape:
                n *= d
            total += n
        return total

    def layers(self, stack: str | None = None) -> list[int]:
        return sorted({op.layer for op in self.ops() if op.layer is not None and op.stack == stack})

    def to_dict(self) -> dict[str, Any]:
        return {
            "meta": self.meta,
            "inputs": [
                {"name": i.name, "shape": list(i.shape), "dtype": i.dtype, "optional": i.optional}
                for i in self.inputs.values()
            ],
            "outputs": dict(self.outputs),
            "ops": [
                {
                    "name": op.name,
                    "kind": op.kind,
                    "category": op.category,
                    "inputs": list(op.inputs),
                    "shape": list(op.shape),
                    "attrs": op.attrs.to_dict(),
                    "params": {k: list(p.shape) for k, p in op.params.items()},
                    **({"layer": op.layer} if op.layer is not None else {}),
                    **({"stack": op.stack} if op.stack else {}),
                }
                for op in self.ops()
            ],
        }


def dims(shape: Shape, env: dict[str, int]) -> tuple[int, ...]:
    """Evaluate a symbolic shape: ``("B", "N", 768)`` with ``{"B": 1, "N": 512}``."""
    return tuple(eval_dim(d, env) for d in shape)


def eval_dim(d: Dim, env: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    if "+" in d:
        a, b = d.split("+", 1)
        return eval_dim(a, env) + eval_dim(b, env)
    if "*" in d:  # "2*N": Whisper's input frames, twice the encoder's sequence
        a, b = d.split("*", 1)
        return eval_dim(a, env) * eval_dim(b, env)
    if d.isdigit():
        return int(d)
    return env[d]
