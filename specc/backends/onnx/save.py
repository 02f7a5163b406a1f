"""Metadata, checking and atomic saving (external data for models over 2 GB)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx

from ... import __version__
from ...io import atomic_path

PROTO_LIMIT = 2_000_000_000  # protobuf's 2 GiB cap, with room for the graph itself


def set_metadata(model: onnx.ModelProto, props: dict[str, str]) -> None:
    del model.metadata_props[:]
    for k, v in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    model.producer_version = __version__


def tensor_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


def save(model: onnx.ModelProto, path: Path, check: bool = True) -> None:
    """Write atomically, after the full checker (strict shape inference included) passed on the staged file
    (by path: several times faster than checking the in-memory proto, which the checker re-serialises).
    Tensors go to ``<name>.data`` beside the model when they pass 2 GB."""
    data_name = path.name + ".data"
    external = tensor_bytes(model) >= PROTO_LIMIT
    with atomic_path(path) as tmp, tempfile.TemporaryDirectory(dir=tmp.parent, prefix=f".{path.name}.") as d:
        staged = Path(d) / path.name
        if external:
            onnx.save_model(
                model,
                str(staged),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
                size_threshold=1024,
            )
        else:
            onnx.save_model(model, str(staged))
        if check:
            onnx.checker.check_model(str(staged), full_check=True)
        if external:
            os.replace(Path(d) / data_name, path.with_name(data_name))
        elif path.with_name(data_name).exists():
            path.with_name(data_name).unlink()  # a stale data file of an earlier, larger export
        os.replace(staged, tmp)
