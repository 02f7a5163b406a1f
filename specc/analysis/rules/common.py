"""Helpers shared by the op rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...ir.attrs import OpAttrs
from ..costs import Ctx, Dims, Flop, Mem, numel

Attrs = OpAttrs
# A rule takes its kind's attribute class (``specc.ir.ops``): the table dispatches by kind.
FlopRule = Callable[[Any, list[Dims], Dims, Ctx], list[Flop]]
MemRule = Callable[[Any, list[Dims], Dims, Ctx], Mem]
ID_BYTES = 8  # int64 token ids


def io_bytes(ins: list[Dims], out: Dims, ctx: Ctx, int_inputs: int = 0) -> int:
    """Bytes read and written: float inputs and output at ``ctx.bytes``; the first ``int_inputs`` are ids."""
    total = numel(out) * ctx.bytes
    for i, shape in enumerate(ins):
        total += numel(shape) * (ID_BYTES if i < int_inputs else ctx.bytes)
    return total


def tokens(shape: Dims) -> int:
    """Rows of a [..., features] tensor."""
    return numel(shape[:-1])


__all__ = ["Attrs", "Ctx", "Dims", "Flop", "FlopRule", "Mem", "MemRule", "io_bytes", "numel", "tokens"]
