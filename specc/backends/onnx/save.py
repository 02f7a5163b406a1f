"""ONNX metadata, and the size past which a model keeps its tensors in an external data file."""

from __future__ import annotations

import onnx

from ...version import __version__

PROTO_LIMIT = 2_000_000_000  # protobuf's 2 GiB cap, with room for the graph itself


def set_metadata(model: onnx.ModelProto, props: dict[str, str]) -> None:
    del model.metadata_props[:]
    for k, v in props.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    model.producer_version = __version__
