"""Parallel layouts in the analyzer: per-device memory, communication, pipeline bubble, step time, plan search.

``per_device_weight_bytes(graph, tp=2)`` is the bytes of parameters one tensor-parallel rank holds (see
``shard.py`` for what is counted and how each tensor is split).
"""

from __future__ import annotations

from .layout import Layout, LayoutError, Training, parse_layout
from .shard import param_shards, per_device_weight_bytes

__all__ = ["Layout", "LayoutError", "Training", "param_shards", "parse_layout", "per_device_weight_bytes"]
