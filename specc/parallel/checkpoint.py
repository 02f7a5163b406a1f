"""Distributed checkpoints (``torch.distributed.checkpoint``) of parallelized models, in the single-process
layout: a folder with DCP's ``.metadata`` and shard files, and ``specc.json`` (the spec, as in a specc
safetensors checkpoint, and the training state). Each rank writes its own shards; packed projections, held
rank-major under tensor parallelism (``specc.parallel.tensor``), are written in their ``[q | k | v]`` order,
so the folder loads into a single-process model (``load``), into ``specc generate DIR``, or into a
parallelized model of any layout (``load_into``).

A training checkpoint also holds the optimizer's state (``torch.distributed.checkpoint.state_dict``'s
``get_optimizer_state_dict``: the Adam moments sharded as their parameters, the step count) under
``optimizer.``; with the step and seed in ``specc.json`` (a step's batch and dropout come from them) that is
all a run needs to resume in any layout (``load_optimizer``) or in one process (``load(..., with_optimizer)``).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from .. import __version__, read
from ..errors import SpecError
from ..io import atomic_write
from ..spec.serialize import SPEC_KEY, spec_json

META_FILE = "specc.json"
TRAIN_KEY = "specc.train"
OPTIM = "optimizer"  # the optimizer state's keys: optimizer.state.<param>.<slot>, optimizer.param_groups
STATE = f"{OPTIM}.state."


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return p.is_dir() and (p / ".metadata").is_file() and (p / META_FILE).is_file()


def _tp(model: nn.Module) -> int:
    mesh = getattr(model, "mesh", None)
    names = tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
    return mesh["tp"].size() if "tp" in names else 1


def _packed(model: nn.Module) -> dict[str, torch.Tensor]:
    from .tensor import packed_params

    return packed_params(model.graph, _tp(model))


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor whole, in the single-process layout, on every rank (all ranks must call it)."""
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    for name, order in _packed(model).items():
        sd[name] = sd[name][torch.argsort(order)]
    return sd


def full_optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state whole, as ``<param>.<slot>`` tensors in the single-process layout
    (``specc.train.checkpoint``'s sidecar), on every rank (all ranks must call it)."""
    osd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    packed = _packed(model)
    out = {}
    for name, slots in osd["state"].items():
        for slot, value in slots.items():
            if torch.is_tensor(value):
                if name in packed and value.dim():
                    value = value[torch.argsort(packed[name])]
                out[f"{name}.{slot}"] = value.detach().to("cpu").contiguous()
    return out


def restore_full_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, dict[str, torch.Tensor]]
) -> None:
    """Put whole Adam moments by parameter and slot (single-process layout) onto a parallelized model's
    optimizer, each split as its parameter is (a collective)."""
    packed = _packed(model)
    state = {
        name: {k: v[packed[name]] if name in packed and v.dim() else v for k, v in slots.items()}
        for name, slots in saved.items()
    }
    groups = get_optimizer_state_dict(model, optimizer)["param_groups"]
    osd = {"state": state, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True))


def _unpacked(value: Any, order: torch.Tensor) -> Any:
    """A packed tensor (rank-major rows) in the single-process row order, split by rows over its mesh again:
    gathered whole one tensor at a time, each rank keeps a slice for DCP to write."""
    if not torch.is_tensor(value) or not value.dim():
        return value
    if not isinstance(value, DTensor):
        return value[torch.argsort(order)]
    whole = value.full_tensor()[torch.argsort(order)]
    mesh = value.device_mesh
    split = distribute_tensor(whole, mesh, [Shard(0)] * mesh.ndim, src_data_rank=None)
    local = split.to_local().clone()  # not a view: the whole tensor is freed now
    return DTensor.from_local(local, mesh, split.placements, run_check=False, shape=split.shape, stride=split.stride())


def save(
    model: nn.Module,
    path: str | os.PathLike[str],
    spec: Any,
    train: dict[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> Path:
    """Write ``model``'s shards (and ``optimizer``'s) from every rank (a collective) and, from rank 0,
    ``specc.json``."""
    packed = _packed(model)
    sd: dict[str, Any] = get_model_state_dict(model)
    for name, order in packed.items():
        sd[name] = _unpacked(sd[name], order)
    if optimizer is not None:
        osd = get_optimizer_state_dict(model, optimizer)
        for name, slots in osd["state"].items():
            if name in packed:
                osd["state"][name] = {k: _unpacked(v, packed[name]) for k, v in slots.items()}
        sd[OPTIM] = osd
    path = Path(path)
    dcp.save(sd, checkpoint_id=path)
    if not dist.is_initialized() or dist.get_rank() == 0:
        meta = {SPEC_KEY: spec_json(spec), TRAIN_KEY: train or {}, "specc.version": __version__}
        atomic_write(path / META_FILE, json.dumps(meta))
    if dist.is_initialized():
        dist.barrier()
    return path


def _meta(path: Path) -> dict[str, Any]:
    file = str(path / META_FILE)
    data, _ = read.read_json(path / META_FILE, "a specc checkpoint's specc.json")
    meta = read.json_object(data, file, "specc.json")
    if not isinstance(meta.get(SPEC_KEY), str):
        raise SpecError(f"no spec under {SPEC_KEY!r}", file=file, hint="checkpoints come from specc train --parallel")
    return meta


def _stored(path: str | os.PathLike[str]) -> dict[str, Any]:
    return dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata


def has_optimizer(path: str | os.PathLike[str]) -> bool:
    return any(key.startswith(STATE) for key in _stored(path))


def load(path: str | os.PathLike[str], with_optimizer: bool = False, weights: bool = True) -> Any:
    """A distributed checkpoint read whole into one process: a ``specc.train.checkpoint.Checkpoint``, with the
    optimizer's tensors as ``<param>.<slot>`` (``with_optimizer``; None when the folder holds none), or with
    no tensors at all (``weights=False``: its spec and training state, checked)."""
    from ..ir.lower import lower
    from ..spec.loader import load_embedded_spec
    from ..train.checkpoint import Checkpoint, check_train_state

    p = Path(path)
    if not is_checkpoint(p):
        raise SpecError("not a specc distributed checkpoint (a folder with .metadata and specc.json)", file=str(p))
    meta = _meta(p)
    spec = load_embedded_spec(meta[SPEC_KEY], str(p / META_FILE), SPEC_KEY)
    train = check_train_state(json.dumps(meta.get(TRAIN_KEY, {})), str(p / META_FILE))
    stored = _stored(p)
    want = lower(spec).params()
    names = {k for k in stored if not k.startswith(f"{OPTIM}.")}
    if names != set(want):
        extra = sorted(names ^ set(want))
        raise SpecError(f"the checkpoint's tensors do not match its spec: {extra[:4]}", file=str(p))
    for name, spec_p in want.items():
        if tuple(stored[name].size) != tuple(spec_p.shape):
            size = list(stored[name].size)
            raise SpecError(f"{name} has shape {size}; the spec needs {list(spec_p.shape)}", file=str(p))
    if not weights:  # checked, nothing allocated: a model larger than this process reads its shards elsewhere
        return Checkpoint(spec, {}, train, None)
    tensors = {name: torch.empty(tuple(stored[name].size), dtype=stored[name].properties.dtype) for name in want}
    moments = {}
    if with_optimizer:  # optimizer.state.<param>.<slot> → <param>.<slot>, as the safetensors sidecar names them
        for key, info in stored.items():
            if key.startswith(STATE) and hasattr(info, "size"):
                moments[key] = torch.empty(tuple(info.size), dtype=info.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({**tensors, **moments}, checkpoint_id=str(p), no_dist=True)
    optimizer = {k.removeprefix(STATE): v for k, v in moments.items()} or None
    return Checkpoint(spec, tensors, train, optimizer)


def load_into(model: nn.Module, path: str | os.PathLike[str]) -> None:
    """Fill a parallelized (or plain) model from a distributed checkpoint of any layout (a collective); each
    rank reads its shards, and a packed projection whole, one at a time, keeping its rows."""
    from .materialize import copy_into_shard

    sd = get_model_state_dict(model)
    packed = _packed(model)
    for name in packed:
        sd.pop(name)
    dcp.load(sd, checkpoint_id=str(path))
    set_model_state_dict(model, sd, options=StateDictOptions(strict=False))
    with torch.no_grad():
        for name, order in packed.items():
            param = model.get_parameter(name)
            whole = {name: torch.empty(tuple(param.shape), dtype=param.dtype)}
            dcp.load(whole, checkpoint_id=str(path))
            copy_into_shard(param, whole[name], order)


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, path: str | os.PathLike[str]) -> bool:
    """Fill ``optimizer`` (of a parallelized model) from a distributed checkpoint of any layout (a collective);
    False when the folder holds no optimizer state."""
    from .materialize import copy_into_shard

    if not has_optimizer(path):
        return False
    osd = get_optimizer_state_dict(model, optimizer)  # moments allocated (zeros) as the parameters are split
    packed = {name: order for name, order in _packed(model).items() if name in osd["state"]}
    split = {name: osd["state"][name] for name in packed}
    osd["state"].update({name: {k: _empty_whole(v) for k, v in slots.items()} for name, slots in split.items()})
    dcp.load({OPTIM: osd}, checkpoint_id=str(path))
    for name, order in packed.items():
        for slot, value in split[name].items():
            if torch.is_tensor(value) and value.dim():
                copy_into_shard(value, osd["state"][name][slot], order)
                osd["state"][name][slot] = value
    set_optimizer_state_dict(model, optimizer, osd)
    return True


def _empty_whole(value: Any) -> Any:
    """An empty whole tensor for a split one (scalars and plain values as they are)."""
    if not torch.is_tensor(value) or not value.dim():
        return value
    return torch.empty(tuple(value.shape), dtype=value.dtype)
