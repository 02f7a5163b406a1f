"""The few tensor operations weight mapping needs, for torch tensors and numpy arrays alike."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def transpose(x: Any) -> Any:
    return x.t().contiguous() if _is_torch(x) else np.ascontiguousarray(x.T)


def cat(xs: list[Any], axis: int) -> Any:
    if _is_torch(xs[0]):
        import torch

        return torch.cat(xs, dim=axis)
    return np.concatenate(xs, axis=axis)


def stack(xs: list[Any]) -> Any:
    if _is_torch(xs[0]):
        import torch

        return torch.stack(xs, dim=0)
    return np.stack(xs, axis=0)


def reshape(x: Any, new_shape: tuple[int, ...]) -> Any:
    return x.reshape(new_shape)


def narrow(x: Any, axis: int, start: int, stop: int) -> Any:
    index = [slice(None)] * len(x.shape)
    index[axis] = slice(start, stop)
    out = x[tuple(index)]
    return out.contiguous() if _is_torch(out) else out


def take(x: Any, axis: int, index: list[int]) -> Any:
    """Reorder ``x`` along ``axis``: ``out[..., i, ...] = x[..., index[i], ...]``."""
    if _is_torch(x):
        import torch

        return x.index_select(axis, torch.tensor(index, device=x.device)).contiguous()
    return np.take(x, index, axis=axis)


def interleave(x: Any, axis: int) -> Any:
    """Reorder ``axis`` (even length d) from halves [a_0..a_{d/2-1} | b_0..] to pairs [a_0, b_0, a_1, b_1, ...]:
    out index j ← in index j // 2 + (j % 2) · d/2."""
    return take(x, axis, interleave_order(x.shape[axis]))


def interleave_order(d: int) -> list[int]:
    """The index ``interleave`` takes: out j ← in j // 2 + (j % 2) · d/2."""
    return [j // 2 + (j % 2) * (d // 2) for j in range(d)]


def regroup(x: Any, groups: int, sizes: tuple[int, ...]) -> Any:
    """Rows of ``x`` stored group by group, each group ``sizes[0]`` blocks of part 0, then ``sizes[1]`` of part 1,
    ...: ``[g0: p0 × sizes[0], p1 × sizes[1], ..., g1: ...]``, reordered part by part ``[p0 of every group | p1 of
    every group | ...]``, groups kept in order (GPT-NeoX's per-head and Falcon's per-group q/k/v)."""
    rest = tuple(x.shape[1:])
    blocks = x.reshape(groups, sum(sizes), -1, *rest)  # [group, block, row in block, ...]
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return cat([blocks[:, a:b].reshape(-1, *rest) for a, b in pairwise(starts)], 0)


def equal(a: Any, b: Any) -> bool:
    if _is_torch(a) and _is_torch(b):
        import torch

        return a.shape == b.shape and bool(torch.equal(a, b))
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))
