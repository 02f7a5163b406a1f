"""specc: a compiler from declarative Transformer specs to runnable models and cost reports.

Python API (heavy backends are imported on first use)::

    spec = specc.load_spec("specs/gpt2.yaml", overrides=["blocks=2"])
    graph = specc.lower(spec)
    model = specc.build_torch(spec)
    model = specc.parallelize(model, mesh)   # torch.distributed: DeviceMesh with dims dp and/or tp
"""

from __future__ import annotations

from typing import Any

from .errors import Diagnostic, SpecError
from .io.read import ReadError
from .ir.graph import LayerGraph
from .ir.lower import lower
from .spec.loader import load_spec
from .version import __version__

__all__ = [
    "Diagnostic",
    "LayerGraph",
    "ReadError",
    "SpecError",
    "__version__",
    "analyze",
    "build_torch",
    "export_onnx",
    "load_spec",
    "lower",
    "parallelize",
]


def build_torch(spec: Any, weights: Any = None, device: Any = None, dtype: Any = None, accelerate: Any = None) -> Any:
    """``torch.nn.Module`` for a spec; state_dict keys equal the IR scope names. ``accelerate=False`` (or
    ``SPECC_ACCEL=0``): the plain module tree, without the acceleration pass."""
    from .backends.torch.build import build_torch as impl

    return impl(spec, weights=weights, device=device, dtype=dtype, accelerate=accelerate)


def export_onnx(spec: Any, path: Any, weights: Any = None, **options: Any) -> Any:
    """Write an ONNX model with one fused attention node per attention layer."""
    from .backends.onnx.export import export_onnx as impl

    return impl(spec, path, weights=weights, **options)


def parallelize(model: Any, mesh: Any, *, sequence_parallel: bool = False, init: bool = True, ep: int = 1) -> Any:
    """Split a built model over a ``DeviceMesh`` with dimensions ``dp`` and/or ``tp``: tensor parallelism
    from the layer graph's plan, FSDP2 per block over ``dp``, MoE experts sharded over the ``dp`` ranks with
    all-to-all dispatch (``ep`` = dp; see ``specc.parallel``). A model built on the meta device is split there
    and each rank materializes only its shards (seeded init, or none: ``init``)."""
    from .parallel import parallelize as impl

    return impl(model, mesh, sequence_parallel=sequence_parallel, init=init, ep=ep)


def analyze(spec: Any, batch: int = 1, seq: int | None = None, dtype: str | None = None, **options: Any) -> Any:
    """Cost report (parameters, FLOPs, memory) computed from the IR; ``.to_dict()`` gives the JSON form."""
    from .analysis.report import analyze as impl

    return impl(spec, batch=batch, seq=seq, dtype=dtype, **options)
