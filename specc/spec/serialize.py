"""One way to store a validated spec inside an artifact (safetensors metadata, ONNX metadata, model.py)."""

from __future__ import annotations

import json
from typing import Any

SPEC_KEY = "specc.spec"  # the metadata key every artifact keeps its spec under


def spec_dict(spec: Any, **changes: Any) -> dict[str, Any]:
    """Plain JSON data that ``load_spec`` turns back into an equal spec (defaults left out)."""
    return {**spec.model_dump(mode="json", exclude_none=True), **changes}


def spec_json(spec: Any, **changes: Any) -> str:
    return json.dumps(spec_dict(spec, **changes), sort_keys=True, separators=(",", ":"))
