"""One module name per role: no two modules (or packages) of ``specc`` share a name, so a name says which job a
file does without its folder (``checkpoint.py`` four times over said nothing)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specc"


def _names() -> dict[str, set[str]]:
    """Each module or package name and where it is (a package by its folder)."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        where = path.parent if path.name == "__init__.py" else path
        if where != PACKAGE:
            found[where.stem].add(str(where.relative_to(ROOT)))
    return found


def test_no_two_modules_share_a_name() -> None:
    shared = {name: sorted(paths) for name, paths in _names().items() if len(paths) > 1}
    assert not shared, "modules that share a name (name each by its role):\n" + "\n".join(
        f"  {name}: {', '.join(paths)}" for name, paths in sorted(shared.items())
    )
