"""A violated cross-field rule, and the error that carries all of them.

All violated rules are raised together as one ``RuleViolations`` (a ValueError, so pydantic keeps it as the
``ctx["error"]`` of a ``value_error`` and the loader can map every path back to a file position).
"""

from __future__ import annotations

from dataclasses import dataclass

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Violation:
    path: Path
    message: str
    hint: str | None = None
    # Other keys the rule involves: the loader blames the first of path + also that the user's own file sets
    # (with ``extends:``, the offending value may come from the child while ``path`` lives in the parent).
    also: tuple[Path, ...] = ()


class RuleViolations(ValueError):
    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("; ".join(v.message for v in violations))
