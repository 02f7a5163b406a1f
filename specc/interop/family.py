"""What a Hugging Face model family provides."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..ir.graph import LayerGraph
from .hf_config import HFConfig
from .weight_map import Plan


@dataclass(frozen=True)
class Family:
    name: str  # for messages: "GPT-2"
    architectures: tuple[str, ...]  # HF classes whose config.json this family imports
    model_types: tuple[str, ...]  # config.json model_type values
    kinds: tuple[str, ...]  # specc graph families its checkpoints fill
    spec: Callable[[HFConfig, str], dict[str, Any]]  # (config, architecture) → spec document
    detect: Callable[[set[str]], bool]  # do these checkpoint names look like this family's?
    plan: Callable[[LayerGraph, set[str]], Plan]  # weight rules for a graph
