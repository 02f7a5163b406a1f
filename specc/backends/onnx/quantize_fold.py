"""Constant [in, out] weights for the MatMuls to quantize (onnxruntime's quantizer reads only initializers).

specc's linears keep the PyTorch [out, in] layout behind a Transpose (``ops_dense.weight_t``), and the sparse
MoE form takes each expert's weight as ``Transpose(Gather(W[E, out, in], e))`` (``ops_moe``). Both are folded
here: the [in, out] array replaces the initializer under its IR name, or -- when the initializer has other
readers (a head tied to the embedding table; an expert's slice of the stacked weight) -- is added as
``<linear>.weight`` / ``<moe>.<param>.<e>``. The Transposes and Gathers left without readers go, and so do
the initializers they read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ...ir.graph import LayerGraph


@dataclass
class Folded:
    matmuls: list[str] = field(default_factory=list)  # MatMul nodes whose weight is now an [in, out] initializer
    tied: dict[str, str] = field(default_factory=dict)  # MatMul output → the table it reads (a tied head)
    experts: int = 0  # MatMuls of sparse-MoE experts among ``matmuls``


def all_nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                yield from all_nodes(sub)


def used_names(graph: onnx.GraphProto) -> set[str]:
    return {i for n in all_nodes(graph) for i in n.input}


def quantizable(g: LayerGraph, head: bool) -> tuple[dict[str, str], set[str]]:
    """(2-D weight name → linear op name, stacked [E, out, in] expert weight names) to quantize: every linear
    but routers (their top-k choice is discrete: a flipped expert changes the output wholesale) and, unless
    ``head``, the model's output heads."""
    routers = {op.inputs[1] for op in g.ops() if op.kind == "moe"}
    heads = set(g.outputs.values())
    linears = {
        op.attrs.tied_to or f"{op.name}.weight": op.name
        for op in g.ops()
        if op.kind == "linear" and op.name not in routers and (head or op.name not in heads)
    }
    experts = {full for op in g.ops() if op.kind == "moe" for local, full in op.param_names().items()
               if len(op.params[local].shape) == 3}  # fmt: skip
    return linears, experts


@dataclass(frozen=True)
class Site:
    """A MatMul whose weight is ``Transpose(source)`` (or ``Transpose(Gather(source, expert))``)."""

    matmul: onnx.NodeProto
    transposed: str  # the Transpose's output (several MatMuls may read one)
    source: str  # the initializer: [out, in], or the stacked [E, out, in] of an expert
    expert: int | None
    name: str  # the [in, out] weight's name
    shared: bool  # the source has other readers: the [in, out] weight is a new initializer
    tied: bool  # a head reading the embedding table


def find_sites(graph: onnx.GraphProto, linears: dict[str, str], experts: set[str]) -> list[Site]:
    """The MatMuls of ``linears`` (2-D weight name → linear op name) and of sparse-MoE ``experts`` whose weight
    can be folded to a constant [in, out] initializer, from the graph's structure alone (no tensor is read)."""
    inits = {t.name: t for t in graph.initializer}
    producers = {o: n for n in all_nodes(graph) for o in n.output}
    readers: dict[str, int] = {}
    for n in all_nodes(graph):
        for i in set(n.input):
            readers[i] = readers.get(i, 0) + 1
    names: dict[str, str] = {}  # Transpose output → [in, out] name
    taken = set(inits)
    sites = []
    for node in list(all_nodes(graph)):
        if node.op_type != "MatMul" or len(node.input) < 2 or (tr := producers.get(node.input[1])) is None:
            continue
        if tr.op_type != "Transpose" or _perm(tr) not in (None, [1, 0]):
            continue
        src = tr.input[0]
        if src in linears and src in inits:
            if len(inits[src].dims) != 2:
                continue
            shared = readers.get(src, 0) > 1
            name = f"{linears[src]}.weight" if shared else src
            if shared and (name in taken or name == src):
                name = f"{linears[src]}.weight_t"
            expert, tied = None, shared
        elif (ga := producers.get(src)) is not None and ga.op_type == "Gather" and ga.input[0] in experts:
            index = inits.get(ga.input[1])
            if ga.input[0] not in inits or index is None or numpy_helper.to_array(index).ndim != 0 or _axis(ga):
                continue
            if len(inits[ga.input[0]].dims) != 3:
                continue
            expert = int(numpy_helper.to_array(index))
            src, name, shared, tied = ga.input[0], f"{ga.input[0]}.{expert}", True, False
        else:
            continue
        name = names.setdefault(tr.output[0], name)
        taken.add(name)
        sites.append(Site(node, tr.output[0], src, expert, name, shared, tied))
    return sites


def fold_weights(model: onnx.ModelProto, linears: dict[str, str], experts: set[str]) -> Folded:
    """The sites' weights as constant [in, out] initializers in ``model`` (its weights in memory)."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    done = Folded()
    made: set[str] = set()
    for site in find_sites(graph, linears, experts):
        if site.name not in made:
            arr = numpy_helper.to_array(inits[site.source])
            arr = arr[site.expert] if site.expert is not None else arr
            t = numpy_helper.from_array(np.ascontiguousarray(arr.T), site.name)
            if site.shared:
                graph.initializer.append(t)
                inits[site.name] = graph.initializer[-1]
            else:
                inits[site.source].CopyFrom(t)
            made.add(site.name)
        site.matmul.input[1] = site.name
        if site.tied:
            done.tied[site.matmul.output[0]] = site.source
        done.experts += site.expert is not None
        done.matmuls.append(site.matmul.name)
    prune(graph)
    return done


def prune(graph: onnx.GraphProto) -> None:
    """Drop Transpose / Gather / Reshape nodes of the top-level graph whose outputs nobody reads, then the
    initializers nobody reads (repeated: a removed Transpose may leave its Gather unread)."""
    outputs = {o.name for o in graph.output} | {i.name for i in graph.input}
    while True:
        used = used_names(graph) | outputs
        dead = [n for n in graph.node if n.op_type in ("Transpose", "Gather", "Reshape") and not set(n.output) & used]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    used = used_names(graph) | outputs
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _perm(node: onnx.NodeProto) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _axis(node: onnx.NodeProto) -> int:
    return next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
