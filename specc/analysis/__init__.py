"""Cost analysis over the IR: parameters, FLOPs (matmul and non-matmul apart), memory, roofline.

``analyze(spec, batch=1, seq=None, dtype=None, ...)`` returns a ``Report`` (``.to_dict()`` for JSON). Importing
this package attaches the FLOP and memory rules to the op catalogue (``specc.analysis.rules``).
"""

from __future__ import annotations

from . import rules  # noqa: F401
from .report import Report, analyze

__all__ = ["Report", "analyze"]
