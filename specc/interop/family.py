"""What a Hugging Face model family provides, and helpers its weight rules share."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import SpecError
from ..ir.graph import LayerGraph
from .hf_config import HFConfig
from .weight_map import Plan, Rule, ShapeT

# A specc parameter inside a block: optional stack, block index, the rest.
BLOCK = re.compile(r"(?:(encoder|decoder)\.)?blocks\.(\d+)\.(.+)")


@dataclass(frozen=True)
class Family:
    name: str  # for messages: "GPT-2"
    architectures: tuple[str, ...]  # HF classes whose config.json this family imports
    model_types: tuple[str, ...]  # config.json model_type values
    kinds: tuple[str, ...]  # specc graph families its checkpoints fill
    spec: Callable[[HFConfig, str], dict[str, Any]]  # (config, architecture) → spec document
    detect: Callable[[set[str]], bool]  # do these checkpoint names look like this family's?
    plan: Callable[[LayerGraph, set[str]], Plan]  # weight rules for a graph


def prefix(names: Iterable[str], candidate: str) -> str:
    """``candidate`` if the checkpoint names carry it (a task model wrapping the base model), else ''."""
    return candidate if any(n.startswith(candidate) for n in names) else ""


def attention_sizes(g: LayerGraph, target: str) -> list[int]:
    """Output widths of the pieces of a packed projection: [q, k, v] for ``.qkv``, [k, v] for ``.kv``."""
    op = target.rsplit(".", 1)[0]  # blocks.0.attn.qkv
    core = g.op(op.rsplit(".", 1)[0] + ".core").attrs
    q, kv = core["heads"] * core["head_dim"], core["kv_heads"] * core["head_dim"]
    return [q, kv, kv] if op.endswith(".qkv") else [kv, kv]


def rules_for(
    g: LayerGraph, family: str, make: Callable[[str, ShapeT], Rule | list[Rule] | None]
) -> dict[str, list[Rule]]:
    """Ask ``make`` for the rules of every graph parameter; a parameter no checkpoint tensor fills is an error."""
    out: dict[str, list[Rule]] = {}
    orphans: list[str] = []
    for target, p in g.params().items():
        r = make(target, p.shape)
        if r is None:
            orphans.append(target)
        else:
            out[target] = r if isinstance(r, list) else [r]
    if orphans:
        raise SpecError(
            f"{family} checkpoints have no tensor for {', '.join(orphans[:8])}" + (" ..." if len(orphans) > 8 else ""),
            hint=f"the spec has parts a {family} model does not (e.g. biases, heads): import its config.json with "
            "`specc import-hf` to get a matching spec",
        )
    return out
