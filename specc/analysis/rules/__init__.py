"""FLOP and memory rules, attached to the op catalogue's entries (``OpDef.flops`` / ``OpDef.memory``) at import.

Each rule is ``(attrs, concrete input shapes, concrete output shape, ctx) → list[Flop] | Mem``; see
``specc.analysis.costs`` for the records and ``specc.analysis.constants`` for the per-element constants.
"""

from __future__ import annotations

from ...ir.ops import CATALOGUE
from . import attention, moe, per_token, recurrent, tokens

RULES = {**tokens.RULES, **per_token.RULES, **attention.RULES, **moe.RULES, **recurrent.RULES}


def attach() -> None:
    missing = sorted(set(CATALOGUE) - set(RULES))
    if missing:
        raise RuntimeError(f"ops without cost rules: {', '.join(missing)}")
    for kind, (flops, memory) in RULES.items():
        CATALOGUE[kind].flops = flops
        CATALOGUE[kind].memory = memory


attach()
