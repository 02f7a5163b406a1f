"""FLOP and memory rules, one table keyed by op kind: ``RULES[kind] = (flop_rule, memory_rule)``.

The table is the analyzer's own: it reads the op catalogue (``specc.ir.ops.CATALOGUE``) but never writes it,
and tests/test_registries.py asserts that both cover the same op kinds. Each rule is ``(attrs, concrete input
shapes, concrete output shape, ctx) → list[Flop] | Mem``; see ``specc.analysis.costs`` for the records and
``specc.analysis.constants`` for the per-element constants.
"""

from __future__ import annotations

from . import attention_core, experts, per_token, recurrent, similarity, tokens
from .common import FlopRule, MemRule

RULES: dict[str, tuple[FlopRule, MemRule]] = {
    **tokens.RULES,
    **per_token.RULES,
    **attention_core.RULES,
    **experts.RULES,
    **recurrent.RULES,
    **similarity.RULES,
}


def rules_for(kind: str, name: str | None = None) -> tuple[FlopRule, MemRule]:
    """The (FLOP rule, memory rule) of an op kind; a clear error for a kind the table lacks."""
    try:
        return RULES[kind]
    except KeyError:
        where = f" ({name})" if name else ""
        raise NotImplementedError(
            f"no cost rule for op kind {kind!r}{where}: add (flops, memory) rules for it to specc.analysis.rules.RULES"
        ) from None


__all__ = ["RULES", "FlopRule", "MemRule", "rules_for"]
