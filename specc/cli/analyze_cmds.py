"""Commands of this group are registered on ``app`` here (see specc/cli/__init__.py)."""

from __future__ import annotations
