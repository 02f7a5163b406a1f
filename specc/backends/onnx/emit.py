"""The walk over IR ops (in topological order) through the emitter table of ``op_registry``.

Importing this module imports every ``ops_*`` module, so the table is complete before the first op is emitted.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...ir.graph import Op
from . import (  # noqa: F401  (they fill EMITTERS)
    ops_attention,
    ops_contrastive,
    ops_dense,
    ops_embed,
    ops_latent,
    ops_moe,
    ops_relative,
    ops_rnn,
)
from .builder import GraphBuilder
from .op_registry import EMITTERS


def emit_ops(b: GraphBuilder, ops: Iterable[Op]) -> None:
    for op in ops:
        fn = EMITTERS.get(op.kind)
        if fn is None:
            raise NotImplementedError(f"no ONNX mapping for op kind {op.kind!r} ({op.name})")
        xs = [b.values.get(i, "") for i in op.inputs]
        b.values[op.name] = fn(b, op, xs)
