"""Distributed checkpoints of parallelized models, in the single-process layout: a folder of safetensors
shards (``shard-<rank>.safetensors``, each rank its pieces) and ``specc.json`` (the spec, as in a specc
safetensors checkpoint, the training state, and the index of every tensor's pieces: ``specc.parallel.shards``).
``torch.distributed.checkpoint`` plans which rank writes and reads what; nothing in the folder is pickled, and
everything in it is checked as data before a tensor is read. Packed projections, held rank-major under tensor
parallelism (``specc.parallel.tensor``), are written in their ``[q | k | v]`` order (the model's state dict
gives them so, ``specc.parallel.packed``; the optimizer's moments are re-ordered here), so the folder loads into
a single-process model (``load``), into ``specc generate DIR``, or into a parallelized model of any layout
(``load_into``).

A training checkpoint also holds the optimizer's state (``get_optimizer_state_dict``: the Adam moments sharded
as their parameters, the step count) under ``optimizer.``, its settings (``param_groups``) as JSON in
``specc.json``; with the step and seed there (a step's batch and dropout come from them) that is all a run
needs to resume in any layout (``load_optimizer``) or in one process (``load(..., with_optimizer)``).

A folder is written whole into a temporary folder beside its target and swapped in by rename
(``specc.io.replace_folder``). A folder of an older specc (DCP's pickled ``.metadata`` and ``*.distcp``)
is refused unless the caller trusts it (``trust_pickle``: reading it runs whatever its pickle says).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass
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

from ..checkpoint_format import TRAIN_KEY, Checkpoint, check_train_state
from ..errors import SpecError
from ..io import discard_stage, folder_stage, outputs_complete, read, replace_folder, signals_raise, write_error
from ..io.signals import signals_blocked
from ..spec.serialize import SPEC_KEY, spec_json
from ..version import __version__
from . import shards

META_FILE = "specc.json"
INDEX_KEY = "specc.shards"  # the index of the tensors' pieces (``specc.parallel.shards``)
GROUPS_KEY = "specc.optimizer.param_groups"  # the optimizer's settings, JSON
OPTIM = "optimizer"  # the optimizer state's keys: optimizer.state.<param>.<slot>
STATE = f"{OPTIM}.state."
LEGACY_FILE = ".metadata"  # DCP's pickled index, in folders of specc ≤ 0.1
TRUST_FLAG = "--trust-pickled-checkpoint"


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """A folder that holds a specc distributed checkpoint (this format or an older specc's)."""
    p = Path(path)
    return p.is_dir() and (p / META_FILE).is_file()


def is_legacy(path: str | os.PathLike[str]) -> bool:
    """A folder written by an older specc through DCP's pickle-based ``FileSystemWriter``."""
    p = Path(path)
    return p.is_dir() and (os.path.lexists(p / LEGACY_FILE) or any(p.glob("*.distcp")))


def _tp(model: nn.Module) -> int:
    mesh = getattr(model, "mesh", None)
    names = tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
    return mesh["tp"].size() if "tp" in names else 1


def _packed(model: nn.Module) -> dict[str, torch.Tensor]:
    from .tensor import packed_params

    return packed_params(model.graph, _tp(model))


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor whole, in the single-process layout, on every rank (all ranks must call it)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))  # packed: canonical


def full_optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state whole, as ``<param>.<slot>`` tensors in the single-process layout
    (``specc.train.training_checkpoint``'s sidecar), on every rank (all ranks must call it)."""
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
    last: bool = False,
) -> Path:
    """Write ``model``'s shards (and ``optimizer``'s) from every rank (a collective) into a temporary folder
    beside ``path``, ``specc.json`` from rank 0, then (rank 0) swap the folder in for ``path``. ``last``: the
    command's final output; once it is in place no rank lets a signal turn the run into a failure."""
    packed = _packed(model)
    sd: dict[str, Any] = get_model_state_dict(model)  # packed projections already [q | k | v] (packed.py)
    meta = {SPEC_KEY: spec_json(spec), TRAIN_KEY: train or {}, "specc.version": __version__}
    if optimizer is not None:
        osd = get_optimizer_state_dict(model, optimizer)
        for name, slots in osd["state"].items():
            if name in packed:
                osd["state"][name] = {k: _unpacked(v, packed[name]) for k, v in slots.items()}
        sd[OPTIM] = {"state": osd["state"]}  # tensors only: the settings go into specc.json as JSON
        meta[GROUPS_KEY] = _json_groups(osd["param_groups"])
    path = Path(path)
    lead = not dist.is_initialized() or dist.get_rank() == 0
    stage = _shared_stage(path, lead)
    try:
        with signals_raise():
            writer = shards.ShardWriter(stage)
            try:
                with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
                    warnings.simplefilter("ignore", UserWarning)
                    dcp.save(sd, storage_writer=writer, no_dist=not dist.is_initialized())
            except dcp.api.CheckpointException as e:
                raise _cause(e, path) from None
            if lead:
                assert writer.index is not None
                write_meta(stage, {**meta, INDEX_KEY: writer.index})
            _barrier()
            if lead:
                replace_folder(stage, path, last=last)
    except BaseException:
        if lead:
            with signals_blocked():  # a second signal (torchrun's SIGTERM after Ctrl-C) waits for the removal
                discard_stage(stage)
        raise
    if last and not lead:  # held back until rank 0 has swapped the folder in, then ignored
        with signals_blocked():
            _barrier()
            outputs_complete()
    else:
        _barrier()
    return path


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """``specc.json`` into the (temporary) folder; the folder as a whole is what gets swapped in."""
    try:
        (folder / META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    except OSError as e:
        err = write_error(folder / META_FILE, e)
        if err is None:
            raise
        raise err from None


def _shared_stage(path: Path, lead: bool) -> Path:
    """Rank 0's temporary folder beside ``path``, known to every rank (which fail with it if it cannot be
    made: rank 0 says why)."""
    several = dist.is_initialized() and dist.get_world_size() > 1
    if not several:
        return folder_stage(path)
    box: list[str | None] = [None]
    failed: BaseException | None = None
    if lead:
        try:
            box = [str(folder_stage(path))]
        except BaseException as e:  # told to the other ranks before it is raised here
            failed = e
    dist.broadcast_object_list(box, src=0)
    if failed is not None:
        raise failed
    if box[0] is None:
        raise SpecError("rank 0 could not create the checkpoint's temporary folder", file=str(path))
    return Path(box[0])


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _cause(e: BaseException, path: Path) -> BaseException:
    """A ``SpecError`` for a write that failed on some rank (disk full, ...), else the failure itself."""
    for exc, _ in getattr(e, "failures", {}).values():
        err = write_error(path, exc)
        return err if err is not None else exc
    return e


def _json_groups(groups: Any) -> list[dict[str, Any]]:
    """The optimizer's settings per parameter group as JSON (numbers, flags, parameter names)."""
    out = []
    for group in groups:
        entry = {}
        for k, v in group.items():
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                v = v.item()
            if isinstance(v, tuple):
                v = list(v)
            json.dumps(v, allow_nan=False)  # a value JSON cannot hold is a bug here, not a pickle
            entry[k] = v
        out.append(entry)
    return out


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Folder:
    """A checked checkpoint folder: its ``specc.json``, and each tensor's global shape and dtype."""

    path: Path
    meta: dict[str, Any]
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]]
    stored: dict[str, shards.Stored] | None  # None: an older specc's folder, read through DCP's pickle

    def reader(self) -> Any:
        if self.stored is None:
            return dcp.FileSystemReader(str(self.path))
        return shards.ShardReader(self.path, self.stored)

    def read(self, state: dict[str, Any], no_dist: bool = False) -> None:
        """Fill ``state`` (tensors by flattened name, in any layout) from the folder."""
        try:
            dcp.load(state, storage_reader=self.reader(), no_dist=no_dist)
        except dcp.api.CheckpointException as e:
            for exc, _ in e.failures.values():
                if isinstance(exc, SpecError) or not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: as they are
                    raise exc from None
            raise SpecError(f"cannot read the checkpoint: {_first_line(e)}", file=str(self.path)) from None


def _first_line(e: BaseException) -> str:
    for exc, _ in getattr(e, "failures", {}).values():
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return str(e).splitlines()[0]


def open_folder(path: str | os.PathLike[str] | Folder, trust_pickle: bool = False) -> Folder:
    """A checkpoint folder checked as data: ``specc.json``, the index, every shard's header. A folder of an
    older specc is refused unless ``trust_pickle``."""
    if isinstance(path, Folder):
        return path
    p = Path(path)
    if not p.is_dir():
        raise SpecError("not a specc distributed checkpoint folder", file=str(p))
    legacy = is_legacy(p)
    if legacy and not trust_pickle:
        raise SpecError(
            "written by an older specc in torch.distributed.checkpoint's pickle format: reading it could run "
            "code planted in its .metadata",
            file=str(p / LEGACY_FILE),
            hint=f"if you wrote this folder yourself, {TRUST_FLAG} reads it (and resaves it in the data-only "
            "format with -o); never for a folder from elsewhere",
        )
    if not (p / META_FILE).exists():
        raise SpecError(
            f"not a specc distributed checkpoint (no {META_FILE})",
            file=str(p),
            hint="checkpoint folders come from specc train --parallel ... -o DIR",
        )
    meta = _meta(p)
    if legacy:  # trusted: the pickle runs here
        try:
            md = dcp.FileSystemReader(str(p)).read_metadata()
        except Exception as e:  # whatever a damaged pickle raises
            what = f"cannot read it: {type(e).__name__}: {e}".splitlines()[0]
            raise SpecError(what, file=str(p / LEGACY_FILE)) from None
        if not isinstance(md, dcp.Metadata):
            raise SpecError("not torch.distributed.checkpoint metadata", file=str(p / LEGACY_FILE))
        entries = md.state_dict_metadata.items()
        tensors = {k: (tuple(v.size), v.properties.dtype) for k, v in entries if hasattr(v, "size")}
        return Folder(p, meta, tensors, None)
    stored = shards.read_index(p, meta.get(INDEX_KEY), str(p / META_FILE))
    tensors = {k: (s.shape, s.torch_dtype) for k, s in stored.items()}
    return Folder(p, meta, tensors, stored)


def _meta(path: Path) -> dict[str, Any]:
    file = str(path / META_FILE)
    data, _ = read.read_json(path / META_FILE, "a specc checkpoint's specc.json")
    meta = read.json_object(data, file, "specc.json")
    if not isinstance(meta.get(SPEC_KEY), str):
        raise SpecError(f"no spec under {SPEC_KEY!r}", file=file, hint="checkpoints come from specc train --parallel")
    return meta


def has_optimizer(path: str | os.PathLike[str] | Folder, trust_pickle: bool = False) -> bool:
    return any(key.startswith(STATE) for key in open_folder(path, trust_pickle).tensors)


def load(
    path: str | os.PathLike[str] | Folder,
    with_optimizer: bool = False,
    weights: bool = True,
    trust_pickle: bool = False,
) -> Any:
    """A distributed checkpoint read whole into one process: a ``specc.checkpoint_format.Checkpoint``, with the
    optimizer's tensors as ``<param>.<slot>`` (``with_optimizer``; None when the folder holds none), or with
    no tensors at all (``weights=False``: its spec and training state, checked)."""
    from ..ir.lower import lower
    from ..spec.loader import load_embedded_spec

    folder = open_folder(path, trust_pickle)
    p, meta, stored = folder.path, folder.meta, folder.tensors
    spec = load_embedded_spec(meta[SPEC_KEY], str(p / META_FILE), SPEC_KEY)
    train = check_train_state(json.dumps(meta.get(TRAIN_KEY, {})), str(p / META_FILE))
    want = lower(spec).params()
    names = {k for k in stored if not k.startswith(f"{OPTIM}.")}
    if names != set(want):
        extra = sorted(names ^ set(want))
        raise SpecError(f"the checkpoint's tensors do not match its spec: {extra[:4]}", file=str(p))
    for name, spec_p in want.items():
        if tuple(stored[name][0]) != tuple(spec_p.shape):
            size = list(stored[name][0])
            raise SpecError(f"{name} has shape {size}; the spec needs {list(spec_p.shape)}", file=str(p))
    if not weights:  # checked, nothing allocated: a model larger than this process reads its shards elsewhere
        return Checkpoint(spec, {}, train, None)
    tensors = {name: torch.empty(stored[name][0], dtype=stored[name][1]) for name in want}
    moments = {}
    if with_optimizer:  # optimizer.state.<param>.<slot> → <param>.<slot>, as the safetensors sidecar names them
        for key, (shape, dtype) in stored.items():
            if key.startswith(STATE):
                moments[key] = torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        folder.read({**tensors, **moments}, no_dist=True)
    optimizer = {k.removeprefix(STATE): v for k, v in moments.items()} or None
    return Checkpoint(spec, tensors, train, optimizer)


def load_into(model: nn.Module, path: str | os.PathLike[str] | Folder, trust_pickle: bool = False) -> None:
    """Fill a parallelized (or plain) model from a distributed checkpoint of any layout (a collective); each
    rank reads its shards (a packed projection's in the single-process layout, put rank-major as it loads:
    ``specc.parallel.packed``)."""
    folder = open_folder(path, trust_pickle)
    sd = get_model_state_dict(model)
    folder.read(sd)
    set_model_state_dict(model, sd)


def load_optimizer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    path: str | os.PathLike[str] | Folder,
    trust_pickle: bool = False,
) -> bool:
    """Fill ``optimizer`` (of a parallelized model) from a distributed checkpoint of any layout (a collective);
    False when the folder holds no optimizer state."""
    from .materialize import copy_into_shard

    folder = open_folder(path, trust_pickle)
    if not has_optimizer(folder):
        return False
    osd = get_optimizer_state_dict(model, optimizer)  # moments allocated (zeros) as the parameters are split
    packed = {name: order for name, order in _packed(model).items() if name in osd["state"]}
    split = {name: osd["state"][name] for name in packed}
    osd["state"].update({name: {k: _empty_whole(v) for k, v in slots.items()} for name, slots in split.items()})
    if folder.stored is None:  # an older specc's folder: its settings are in the pickle too
        folder.read({OPTIM: osd})
    else:
        _check_state_names(folder, osd["state"], part=getattr(model, "pipeline", None) is not None)
        folder.read({OPTIM: {"state": osd["state"]}})
        osd["param_groups"] = _groups_from_json(folder, osd["param_groups"])
    for name, order in packed.items():
        for slot, value in split[name].items():
            if torch.is_tensor(value) and value.dim():
                copy_into_shard(value, osd["state"][name][slot], order)
                osd["state"][name][slot] = value
    set_optimizer_state_dict(model, optimizer, osd)
    return True


def _check_state_names(folder: Folder, state: dict[str, dict[str, Any]], part: bool = False) -> None:
    """The folder holds exactly the moments this optimizer keeps (DCP would leave a missing one at zero);
    ``part``: this rank holds one pipeline stage's, so the folder holds more."""
    want = {f"{STATE}{name}.{slot}" for name, slots in state.items() for slot, v in slots.items() if torch.is_tensor(v)}
    have = {k for k in folder.tensors if k.startswith(STATE)}
    if (want - have) if part else (want != have):
        diff = sorted((want - have) if part else (want ^ have))
        raise SpecError(
            f"the checkpoint's optimizer state does not fit this model's optimizer: {diff[:3]}",
            file=str(folder.path / META_FILE),
        )


def _groups_from_json(folder: Folder, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved settings on top of the optimizer's own, key by key where the JSON type matches."""
    file = str(folder.path / META_FILE)
    saved = folder.meta.get(GROUPS_KEY)
    if not isinstance(saved, list) or len(saved) != len(groups) or not all(isinstance(g, dict) for g in saved):
        raise SpecError(f"{GROUPS_KEY}: expected {len(groups)} parameter group(s) as objects", file=file)
    out = []
    for mine, theirs in zip(groups, saved, strict=True):
        group = dict(mine)
        for k, v in theirs.items():
            if k == "params" or k not in mine:
                continue
            ours = mine[k]
            ours = list(ours) if isinstance(ours, tuple) else ours
            if type(v) is not type(ours) and not (isinstance(v, (int, float)) and isinstance(ours, (int, float))):
                raise SpecError(f"{GROUPS_KEY}: {k} is {read.json_kind(v)}", file=file)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isfinite(v):
                raise SpecError(f"{GROUPS_KEY}: {k} is not finite", file=file)
            group[k] = tuple(v) if isinstance(mine[k], tuple) else v
        out.append(group)
    return out


def _empty_whole(value: Any) -> Any:
    """An empty whole tensor for a split one (scalars and plain values as they are)."""
    if not torch.is_tensor(value) or not value.dim():
        return value
    return torch.empty(tuple(value.shape), dtype=value.dtype)
