"""FSDP2 over the data-parallel mesh: ``fully_shard`` on every block of the layer graph, then on the root."""

from __future__ import annotations

from typing import Any

import torch
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


def apply_fsdp(model: nn.Module, graph: LayerGraph, mesh: DeviceMesh, ignored: set[nn.Parameter] | None = None) -> None:
    """Shard parameters, gradients and optimizer states over ``mesh`` (1-D), one unit per block; ``ignored``:
    parameters already split over ``mesh`` another way (experts, ``specc.parallel.expert_parallel``)."""
    for scope in block_scopes(graph):
        fully_shard(model.get_submodule(scope), mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    _reshard_after_no_grad(model)


def _reshard_after_no_grad(model: nn.Module) -> None:
    """FSDP2 keeps the root's parameters unsharded after its forward, for the backward; after a forward
    without gradients (evaluation, generation) no backward comes, and until the next one the model's
    registered parameters are the unsharded tensors: an optimizer made then, or a state dict taken then, would
    hold them instead of the sharded parameters. So the root is resharded after such a forward (the next one
    gathers the embedding and head again, as every block does)."""

    def after(module: nn.Module, args: Any, out: Any) -> None:
        if not torch.is_grad_enabled():
            module.reshard()

    model.register_forward_hook(after)
