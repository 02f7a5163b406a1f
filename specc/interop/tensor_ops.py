"""The few tensor operations weight mapping needs, for torch tensors and numpy arrays alike, and the engine
that runs a weight rule's operation (data) forwards and backwards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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


def swap(x: Any) -> Any:
    """The last two axes exchanged (GPT-OSS's experts stored [E, in, out])."""
    return x.transpose(-1, -2).contiguous() if _is_torch(x) else np.ascontiguousarray(np.swapaxes(x, -1, -2))


def every(x: Any, axis: int, start: int, step: int) -> Any:
    """Every ``step``-th entry along ``axis`` from ``start`` (one of GPT-OSS's interleaved gate / up halves)."""
    index = [slice(None)] * len(x.shape)
    index[axis] = slice(start, None, step)
    out = x[tuple(index)]
    return out.contiguous() if _is_torch(out) else np.ascontiguousarray(out)


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


def ungroup(x: Any, groups: int, sizes: tuple[int, ...]) -> Any:
    """The inverse of ``regroup``: rows part by part ``[p0 of every group | p1 of every group | ...]`` back to
    group by group."""
    rest = tuple(x.shape[1:])
    block = x.shape[0] // (groups * sum(sizes))
    parts = split(x, 0, [groups * n * block for n in sizes])
    return cat([p.reshape(groups, -1, *rest) for p in parts], 1).reshape(-1, *rest)


def deinterleave(x: Any, axis: int) -> Any:
    """The inverse of ``interleave``: pairs [a_0, b_0, a_1, b_1, ...] back to halves [a_0 .. | b_0 ..]."""
    order = interleave_order(x.shape[axis])
    inverse = [0] * len(order)
    for j, i in enumerate(order):
        inverse[i] = j
    return take(x, axis, inverse)


def split(x: Any, axis: int, sizes: list[int]) -> list[Any]:
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    return [narrow(x, axis, a, b) for a, b in pairwise(starts)]


def zeros_like(x: Any, new_shape: tuple[int, ...]) -> Any:
    if _is_torch(x):
        import torch

        return torch.zeros(new_shape, dtype=x.dtype, device=x.device)
    return np.zeros(new_shape, dtype=x.dtype)


# ---------------------------------------------------------------------------------------------- the engine
# A weight rule's operation is data, (name, *args); ``apply`` runs it on the rule's source tensors (import),
# ``unapply`` gives the source tensors back from the built one (export).


@dataclass(frozen=True)
class Part:
    """A slice ``start:stop`` along ``axis`` of a source tensor of shape ``full``, which other rules fill too."""

    axis: int
    start: int
    stop: int
    full: tuple[int, ...]
    value: Any
    step: int = 1  # > 1: the entries start, start + step, ... (``every``); ``stop`` is then start + 1


OPS: dict[str, Callable[..., Any]] = {
    "copy": lambda xs: xs[0],
    "t": lambda xs: transpose(xs[0]),
    "cat": lambda xs, axis: cat(xs, axis),
    "stack": lambda xs: stack(xs),
    "reshape": lambda xs, new_shape: reshape(xs[0], tuple(new_shape)),
    "rows": lambda xs, offset: xs[0][offset:],
    "narrow": lambda xs, axis, start, stop: narrow(xs[0], axis, start, stop),
    "interleave": lambda xs, axis: interleave(xs[0], axis),
    "regroup": lambda xs, groups, sizes: regroup(xs[0], groups, tuple(sizes)),
    "swap": lambda xs: swap(xs[0]),
    "narrow_swap": lambda xs, axis, start, stop: swap(narrow(xs[0], axis, start, stop)),  # Llama 4's experts
    # every step-th entry of an axis from start, then (swapped) the last two axes exchanged
    "every": lambda xs, axis, start, step, swapped: (swap if swapped else lambda y: y)(every(xs[0], axis, start, step)),
}


def apply(op: tuple[Any, ...], xs: list[Any]) -> Any:
    """The tensor ``op`` = (name, *args) builds from the source tensors ``xs``."""
    return OPS[op[0]](xs, *op[1:])


def unapply(op: tuple[Any, ...], y: Any, expect: tuple[tuple[int, ...], ...]) -> list[Any]:
    """The source tensors (of shapes ``expect``) that ``op`` builds ``y`` from; a ``Part`` where ``y`` is only a
    slice of its source."""
    name, *args = op
    if name == "copy":
        return [y]
    if name == "t":
        return [transpose(y)]
    if name == "cat":
        return split(y, args[0], [e[args[0]] for e in expect])
    if name == "stack":
        return [y[i] for i in range(len(expect))]
    if name == "reshape":
        return [reshape(y, expect[0])]
    if name == "rows":  # the never-read leading rows are written as zeros
        return [cat([zeros_like(y, (args[0], *shape(y)[1:])), y], 0)]
    if name == "narrow":
        return [Part(args[0], args[1], args[2], expect[0], y)]
    if name == "interleave":
        return [deinterleave(y, args[0])]
    if name == "regroup":
        return [ungroup(y, args[0], tuple(args[1]))]
    if name == "swap":
        return [swap(y)]
    if name == "narrow_swap":
        return [Part(args[0], args[1], args[2], expect[0], swap(y))]
    if name == "every":  # one of several strided slices: assembled with the others
        axis, start, step, swapped = args
        return [Part(axis, start, start + 1, expect[0], swap(y) if swapped else y, step)]
    raise KeyError(f"no inverse for weight operation {name!r}")


def assemble(parts: list[Part]) -> Any:
    """One source tensor from its slices; None where they leave a gap or overlap."""
    full, axis = parts[0].full, parts[0].axis
    if any(p.step > 1 for p in parts):  # strided slices: each residue of the step exactly once
        step = parts[0].step
        if any(p.axis != axis or p.full != full or p.step != step for p in parts):
            return None
        if sorted(p.start for p in parts) != list(range(step)):
            return None
        out = zeros_like(parts[0].value, full)
        for p in parts:
            index = [slice(None)] * len(full)
            index[axis] = slice(p.start, None, p.step)
            out[tuple(index)] = p.value
        return out
    spans = sorted((p.start, p.stop) for p in parts)
    if any(p.axis != axis or p.full != full for p in parts) or spans[0][0] != 0 or spans[-1][1] != full[axis]:
        return None
    if any(a[1] != b[0] for a, b in pairwise(spans)):
        return None
    return cat([p.value for p in sorted(parts, key=lambda p: p.start)], axis)
