"""Weight-name normalisation: tensors named by other conventions (Hugging Face) → specc scope names.

``to_specc_names`` is called by every weight loader before matching tensors to the IR's parameters. For now
it only passes specc-named tensors through; the HF mappings land with the interop work.
"""

from __future__ import annotations

from typing import Any

from ..ir.graph import LayerGraph


def to_specc_names(graph: LayerGraph, tensors: dict[str, Any]) -> dict[str, Any]:
    """Return ``tensors`` renamed (and reshaped/transposed where a convention needs it) to specc names."""
    return tensors
