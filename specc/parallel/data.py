"""Data parallelism in the training loop: each ``dp`` rank takes its rows of the global batch, and the loss is
normalised so that FSDP2's gradient mean over ``dp`` equals the single-process gradient of the global batch."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor


def dp_of(mesh: Any) -> tuple[int, int, Any]:
    """(rank, size, process group) of the data-parallel dimension."""
    dp = mesh["dp"]
    return dp.get_local_rank(), dp.size(), dp.get_group()


def shard_rows(mesh: Any, *tensors: Tensor) -> tuple[Tensor, ...]:
    """This rank's contiguous share of the batch rows (the batch divides by dp: checked at setup)."""
    r, n, _ = dp_of(mesh)
    b = tensors[0].shape[0] // n
    return tuple(t[r * b : (r + 1) * b] for t in tensors)


def cross_entropy(mesh: Any, logits: Tensor, labels: Tensor, ignore: int) -> tuple[Tensor, float, float]:
    """(loss to back-propagate, global mean loss, global teacher-forced accuracy) over every dp shard.

    Each rank's loss is its token sum over the *global* token count, times dp: FSDP2 averages gradients over
    dp, which turns that into the gradient of the global mean even when shards hold different token counts.
    """
    _, n, group = dp_of(mesh)
    flat, gold = logits.flatten(0, 1).float(), labels.flatten()
    total = F.cross_entropy(flat, gold, ignore_index=ignore, reduction="sum")
    real = gold != ignore
    right = ((flat.argmax(-1) == gold) & real).sum()
    stats = torch.stack([total.detach(), real.sum().to(total.dtype), right.to(total.dtype)])
    dist.all_reduce(stats, group=group)
    count = max(float(stats[1]), 1.0)
    return total / count * n, float(stats[0]) / count, float(stats[2]) / count
