"""Parallel styles beyond torch's Colwise/Rowwise: a head tied to a vocabulary-parallel embedding, and modules
that keep running on local tensors while their parameters are DTensors (norms, positions, routers, experts).

A module of the generated library reads its parameters as attributes (``self.weight``) and mixes them with
plain tensors it makes itself (positions, masks), which a DTensor refuses. ``LocalParams`` keeps the
parameters DTensors (for FSDP2, optimizers, clipping and checkpoints on the same mesh) and, for the length of
each call, shadows each one with its local shard in the instance ``__dict__`` (instance attributes win over
``nn.Module.__getattr__``); ``to_local`` keeps the autograd link, so gradients land on the DTensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ParallelStyle


def _owned(module: nn.Module, placements: dict[str, Placement]) -> list[tuple[nn.Module, str, str]]:
    """(holder, local name, name in ``placements``) of the module's own parameters and of those ``placements``
    names inside a child (``kv_b.weight``: a projection the module also reads outside the child's forward)."""
    nested = [name.rpartition(".") for name in placements if "." in name]
    return [(module, n, n) for n, _ in module.named_parameters(recurse=False)] + [
        (module.get_submodule(path), local, f"{path}.{local}") for path, _, local in nested
    ]


def _distribute(
    module: nn.Module, mesh: DeviceMesh, placements: dict[str, Placement], skip: tuple[str, ...] = ()
) -> None:
    for holder, local, name in _owned(module, placements):
        param = holder._parameters[local]
        if param is None or isinstance(param, DTensor) or name in skip:
            continue
        dist = distribute_tensor(param.data, mesh, [placements.get(name, Replicate())], src_data_rank=0)
        holder.register_parameter(local, nn.Parameter(dist, requires_grad=param.requires_grad))


class TiedWeight(ParallelStyle):
    """An ``nn.Linear`` head or an ``nn.Embedding`` whose weight IS another embedding's, split by vocabulary rows:
    a head's logits by vocabulary shard, an embedding's rows looked up where they live (the others masked and
    summed), gathered so every rank returns all of them. The weight is left to the owner's style
    (``Model.tie_weights`` makes it the owner's DTensor again once both are applied); a head's own bias is
    placed as ``bias``."""

    def __init__(self, bias: Placement, inputs: Placement | None = None):
        super().__init__()
        self.bias, self.inputs = bias, inputs or Replicate()  # inputs: how x arrives (Shard(1): by positions)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            lambda name, m, mesh: _distribute(m, mesh, {"bias": self.bias}, skip=("weight",)) if m is module else None,
            self._inputs,
            self._outputs,
        )

    def _inputs(self, module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
        x, *rest = inputs
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [self.inputs], run_check=False)
        return (x.redistribute(mesh, [Replicate()]), *rest)

    @staticmethod
    def _outputs(module: nn.Module, out: DTensor, mesh: DeviceMesh) -> torch.Tensor:
        return out.redistribute(mesh, [Replicate()]).to_local()


class LocalParams(ParallelStyle):
    """Parameters distributed by ``placements`` (default Replicate); the module's forward sees local shards.

    ``partial``: the module computes a partial sum of its output on each rank (its parameters are split by
    hidden units: a mixture of experts), so its tensor inputs are all-reduced in backward and its output in
    forward; an ``aux_loss`` it sets is the same on every rank, so its gradient is divided by the ranks that
    sum it. ``own``: the module sees only this rank's part of its input (a QK-norm over local heads), so the
    gradients of its whole parameters are summed over the ranks. ``summed``: positions of inputs that arrive
    whole on every rank while the module reads them for its own heads only (latent attention's KV latent), so
    their gradients are summed in backward.
    """

    def __init__(
        self,
        placements: dict[str, Placement] | None = None,
        partial: bool = False,
        own: bool = False,
        summed: tuple[int, ...] = (),
    ):
        super().__init__()
        self.placements, self.partial, self.own, self.summed = placements or {}, partial, own, summed

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(
            module,
            device_mesh,
            lambda name, m, mesh: _distribute(m, mesh, self.placements) if m is module else None,
            self._inputs,
            self._outputs,
        )

    def _inputs(self, module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
        for holder, local, _ in _owned(module, self.placements):
            param = holder._parameters[local]
            if isinstance(param, DTensor):
                grads = [Partial()] if self.own else None  # each rank's share of a whole parameter's gradient
                holder.__dict__[local] = param.to_local(grad_placements=grads)
        summed = range(len(inputs)) if self.partial else self.summed
        return tuple(
            _sum_grads(x, mesh) if i in summed and isinstance(x, torch.Tensor) else x for i, x in enumerate(inputs)
        )

    def _outputs(self, module: nn.Module, out: Any, mesh: DeviceMesh) -> Any:
        for holder, local, _ in _owned(module, self.placements):
            holder.__dict__.pop(local, None)
        if not self.partial:
            return out
        aux = getattr(module, "aux_loss", None)
        if isinstance(aux, torch.Tensor):
            share = aux / mesh.size()
            module.aux_loss = share + (aux - share).detach()
        return DTensor.from_local(out, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()]).to_local()


def _sum_grads(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """x unchanged; in backward, the gradients the ranks computed for it are summed."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


class ShardSequence(ParallelStyle):
    """The module's first input arrives whole on every rank and continues as this rank's sequence positions
    (dim 1); in backward the positions' gradients are gathered again."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def split(m: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
            x, *rest = inputs
            x = DTensor.from_local(x, device_mesh, [Replicate()], run_check=False)
            return (x.redistribute(device_mesh, [Shard(1)]).to_local(), *rest)

        module.register_forward_pre_hook(split)
        return module
