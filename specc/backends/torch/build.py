"""build_torch: spec → layer graph → runtime ``Model``, refusing what will not fit and checking weights by name."""

from __future__ import annotations

import os
from typing import Any

import torch

from ...errors import SpecError
from ...ir.graph import LayerGraph
from ...ir.lower import lower
from . import runtime
from .memory import check_fits
from .weights import read_weights


def as_graph(spec: Any) -> LayerGraph:
    """A LayerGraph from a graph, a validated spec, a spec dict, or a path / preset name."""
    if isinstance(spec, LayerGraph):
        return spec
    if isinstance(spec, (str, os.PathLike, dict)):
        from ...spec.loader import load_spec

        spec = load_spec(spec)
    return lower(spec)


def graph_data(graph: LayerGraph) -> runtime.Graph:
    """The IR as the plain data the runtime (and a standalone model.py) executes."""
    ops = [
        runtime.Op(
            op.name,
            op.kind,
            tuple(op.inputs),
            dict(op.attrs),
            {local: (tuple(p.shape), p.init) for local, p in op.params.items()},
            op.stack,
        )
        for op in graph.ops()
    ]
    inputs = {name: (tuple(i.shape), i.dtype, i.optional) for name, i in graph.inputs.items()}
    return runtime.Graph(dict(graph.meta), inputs, dict(graph.outputs), ops)


def torch_dtype(dtype: str | torch.dtype | None, graph: LayerGraph) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype or graph.meta.get("dtype", "fp32")
    if name not in runtime.DTYPES:
        raise SpecError(f"unknown dtype {name!r}", hint=f"use one of {', '.join(runtime.DTYPES)}")
    return runtime.DTYPES[name]


def build_torch(
    spec: Any,
    weights: str | os.PathLike[str] | dict[str, torch.Tensor] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> runtime.Model:
    """``nn.Module`` for a spec (or LayerGraph); state_dict keys equal the IR parameter names.

    The model is built on the meta device first; its parameter bytes are compared with the memory available
    on ``device`` and a model that does not fit is refused with a SpecError before anything is allocated.
    ``weights``: a .safetensors path (specc names, or a ``specc compile --target torch`` checkpoint) or a dict
    of tensors; names pass through ``specc.interop.names.to_specc_names``. Without weights the parameters are
    initialised from the spec's seed. ``dtype`` defaults to the spec's; ``device`` to the CPU. Returned in eval
    mode.
    """
    graph = as_graph(spec)
    data = graph_data(graph)
    dt = torch_dtype(dtype, graph)
    dev = torch.device(device or "cpu")
    skeleton = runtime.create(data, device="meta", dtype=dt)
    _check_names(skeleton, graph)
    if dev.type == "meta":
        return skeleton
    check_fits(skeleton, dev, graph.meta.get("name", "model"))
    tensors = None
    if weights is not None:
        tensors = read_weights(weights, graph)
    return runtime.create(data, tensors=tensors, device=dev, dtype=dt)


def _check_names(model: torch.nn.Module, graph: LayerGraph) -> None:
    """The runtime must realise exactly the IR's parameters: anything else is a backend bug."""
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = {k: tuple(p.shape) for k, p in graph.params().items()}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))
        raise AssertionError(f"torch backend parameters differ from the IR: {diff[:8]}")
