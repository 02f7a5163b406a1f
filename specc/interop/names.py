"""Weight-name normalisation: tensors named by other conventions (Hugging Face) → specc scope names.

``to_specc_names`` is called by every weight loader before matching tensors to the IR's parameters.
specc-named tensors pass through unchanged (the loader matches them); a checkpoint in a Hugging Face family's
naming is mapped strictly: every missing, mis-shaped or unexpected tensor is reported by name, all at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import Diagnostic, SpecError
from ..ir.graph import LayerGraph
from . import weight_map as plans
from .family import Family
from .registry import FAMILIES, by_names


def to_specc_names(graph: LayerGraph, tensors: dict[str, Any]) -> dict[str, Any]:
    """Return ``tensors`` renamed (and reshaped/transposed where a convention needs it) to specc names."""
    family = hf_family(graph, tensors)
    if family is None:
        return tensors
    return plans.run(family.plan(graph, set(tensors)), tensors)


def hf_family(graph: LayerGraph, names: Mapping[str, Any] | set[str]) -> Family | None:
    """The HF family whose naming ``names`` follow, or None for specc's own names (or unknown ones)."""
    found = set(names)
    if not found or found <= set(graph.params()):
        return None
    family = by_names(found)
    if family is None:
        return None  # the loader reports these names as unexpected
    kind = graph.meta.get("family")
    if kind not in family.kinds:
        raise SpecError(
            f"these are {family.name} weights (Hugging Face names), but the spec is a {kind} model",
            hint=f"{family.name} checkpoints fill {' / '.join(family.kinds)} specs: import the model's config.json "
            "with `specc import-hf`",
        )
    return family


def check_names(graph: LayerGraph, shapes: Mapping[str, tuple[int, ...]]) -> list[Diagnostic]:
    """Problems a checkpoint (names and shapes only) would hit when loaded into ``graph``."""
    family = hf_family(graph, set(shapes))
    if family is None:
        params = graph.params()
        missing = [n for n in params if n not in shapes]
        unexpected = [n for n in shapes if n not in params]
        wrong = [
            f"{n}: shape {list(s)}, expected {list(params[n].shape)}"
            for n, s in shapes.items()
            if n in params and tuple(s) != params[n].shape
        ]
        return [
            *plans.listed("missing tensor", missing, "the spec needs these"),
            *plans.listed("mis-shaped tensor", wrong, "check the spec's sizes"),
            *plans.listed("unexpected tensor", unexpected, _known_families()),
        ]
    return plans.check(family.plan(graph, set(shapes)), shapes).problems


def _known_families() -> str:
    return "names are neither specc's nor a known Hugging Face family's (" + ", ".join(f.name for f in FAMILIES) + ")"
