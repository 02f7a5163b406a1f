"""Pipeline stages: which block of the whole model each op belongs to, and so which stage holds it.

Blocks are numbered across stacks in graph order (an encoder's, then a decoder's). With ``pp`` stages each
stage holds ``blocks // pp`` consecutive blocks; when ``pp`` does not divide the blocks, the ``blocks % pp``
blocks left over go one each to the stages nearest the middle of the pipeline, as the first and last stages
already carry the embedding and the head (126 blocks on 16 stages: 14 stages of 8, the two end stages of 7).
An op outside the blocks goes with the block before it in its
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


def split(blocks: int, pp: int) -> list[int]:
    """Blocks per stage: even, the remainder on the middle stages."""
    base, extra = divmod(blocks, pp)
    order = sorted(range(pp), key=lambda s: (min(s, pp - 1 - s) * -1, s))  # middle stages first
    sizes = [base] * pp
    for s in order[:extra]:
        sizes[s] += 1
    return sizes


_BOUNDS: dict[tuple[int, int], list[int]] = {}


def stage_of(block: int, blocks: int, pp: int) -> int:
    if not blocks or pp <= 1:
        return 0
    key = (blocks, pp)
    if key not in _BOUNDS:
        ends, total = [], 0
        for n in split(blocks, pp):
            total += n
            ends.append(total)
        _BOUNDS[key] = ends
    ends = _BOUNDS[key]
    lo, hi = 0, pp - 1
    while lo < hi:  # the first stage whose end lies past the block
        mid = (lo + hi) // 2
        if ends[mid] > block:
            hi = mid
        else:
            lo = mid + 1
    return lo
