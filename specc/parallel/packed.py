"""State dicts of packed projections in the single-process layout, whatever the parallel layout.

Under tensor parallelism a packed projection (``attn.qkv`` = ``[q heads | k heads | v heads]``) is held
rank-major (``specc.parallel.tensor``): rank r's rows are its q, k and v heads, a plain ``Shard(0)`` of the
permuted tensor, so every forward is one local matmul with no exchange. No DTensor placement expresses those
rows as a split of the unpermuted tensor when q and k/v have different head counts (GQA), so the parameter
itself stays permuted, and its module's state-dict hooks do the exchange instead, once per state dict:

- ``state_dict()`` (and so ``get_model_state_dict``, DCP saves) gives the ``[q | k | v]`` tensor, split by
  rows (``Shard(0)`` on every mesh dimension): ``.full_tensor()`` is the single-process tensor;
- ``load_state_dict()`` (``set_model_state_dict``, DCP loads) takes it in that layout, as a DTensor of any
  placement or a whole tensor, and puts it rank-major into the parameter.

Each packed parameter is gathered whole once per call (one tensor at a time), so ``state_dict()`` of a
tensor-parallel model is a collective: every rank of the mesh calls it. Gradients and optimizer moments stay
rank-major (``specc.parallel.sharded_checkpoint`` writes and reads those in the single-process layout).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard, distribute_tensor


def canonical_state(module: nn.Module, orders: dict[str, torch.Tensor]) -> None:
    """Hook ``module``'s state dict so its parameters named in ``orders`` (local name → rank-major row order,
    new = old[order]) read and load in the single-process layout."""
    inverse = {name: torch.argsort(order) for name, order in orders.items()}

    def save(mod: nn.Module, state: dict[str, Any], prefix: str, local_metadata: Any) -> None:
        for name, rows in inverse.items():
            key = prefix + name
            if key in state and isinstance(state[key], DTensor):
                state[key] = _reordered(state[key], rows)

    def load(mod: nn.Module, state: dict[str, Any], prefix: str, *args: Any) -> None:
        for name, rows in orders.items():
            key, param = prefix + name, getattr(mod, name)
            if key in state and torch.is_tensor(state[key]) and isinstance(param, DTensor):
                value = state[key]
                whole = value.full_tensor() if isinstance(value, DTensor) else value
                whole = whole.detach().to(param.to_local().device)[rows.to(whole.device)]
                state[key] = distribute_tensor(whole, param.device_mesh, param.placements, src_data_rank=None)

    module.register_state_dict_post_hook(save)
    module.register_load_state_dict_pre_hook(load)


@torch.no_grad()
def _reordered(value: DTensor, rows: torch.Tensor) -> DTensor:
    """``value``'s rows put in the order ``rows``, split by rows over its mesh again (each rank keeps its part
    of the gathered tensor, which is freed before the next one is gathered)."""
    whole = value.full_tensor()[rows.to(value.device)]
    mesh = value.device_mesh
    split = distribute_tensor(whole, mesh, [Shard(0)] * mesh.ndim, src_data_rank=None)
    local = split.to_local().clone()  # not a view of the whole tensor
    return DTensor.from_local(local, mesh, split.placements, run_check=False, shape=split.shape, stride=split.stride())
