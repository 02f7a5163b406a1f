"""Generated models on torch.distributed: tensor parallelism derived from the layer graph (DTensor,
``parallelize_module``), FSDP2 over data-parallel ranks, and distributed checkpoints (``torch.distributed.
checkpoint``) that single-process models load.

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = specc.parallelize(specc.build_torch(spec, device="meta"), mesh)  # each rank allocates its shards
"""

from __future__ import annotations

from typing import Any

from ..analysis.layouts.tensor_plan import Rule, check_tensor_parallel, local_params, tensor_plan
from ..errors import SpecError

__all__ = ["Rule", "check_tensor_parallel", "local_params", "parallelize", "tensor_plan"]

DIMS = ("dp", "tp")


def parallelize(model: Any, mesh: Any, *, sequence_parallel: bool = False, init: bool = True, ep: int = 1) -> Any:
    """``model`` (from ``build_torch``) split over ``mesh``, in place, and returned.

    ``mesh``: a ``DeviceMesh`` with dimensions named ``dp`` and/or ``tp``. ``tp``: the tensor-parallel plan of
    ``model.graph`` (``analysis.layouts.tensor_plan``) applied with ``parallelize_module``; ``dp``: ``fully_shard`` per
    block and at the root. The forward takes the same inputs on every rank of a ``tp`` group and returns the
    full logits there; ``dp`` ranks take different batches. ``sequence_parallel``: between blocks the residual
    stream is split by positions over ``tp`` too (``specc.parallel.sequence``; whole sequences only). ``ep``:
    the experts of every MoE layer sharded over groups of ``ep`` dp ranks, tokens dispatched to them by
    all-to-all (``specc.parallel.expert_parallel``; ep divides dp).

    A model larger than one device: build it on the meta device (``build_torch(spec, device="meta")``); it
    is split there and each rank then allocates only its shards (``specc.parallel.materialize``), filled with
    the values ``build_torch(spec)`` would give (``init=True``) or left for ``checkpoint.load_into`` /
    ``materialize.load_full`` (``init=False``). A model with real weights keeps them (``init`` must be True).
    """
    from .fsdp import apply_fsdp
    from .tensor import apply_tensor_parallel

    if not hasattr(mesh, "mesh_dim_names"):  # a DeviceMesh (or one that acts as one)
        raise SpecError(
            f"parallelize takes a DeviceMesh, not {type(mesh).__name__}",
            hint='init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))',
        )
    if getattr(model, "mesh", None) is not None:
        raise SpecError(
            "this model is already parallelized (model.mesh is set): its parameters are shards now",
            hint="parallelize a fresh build_torch(spec) model once, over the whole mesh",
        )
    for flag, value in (("sequence_parallel", sequence_parallel), ("init", init)):
        if not isinstance(value, bool):
            raise SpecError(f"{flag} must be True or False, not {value!r}")
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise SpecError(f"ep must be a positive integer, not {ep!r}")
    names = tuple(mesh.mesh_dim_names or ())
    if not names or any(n not in DIMS for n in names) or len(set(names)) != len(names):
        raise SpecError(
            f"the device mesh's dimensions are {list(names) or 'unnamed'}; name them from {list(DIMS)}",
            hint='init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))',
        )
    graph = getattr(model, "graph", None)
    if graph is None:
        raise SpecError("parallelize takes a model built by specc (build_torch): its plan comes from model.graph")
    from .materialize import is_meta, materialize

    meta = is_meta(model)
    if not init and not meta:
        raise SpecError(
            "init=False leaves the parameters of a meta-device model uninitialized; this model has real weights",
            hint='build_torch(spec, device="meta") for a model a checkpoint will fill',
        )
    if hasattr(model, "plain"):
        model.plain()  # the acceleration pass undone: DTensor and FSDP parameters run on plain modules
    tp = mesh["tp"] if "tp" in names else None
    dp = mesh["dp"] if "dp" in names else None
    if sequence_parallel and (tp is None or tp.size() == 1):
        raise SpecError("sequence_parallel=True splits positions over tp: the mesh needs a tp dimension > 1")
    from .expert_parallel import apply_expert_parallel, check_expert_parallel

    check_expert_parallel(graph, ep, dp.size() if dp is not None else 1, tp.size() if tp is not None else 1)
    split = tp is not None and tp.size() > 1
    if split:
        apply_tensor_parallel(model, graph, tp, sequence=sequence_parallel, experts=ep == 1)
    experts: set[Any] = set()
    if ep > 1 and dp is not None:
        experts, replicas = apply_expert_parallel(model, graph, mesh, dp, tp if split else None, ep)
        if replicas is not None:  # ep < dp: the experts sharded over their replica groups first
            from .expert_parallel import shard_replicas

            shard_replicas(model, graph, replicas)
            experts = set()  # the blocks' FSDP2 leaves the inner units' parameters to them
    if dp is not None and dp.size() > 1:
        apply_fsdp(model, graph, dp, experts)
    model.mesh = mesh
    if meta:
        materialize(model, init)
    return model
