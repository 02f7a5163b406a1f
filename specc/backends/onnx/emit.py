"""The op-kind → ONNX mapping registry and the walk over IR ops (in topological order).

Each ``make_<op>`` function lives with its family (``ops_*.py``) and registers itself with ``@emits``; it
gets the builder, the IR op and the ONNX names of the op's inputs ("" for an input the graph omits, e.g. the
padding mask when exported without one) and returns the ONNX name of the op's output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...ir.graph import Op
from .builder import GraphBuilder

Emitter = Callable[[GraphBuilder, Op, list[str]], str]
EMITTERS: dict[str, Emitter] = {}


def emits(*kinds: str) -> Callable[[Emitter], Emitter]:
    def register(fn: Emitter) -> Emitter:
        for k in kinds:
            EMITTERS[k] = fn
        return fn

    return register


def emit_ops(b: GraphBuilder, ops: Iterable[Op]) -> None:
    _load_emitters()
    for op in ops:
        fn = EMITTERS.get(op.kind)
        if fn is None:
            raise NotImplementedError(f"no ONNX mapping for op kind {op.kind!r} ({op.name})")
        xs = [b.values.get(i, "") for i in op.inputs]
        b.values[op.name] = fn(b, op, xs)


def _load_emitters() -> None:
    from . import graph_rnn, ops_attention, ops_dense, ops_embed, ops_moe, ops_rnn  # noqa: F401  (registration)
