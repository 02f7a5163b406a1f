"""Position encodings computed exactly as the torch backend computes them (fp32, same formulas), so the two
backends agree to the last bit on the angles. 1-D tables are built in-graph from the position ids of each call
([B or 1, N], see positions.py: no table, no length limit); only the fixed 2-D ViT table is a constant."""

from __future__ import annotations

import math

import numpy as np
import torch

from .builder import GraphBuilder

FLOAT = 1  # TensorProto.FLOAT


def sinusoid_inv_freq(dim: int) -> np.ndarray:
    """1 / 10000^(2i/dim), fp32, as the torch backend's ``sinusoids``."""
    return torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(1e4) / dim)).numpy()


def rope_inv_freq(dims: int, theta: float) -> np.ndarray:
    """theta^(-2i/dims), fp32, as the torch backend's ``rotary``."""
    return (theta ** (-torch.arange(0, dims, 2, dtype=torch.float32) / dims)).numpy()


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


def angles(b: GraphBuilder, pos: str, inv: np.ndarray, scope: str) -> str:
    """fp32 [..., N, len(inv)]: int64 positions [..., N] ⊗ inv."""
    pos = b.op("Unsqueeze", [b.op("Cast", [pos], scope=scope, to=FLOAT), b.i64(-1)], scope=scope)
    return b.op("Mul", [pos, b.const(inv, f"{scope}_inv_freq", np.float32)], scope=scope)


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
