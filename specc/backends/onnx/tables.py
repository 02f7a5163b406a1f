"""Position encodings computed exactly as the torch backend computes them (fp32, same formulas; RoPE
frequencies by the torch layer library's own functions), so the two backends agree on the angles. 1-D tables
are built in-graph from the position ids of each call ([B or 1, N], see positions.py: no table, no length
limit); only the fixed 2-D ViT table is a constant."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..torch.layers import rope
from .builder import GraphBuilder

FLOAT = 1  # TensorProto.FLOAT


def sinusoid_inv_freq(dim: int) -> np.ndarray:
    """1 / 10000^(2i/dim), fp32, as the torch backend's ``sinusoids``."""
    return torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(1e4) / dim)).numpy()


def rope_inv_freq(b: GraphBuilder, pos: str, dims: int, theta: float, scaling: dict[str, Any] | None) -> str:
    """fp32 [dims / 2] inverse frequencies of RoPE for this call's int64 positions ``pos``, by the torch
    backend's own functions (layers/rope.py): an initializer, or, when they depend on the length L = max(pos)
    + 1 (dynamic, longrope), chosen / computed in-graph from L."""
    short = b.const(rope.static_inv_freq(dims, theta, scaling).numpy(), "rope_inv_freq", np.float32)
    if not rope.by_length(scaling):
        return short
    assert scaling is not None
    n = scaling["original_max_positions"]
    length = b.op("Add", [b.op("ReduceMax", [pos], scope="rope", keepdims=0), b.scalar_i64(1)], scope="rope")
    longer = b.op("Greater", [length, b.scalar_i64(n)], scope="rope")
    if scaling["type"] == "longrope":
        long = b.const(rope.static_inv_freq(dims, theta, scaling, long=True).numpy(), "rope_inv_freq_long", np.float32)
        return b.op("Where", [longer, long, short], scope="rope")
    # dynamic (NTK): theta · (f·L'/n - (f - 1))^(d/(d-2)), L' = max(L, n), in fp32 as rope.dynamic_base
    f = scaling["factor"]

    def c(v: float) -> str:
        return b.const(np.array(v, np.float32), "rope_scalar", np.float32)

    grown = b.op("Cast", [b.op("Max", [length, b.scalar_i64(n)], scope="rope")], scope="rope", to=FLOAT)
    ratio = b.op("Sub", [b.op("Div", [b.op("Mul", [grown, c(f)], scope="rope"), c(n)], scope="rope"), c(f - 1)])
    base = b.op("Mul", [b.op("Pow", [ratio, c(dims / (dims - 2))], scope="rope"), c(theta)], scope="rope")
    exponent = b.const((torch.arange(0, dims, 2).float() / dims).numpy(), "rope_exponent", np.float32)
    inv = b.op("Reciprocal", [b.op("Pow", [base, exponent], scope="rope")], scope="rope")
    return b.op("Where", [longer, inv, short], scope="rope")


def sinusoid_2d(grid: int, dim: int, cls: bool) -> np.ndarray:
    """Half the dims encode the row, half the column; the class token (first) gets zeros."""

    def table(n: int, d: int) -> torch.Tensor:
        angles = torch.arange(n, dtype=torch.float32)[:, None] * torch.from_numpy(sinusoid_inv_freq(d))[None, :]
        return torch.stack((angles.sin(), angles.cos()), -1).flatten(-2)[:, :d]

    rows = table(grid, dim // 2)[:, None, :].expand(grid, grid, -1)
    cols = table(grid, dim - dim // 2)[None, :, :].expand(grid, grid, -1)
    pos = torch.cat((rows, cols), -1).reshape(grid * grid, dim)
    if cls:
        pos = torch.cat((pos.new_zeros(1, dim), pos))
    return pos.numpy()


def angles(b: GraphBuilder, pos: str, inv: np.ndarray | str, scope: str) -> str:
    """fp32 [..., N, len(inv)]: int64 positions [..., N] ⊗ inv (an array, or the name of an fp32 tensor)."""
    pos = b.op("Unsqueeze", [b.op("Cast", [pos], scope=scope, to=FLOAT), b.i64(-1)], scope=scope)
    inv = inv if isinstance(inv, str) else b.const(inv, f"{scope}_inv_freq", np.float32)
    return b.op("Mul", [pos, inv], scope=scope)


def to_model_dtype(b: GraphBuilder, x: str, scope: str) -> str:
    return x if b.opts.dtype == "fp32" else b.op("Cast", [x], scope=scope, to=b.ftype)


def sinusoid_rows(b: GraphBuilder, pos: str, dim: int, scope: str) -> str:
    """[..., N, dim] sinusoids for int64 positions [..., N]: sin and cos interleaved (PE[p, 2i], PE[p, 2i+1])."""
    a = angles(b, pos, sinusoid_inv_freq(dim), scope)
    sin = b.op("Unsqueeze", [b.op("Sin", [a], scope=scope), b.i64(-1)], scope=scope)
    cos = b.op("Unsqueeze", [b.op("Cos", [a], scope=scope), b.i64(-1)], scope=scope)
    both = b.op("Concat", [sin, cos], scope=scope, axis=-1)  # [..., N, ceil(dim/2), 2]
    table = b.op("Reshape", [both, b.i64(0, 0, -1)], scope=scope)  # positions are [B or 1, N]
    if dim % 2:
        table = b.op("Slice", [table, b.i64(0), b.i64(dim), b.i64(-1)], scope=scope)
    return to_model_dtype(b, table, scope)
