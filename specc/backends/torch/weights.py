"""Reading weights: safetensors files or dicts, renamed to specc names and checked against the IR by name."""

from __future__ import annotations

import os
from typing import Any

import torch

from ...errors import SpecError
from ...interop.names import to_specc_names
from ...ir.graph import LayerGraph


def read_weights(source: str | os.PathLike[str] | dict[str, Any], graph: LayerGraph) -> dict[str, torch.Tensor]:
    """Tensors by IR parameter name; missing, unexpected and mis-shaped tensors are reported by name.

    Weights must be float32, float16 or bfloat16 (they are cast to the model's dtype like any checkpoint);
    integer, boolean, float64 and float8 tensors are refused rather than converted, and so are NaN and infinite
    values, each naming the tensor.
    """
    if isinstance(source, dict):
        tensors = dict(source)
        origin = "weights"
        bad = [k for k, v in tensors.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise SpecError(f"weights must map names to torch tensors; {bad[0]!r} does not", file=origin)
    else:
        origin = os.fspath(source)
        tensors = load_safetensors(origin)
    check_finite(tensors, origin)
    tensors = to_specc_names(graph, tensors)
    if isinstance(source, dict):  # the model takes ownership of what it loads: never alias the caller's tensors
        tensors = {name: t.detach().clone() for name, t in tensors.items()}
    check_matches(graph, {n: tuple(t.shape) for n, t in tensors.items()}, origin)
    check_dtypes(tensors, origin)
    return tensors


def check_matches(graph: LayerGraph, shapes: dict[str, tuple[int, ...]], origin: str) -> None:
    """Tensors by specc name (``shapes``) are exactly the graph's parameters: missing, unexpected and
    mis-shaped ones reported by name, all at once."""
    want = {name: tuple(p.shape) for name, p in graph.params().items()}
    missing = sorted(set(want) - set(shapes))
    unexpected = sorted(set(shapes) - set(want))
    wrong = sorted(
        f"{n}: {list(shapes[n])} (expected {list(want[n])})" for n in set(want) & set(shapes) if shapes[n] != want[n]
    )
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:6])}{', ...' if len(items) > 6 else ''}"
        for label, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", wrong))
        if items
    ]
    if problems:
        raise SpecError(
            f"weights do not match {graph.meta.get('name', 'the spec')}: " + "; ".join(problems),
            file=origin,
            hint="tensor names must be specc scope names (see `specc graph SPEC`) or a known checkpoint layout",
        )


def check_dtypes(tensors: dict[str, torch.Tensor], origin: str) -> None:
    """Weights are floating point of a dtype specc loads exactly."""
    check_dtype_names({n: str(t.dtype).removeprefix("torch.") for n, t in tensors.items()}, origin)


def check_dtype_names(dtypes: dict[str, str], origin: str) -> None:
    """``dtypes``: tensor name → torch dtype name (float32, ...)."""
    wrong = sorted(f"{n} ({d})" for n, d in dtypes.items() if d not in FLOAT_NAMES)
    if wrong:
        raise SpecError(
            f"weights must be float32, float16 or bfloat16; {len(wrong)} tensor(s) are not: {', '.join(wrong[:4])}"
            + (", ..." if len(wrong) > 4 else ""),
            file=origin,
            hint="integer and boolean tensors are not weights, and float64 / float8 would be rounded silently: "
            "convert the checkpoint to float32 first",
        )


def check_finite(tensors: dict[str, torch.Tensor], origin: str) -> None:
    """No NaN or infinite value in any floating-point tensor (named as stored)."""
    for n in sorted(tensors):
        t = tensors[n]
        if t.dtype in (*FLOATS, torch.float64) and not _finite(t):
            flat = t.reshape(-1)
            kind = "NaN" if bool(torch.isnan(flat).any()) else "infinite"
            count = int((~torch.isfinite(flat)).sum())
            raise SpecError(
                f"weight {n} holds {count:,} {kind} value(s)",
                file=origin,
                hint="the checkpoint is damaged or diverged in training; a model with it computes NaN",
            )


def _finite(t: torch.Tensor, chunk: int = 1 << 24) -> bool:
    """All values finite, checked in chunks so the temporary mask stays small for a large tensor."""
    flat = t.reshape(-1)
    return all(bool(torch.isfinite(part).all()) for part in flat.split(chunk))


FLOATS = (torch.float32, torch.float16, torch.bfloat16)
FLOAT_NAMES = ("float32", "float16", "bfloat16")


def load_safetensors(path: str) -> dict[str, torch.Tensor]:
    """One .safetensors file, a sharded checkpoint's index, or a folder holding either (as save_pretrained writes)."""
    from ...interop.safetensors_read import load

    if not os.path.lexists(path):
        raise SpecError(f"no such weights file: {path}", file=path)
    return load(path)
