"""The op-kind → ONNX emitter table, a leaf module: each ``ops_*`` module registers its ``make_<op>`` functions
here with ``@emits``, and ``emit`` (which imports every ``ops_*`` module) walks the IR through the table.

An emitter gets the builder, the IR op and the ONNX names of the op's inputs ("" for an input the graph omits,
e.g. the padding mask when exported without one) and returns the ONNX name of the op's output.
"""

from __future__ import annotations

from collections.abc import Callable

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
