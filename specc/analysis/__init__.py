"""Cost analysis over the IR: parameters, FLOPs (matmul and non-matmul apart), memory, roofline.

``analyze(spec, batch=1, seq=None, dtype=None, ...)`` returns a ``Report`` (``.to_dict()`` for JSON). The FLOP
and memory rules are their own table, ``specc.analysis.rules.RULES`` (op kind → rules); importing this package
leaves the op catalogue untouched.
"""

from __future__ import annotations

from .report import Report, analyze

__all__ = ["Report", "analyze"]
