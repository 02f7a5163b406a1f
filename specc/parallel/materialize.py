"""Models larger than one device: built on the meta device, split there, and only then made real.

``parallelize`` applies the tensor-parallel plan and FSDP2 to meta parameters (nothing is allocated), then
``materialize`` allocates each rank's shards alone (``to_empty``) and fills them parameter by parameter:

- with the single-process seeded init: every rank replays the model's one seeded CPU generator in parameter
  order (``Model.init_weights``), draws each parameter whole, keeps its own shard and drops the rest, so the
  peak is one full parameter, never the model, and the values equal ``build_torch(spec)``'s;
- or not at all, for a checkpoint to fill (``specc.parallel.sharded_checkpoint.load_into``, or ``load_full`` below).

Packed projections are held rank-major (``specc.parallel.tensor``): a drawn or loaded whole tensor is put in
that order before it is split, as ``apply_tensor_parallel`` does to a real model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..errors import SpecError


def is_meta(model: nn.Module) -> bool:
    return any(p.is_meta for p in model.parameters())


def mesh_device(mesh: Any) -> torch.device:
    """Where this rank's shards live: the mesh's device type (CUDA: the current GPU, set by the launcher)."""
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def _tp(model: nn.Module) -> int:
    names = tuple(model.mesh.mesh_dim_names or ())
    return model.mesh["tp"].size() if "tp" in names else 1


def copy_into_shard(param: torch.Tensor, values: torch.Tensor, order: torch.Tensor | None = None) -> None:
    """Copy the whole tensor ``values`` (single-process layout) into ``param``: its local shard if it is a
    DTensor, computed on this rank without communication."""
    if order is not None:
        values = values[order]
    values = values.to(param.dtype)
    if isinstance(param, DTensor):
        values = distribute_tensor(values, param.device_mesh, param.placements, src_data_rank=None).to_local()
        param = param.to_local()
    param.copy_(values)


def local_bytes(model: nn.Module) -> int:
    """Bytes of this rank's shards of the parameters (meta or real)."""
    return sum(t.numel() * t.element_size() for t in (_local(p) for p in model.parameters()))


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def check_fits(model: nn.Module, device: torch.device, init: bool = True) -> None:
    """This rank's shards, plus init's fp32 draw of the largest whole parameter (``init``), against the memory
    free on ``device``, before anything is allocated."""
    from ..backends.torch.memory import Need, gib, init_transient, shortfall

    extra = init_transient(model) if init else Need(0)
    need = Need(local_bytes(model), extra.transient, extra.transient_what)
    lim = shortfall(need, device)
    if lim is not None:
        raise SpecError(
            f"{model.graph.meta.get('name', 'the model')}: this rank's shards need {gib(need.kept)}"
            f"{need.extra(lim)}, but only {gib(lim.bytes)} of memory is available on {device} (limited by "
            f"{lim.source})",
            hint="nothing was allocated; split it further (a larger tp or dp), or size it with specc analyze --plan",
        )


def materialize(model: nn.Module, init: bool) -> None:
    """Allocate the shards of a parallelized meta model on its mesh's device, once they fit; ``init``: fill
    them with the spec's seeded init (else they hold garbage until a checkpoint is loaded)."""
    from .tensor import packed_params

    device = mesh_device(model.mesh)
    check_fits(model, device, init)
    model.to_empty(device=device)
    if init:
        packed = packed_params(model.graph, _tp(model))
        model.init_weights(lambda name, param, values: copy_into_shard(param, values, packed.get(name)))


def load_full(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """Fill a parallelized model from whole tensors by name (a single-process state dict), one at a time."""
    from .tensor import packed_params

    packed = packed_params(model.graph, _tp(model))
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(weights))
    if missing:
        raise SpecError(f"the weights lack {missing[:4]}")
    with torch.no_grad():
        for name, param in params.items():
            copy_into_shard(param, weights[name].to(mesh_device(model.mesh)), packed.get(name))
