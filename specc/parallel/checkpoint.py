"""Distributed checkpoints (``torch.distributed.checkpoint``) of parallelized models, in the single-process
layout: a folder with DCP's ``.metadata`` and shard files, and ``specc.json`` (the spec, as in a specc
safetensors checkpoint, and the training state). Each rank writes its own shards; packed projections, held
rank-major under tensor parallelism (``specc.parallel.tensor``), are written in their ``[q | k | v]`` order,
so the folder loads into a single-process model (``load``), into ``specc generate DIR``, or into a
parallelized model of any layout (``load_into``).
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
from torch.distributed.tensor import DTensor

from .. import __version__, read
from ..errors import SpecError
from ..io import atomic_write
from ..spec.serialize import SPEC_KEY, spec_json

META_FILE = "specc.json"
TRAIN_KEY = "specc.train"


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


def save(model: nn.Module, path: str | os.PathLike[str], spec: Any, train: dict[str, Any] | None = None) -> Path:
    """Write ``model``'s shards from every rank (a collective) and, from rank 0, ``specc.json``."""
    sd = get_model_state_dict(model)
    for name, order in _packed(model).items():
        whole = sd[name].full_tensor() if isinstance(sd[name], DTensor) else sd[name]
        sd[name] = whole[torch.argsort(order)]  # the same plain tensor on every rank: DCP writes it once
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


def load(path: str | os.PathLike[str]) -> Any:
    """A distributed checkpoint read whole into one process: a ``specc.train.checkpoint.Checkpoint``."""
    from ..ir.lower import lower
    from ..spec.loader import load_embedded_spec
    from ..train.checkpoint import Checkpoint, check_train_state

    p = Path(path)
    if not is_checkpoint(p):
        raise SpecError("not a specc distributed checkpoint (a folder with .metadata and specc.json)", file=str(p))
    meta = _meta(p)
    spec = load_embedded_spec(meta[SPEC_KEY], str(p / META_FILE), SPEC_KEY)
    train = check_train_state(json.dumps(meta.get(TRAIN_KEY, {})), str(p / META_FILE))
    stored = dcp.FileSystemReader(str(p)).read_metadata().state_dict_metadata
    want = lower(spec).params()
    if set(stored) != set(want):
        extra = sorted(set(stored) ^ set(want))
        raise SpecError(f"the checkpoint's tensors do not match its spec: {extra[:4]}", file=str(p))
    weights = {}
    for name, spec_p in want.items():
        info = stored[name]
        if tuple(info.size) != tuple(spec_p.shape):
            raise SpecError(f"{name} has shape {list(info.size)}; the spec needs {list(spec_p.shape)}", file=str(p))
        weights[name] = torch.empty(tuple(info.size), dtype=info.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(weights, checkpoint_id=str(p), no_dist=True)
    return Checkpoint(spec, weights, train, None)


def load_into(model: nn.Module, path: str | os.PathLike[str]) -> None:
    """Fill a parallelized (or plain) model from a distributed checkpoint of any layout (a collective)."""
    sd = get_model_state_dict(model)
    packed = _packed(model)
    for name in packed:
        sd[name] = torch.empty(tuple(sd[name].shape), dtype=sd[name].dtype)  # read whole, re-packed below
    dcp.load(sd, checkpoint_id=str(path))
    full = {name: sd.pop(name)[order] for name, order in packed.items()}
    set_model_state_dict(model, sd, options=StateDictOptions(strict=False))
    if full:
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, strict=False))
