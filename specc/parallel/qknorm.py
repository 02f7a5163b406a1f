"""``attention.qk_norm: full`` under tensor parallelism (OLMo-2's QK-norm over the whole q and k projections).

Each tp rank holds its heads' features of the projection and the matching slice of the norm weight (split
with the projection's rows). The mean square runs over every head: each rank sums the squares of its own
features and the sums are all-reduced over tp (a DTensor ``Partial`` → ``Replicate``), so a norm moves one
number per position instead of all-gathering q and k.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate

from ..backends.torch.layers import SliceRMSNorm
from ..backends.torch.layers.norms import rms


def _sum_over(x: Tensor, mesh: DeviceMesh) -> Tensor:
    """The sum of every rank's ``x``; in backward each rank's share of the gradient is summed as well (every
    rank's heads read the total)."""
    total = DTensor.from_local(x, mesh, [Partial()], run_check=False).redistribute(mesh, [Replicate()])
    return total.to_local(grad_placements=[Partial()])


class SplitQKNorm(SliceRMSNorm):
    """``SliceRMSNorm`` over a whole projection of which this rank holds ``width`` of ``full`` features."""

    full: int
    tp_mesh: DeviceMesh

    def forward(self, x: Tensor) -> Tensor:
        s, e = self.start, self.start + self.width
        mean_square = lambda h: _sum_over(h.pow(2).sum(-1, keepdim=True), self.tp_mesh) / self.full
        part = rms(x[..., s:e], self.weight, self.eps or 1e-6, self.unit_offset, mean_square)
        return torch.cat((x[..., :s], part, x[..., e:]), -1)


def split(module: SliceRMSNorm, mesh: DeviceMesh) -> None:
    """Make the whole-projection norm ``module`` (its start and width already local) a ``SplitQKNorm``."""
    module.__class__ = SplitQKNorm
    module.full, module.tp_mesh = module.width * mesh.size(), mesh
