"""FSDP2 over the data-parallel mesh: ``fully_shard`` on every block of the layer graph, then on the root."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from ..ir.graph import LayerGraph


def block_scopes(graph: LayerGraph) -> list[str]:
    """Scope names of the blocks (``blocks.3``, ``encoder.blocks.0``), in graph order: the ops' common prefix
    up to their layer index."""
    out: list[str] = []
    for op in graph.ops():
        if op.layer is None:
            continue
        parts = op.name.split(".")
        if str(op.layer) not in parts:
            continue
        prefix = ".".join(parts[: parts.index(str(op.layer)) + 1])
        if prefix not in out:
            out.append(prefix)
    return out


def apply_fsdp(model: nn.Module, graph: LayerGraph, mesh: DeviceMesh) -> None:
    """Shard parameters, gradients and optimizer states over ``mesh`` (1-D), one unit per block."""
    for scope in block_scopes(graph):
        fully_shard(model.get_submodule(scope), mesh=mesh)
    fully_shard(model, mesh=mesh)
