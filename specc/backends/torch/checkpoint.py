"""Checkpoints: safetensors with the validated spec in the metadata, so the file alone rebuilds the model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from ...errors import SpecError
from ...io import atomic_write
from ...spec.serialize import SPEC_KEY, spec_json
from ...version import __version__
from .build import DTYPES, build_torch
from .layers import Model


def _spec_model(spec: Any) -> Any:
    if isinstance(spec, (str, os.PathLike, dict)):
        from ...spec.loader import load_spec

        return load_spec(spec)
    return spec


def compile_checkpoint(
    spec: Any,
    path: str | os.PathLike[str],
    weights: str | os.PathLike[str] | dict[str, torch.Tensor] | None = None,
    dtype: str | torch.dtype | None = None,
    last: bool = False,
) -> Path:
    """Write the model's weights (``weights``, or the seeded init) and its spec to one .safetensors file;
    ``last``: the command's final output (a signal once it is in place no longer fails the command)."""
    spec = _spec_model(spec)
    model = build_torch(spec, weights=weights, device="cpu", dtype=dtype)
    tensors = {name: t.contiguous() for name, t in model.state_dict().items()}
    stored = next(iter(tensors.values())).dtype if tensors else None
    dtype_name = next((k for k, v in DTYPES.items() if v == stored), spec.dtype)
    metadata = {SPEC_KEY: spec_json(spec, dtype=dtype_name), "specc.version": __version__, "format": "pt"}

    from safetensors.torch import save_file

    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata), last=last)


def read_spec(path: str | os.PathLike[str]) -> Any:
    """The validated spec stored in a checkpoint written by ``compile_checkpoint``.

    The stored spec is data: a JSON object validated as it is (never a path or preset name, no ``extends:``).
    """
    from ...interop.safetensors_read import read_header
    from ...spec.loader import load_embedded_spec

    name = os.fspath(path)
    metadata = read_header(path, "a safetensors checkpoint").metadata
    if SPEC_KEY not in metadata:
        raise SpecError(
            "this safetensors file has no specc spec in its metadata",
            file=name,
            hint="pass the spec and use the file as --weights, or write it with `specc compile --target torch`",
        )
    return load_embedded_spec(metadata[SPEC_KEY], name, SPEC_KEY)


def load_checkpoint(
    path: str | os.PathLike[str], device: str | torch.device | None = None, dtype: str | torch.dtype | None = None
) -> Model:
    """Rebuild a model from a checkpoint alone: its spec from the metadata, its weights from the tensors."""
    return build_torch(read_spec(path), weights=path, device=device, dtype=dtype)
