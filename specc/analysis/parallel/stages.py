"""Pipeline stages: which block of the whole model each op belongs to, and so which stage holds it.

Blocks are numbered across stacks in graph order (an encoder's, then a decoder's). With ``pp`` stages each
stage holds ``blocks / pp`` consecutive blocks. An op outside the blocks goes with the block before it in its
own stack (final norm, head, pooler) or, when none precedes it, with the next block (embeddings): so the
embedding is on the first stage and the head on the last, as Megatron-LM places them.
"""

from __future__ import annotations

from ...ir.graph import LayerGraph


def block_ids(g: LayerGraph) -> dict[tuple[str | None, int], int]:
    """(stack, layer) → global block number, in graph order."""
    out: dict[tuple[str | None, int], int] = {}
    for op in g.ops():
        if op.layer is not None and (op.stack, op.layer) not in out:
            out[(op.stack, op.layer)] = len(out)
    return out


def block_count(g: LayerGraph) -> int:
    return len(block_ids(g))


def anchors(g: LayerGraph) -> dict[str, int]:
    """Op name → the global block it is placed with (0 for every op of a graph without blocks)."""
    ids = block_ids(g)
    ops = list(g.ops())
    out: dict[str, int] = {}
    last_in_stack: dict[str | None, int] = {}
    pending: list[str] = []
    for op in ops:
        if op.layer is not None:
            b = ids[(op.stack, op.layer)]
            out[op.name] = b
            last_in_stack[op.stack] = b
            for name in pending:  # no block of their stack came before them: they go with this one
                out[name] = b
            pending = []
        elif op.stack in last_in_stack:
            out[op.name] = last_in_stack[op.stack]
        else:
            pending.append(op.name)
    for name in pending:
        out[name] = max(ids.values(), default=0)
    return out


def stage_of(block: int, blocks: int, pp: int) -> int:
    return block // (blocks // pp) if blocks else 0
