"""The distributed checkpoint's storage: safetensors shards and a strict JSON index, nothing pickled.

``torch.distributed.checkpoint`` plans a save (which rank writes which piece of which tensor, replicas once)
and a load (which stored pieces cover what each rank holds, in any layout); the storage under it is specc's:

- ``ShardWriter``: each rank writes its pieces into one file, ``shard-<rank>.safetensors`` (tensors under
  their flattened names, one piece per name and file), and the coordinator turns DCP's plan into the index:
  every tensor's dtype and global shape and its pieces (file, offsets, shape). Values that are not tensors are
  refused here (DCP would pickle them): they belong in ``specc.json`` as JSON.
- ``read_index``: the index checked as data before anything is read: bare shard names of that one form, known
  dtypes, pieces inside their tensor that cover it exactly once (so a missing piece is an error, never
  uninitialized memory), and every shard's safetensors header (``specc.interop.safetensors_read``: strict, checked
  against the file's size) holding exactly the pieces the index gives it.
- ``ShardReader``: DCP's reads served from those checked files with ``pread`` (no memory map that a truncated
  file would turn into SIGBUS).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ..errors import SpecError
from ..interop import safetensors_read as st
from ..io import read

FORMAT = "specc-shards/1"
SHARD_NAME = re.compile(r"^shard-[0-9]{5}\.safetensors$")
_DTYPE_NAMES = {getattr(torch, name): code for code, (_, name) in st.DTYPES.items() if hasattr(torch, name)}
MAX_DIMS = st.MAX_RANK


def shard_name(rank: int) -> str:
    return f"shard-{rank:05d}.safetensors"


@dataclass(frozen=True)
class Piece:
    file: str
    offsets: tuple[int, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Stored:
    dtype: str  # safetensors name: F32, BF16, ...
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, st.DTYPES[self.dtype][1])

    @property
    def size(self) -> torch.Size:  # DCP's spelling, for callers that read ``TensorStorageMetadata``
        return torch.Size(self.shape)


# ---------------------------------------------------------------------------------------------- writing


class ShardWriter(StorageWriter):
    """Writes each rank's pieces into ``folder/shard-<rank>.safetensors``; ``index`` (coordinator) after a save."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.index: dict[str, Any] | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.index = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:  # DCP would pickle it
                raise TypeError(f"{item.index.fqn}: only tensors go into shards (other values into specc.json)")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=shard_name(i)) for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        from safetensors.torch import save_file

        name: str = plan.storage_data
        tensors: dict[str, torch.Tensor] = {}
        results = []
        for item in plan.items:
            fqn = item.index.fqn
            if fqn in tensors:
                raise ValueError(f"{fqn}: two pieces of one tensor on one rank")
            data = planner.resolve_data(item)
            assert isinstance(data, torch.Tensor)
            tensors[fqn] = data.detach().to("cpu").contiguous()
            results.append(WriteResult(index=item.index, size_in_bytes=tensors[fqn].nbytes, storage_data=name))
        if tensors:
            save_file(tensors, str(self.folder / name))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        where = {(r.index.fqn, tuple(r.index.offset or ())): r.storage_data for rs in results for r in rs}
        tensors = {}
        for fqn, md in sorted(metadata.state_dict_metadata.items()):
            if not isinstance(md, TensorStorageMetadata):
                raise TypeError(f"{fqn}: only tensors go into shards")
            pieces = [
                {"file": where[(fqn, tuple(c.offsets))], "offsets": list(c.offsets), "shape": list(c.sizes)}
                for c in md.chunks
            ]
            tensors[fqn] = {"dtype": _DTYPE_NAMES[md.properties.dtype], "shape": list(md.size), "pieces": pieces}
        self.index = {"format": FORMAT, "tensors": tensors}

    def storage_meta(self) -> None:
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True


# ---------------------------------------------------------------------------------------------- the index


def read_index(folder: Path, index: Any, file: str) -> dict[str, Stored]:
    """The tensors an index (from ``file``, the folder's ``specc.json``) describes, each checked whole, and
    every shard's header checked against it."""

    def bad(message: str) -> SpecError:
        return read.ReadError(f"the checkpoint index: {message}", file=file, hint="the folder is damaged")

    if not isinstance(index, dict) or set(index) != {"format", "tensors"}:
        raise bad("expected an object with format and tensors")
    if index["format"] != FORMAT:
        raise bad(f"unknown format {read.json_kind(index['format'])}; this specc reads {FORMAT}")
    entries = index["tensors"]
    if not isinstance(entries, dict) or not entries:
        raise bad("it lists no tensors")
    stored: dict[str, Stored] = {}
    by_file: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    for name, entry in entries.items():
        stored[name] = _entry(name, entry, bad)
        for p in stored[name].pieces:
            by_file.setdefault(p.file, {})[name] = (stored[name].dtype, p.shape)
    for fname, want in sorted(by_file.items()):
        path = read.sibling(folder, fname, file, "the checkpoint index")
        header = st.read_header(path, "a checkpoint shard")
        got = {t.name: (t.dtype, t.shape) for t in header.tensors.values()}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))
            raise read.ReadError(
                f"the shard does not hold what the index says: {diff[0][0]!r}"
                + (f" and {len(diff) - 1} more" if len(diff) > 1 else ""),
                file=str(path),
                hint="the folder is damaged or mixes files of two checkpoints",
            )
    return stored


def _entry(name: str, entry: Any, bad: Any) -> Stored:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "pieces"}:
        raise bad(f"{name!r} must be an object with dtype, shape and pieces")
    dtype, shape, pieces = entry["dtype"], _dims(entry["shape"]), entry["pieces"]
    if not isinstance(dtype, str) or dtype not in st.DTYPES:
        raise bad(f"{name!r} has unknown dtype {read.json_kind(dtype)}")
    if shape is None:
        raise bad(f"{name!r} has shape {read.json_kind(entry['shape'])}; expected up to {MAX_DIMS} sizes ≥ 0")
    if not isinstance(pieces, list) or not pieces:
        raise bad(f"{name!r} has no pieces")
    out = []
    for p in pieces:
        if not isinstance(p, dict) or set(p) != {"file", "offsets", "shape"}:
            raise bad(f"a piece of {name!r} must be an object with file, offsets and shape")
        offsets, size = _dims(p["offsets"]), _dims(p["shape"])
        if not isinstance(p["file"], str) or not SHARD_NAME.match(p["file"]):
            raise bad(f"a piece of {name!r} names {read.json_kind(p['file'])}, not a shard-NNNNN.safetensors file")
        if offsets is None or size is None or len(offsets) != len(shape) or len(size) != len(shape):
            raise bad(f"a piece of {name!r} has offsets or shape that do not fit its {len(shape)} dimensions")
        if any(o + s > d for o, s, d in zip(offsets, size, shape, strict=True)):
            raise bad(f"a piece of {name!r} reaches past its shape {list(shape)}")
        out.append(Piece(p["file"], offsets, size))
    for i, a in enumerate(out):
        for b in out[:i]:
            spans = zip(a.offsets, a.shape, b.offsets, b.shape, strict=True)
            if all(ao < bo + bn and bo < ao + an for ao, an, bo, bn in spans):
                raise bad(f"two pieces of {name!r} overlap")
    if sum(math.prod(p.shape) for p in out) != math.prod(shape):
        raise bad(f"the pieces of {name!r} do not cover it: a shard is missing")
    return Stored(dtype, shape, tuple(out))


def _dims(value: Any) -> tuple[int, ...] | None:
    if (
        isinstance(value, list)
        and len(value) <= MAX_DIMS
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 62 for d in value)
    ):
        return tuple(value)
    return None


# ---------------------------------------------------------------------------------------------- reading


class ShardReader(StorageReader):
    """DCP's reads from the shards of a checked index (``read_index``)."""

    def __init__(self, folder: str | os.PathLike[str], stored: dict[str, Stored]) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.stored = stored

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        tensors: dict[str, Any] = {}
        storage: dict[MetadataIndex, Any] = {}
        for name, s in self.stored.items():
            chunks = [ChunkStorageMetadata(torch.Size(p.offsets), torch.Size(p.shape)) for p in s.pieces]
            tensors[name] = TensorStorageMetadata(TensorProperties(dtype=s.torch_dtype), s.size, chunks)
            for p in s.pieces:
                storage[MetadataIndex(name, torch.Size(p.offsets))] = p.file
        return Metadata(state_dict_metadata=tensors, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[Any]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index], []).append(item)
        for fname, items in per_file.items():
            path = self.folder / fname
            header = st.read_header(path, "a checkpoint shard")
            pieces: dict[str, torch.Tensor] = {}  # a piece that several requests cut from is read once
            with read.open_regular(path, "a checkpoint shard") as (f, _):
                for item in items:
                    fqn = item.storage_index.fqn
                    t, dtype = header.tensors[fqn], self.stored[fqn].torch_dtype
                    target = planner.resolve_tensor(item).detach()
                    whole = tuple(item.storage_offsets) == (0,) * len(t.shape) and tuple(item.lengths) == t.shape
                    if whole and fqn not in pieces and target.is_contiguous() and target.dtype == dtype:
                        _read_piece(f, t, target, path)  # straight into its place: no copy
                    else:
                        if fqn not in pieces:
                            pieces[fqn] = _read_piece(f, t, torch.empty(t.shape, dtype=dtype), path)
                        box = tuple(slice(o, o + n) for o, n in zip(item.storage_offsets, item.lengths, strict=True))
                        target.copy_(pieces[fqn][box])
                    planner.commit_tensor(item, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True


def _read_piece(f: Any, t: st.TensorInfo, into: torch.Tensor, path: Path) -> torch.Tensor:
    """The bytes of stored tensor ``t`` into the contiguous tensor ``into``, checked finite."""
    if t.dtype != _DTYPE_NAMES.get(into.dtype) or t.end - t.start != into.nbytes:
        raise read.ReadError(
            f"tensor {t.name!r} changed since the folder was checked", file=str(path), hint="the folder is damaged"
        )
    if into.numel():
        raw = memoryview(into.reshape(-1).view(torch.uint8).numpy())
        read.read_into(f, t.start, raw, str(path), "the checkpoint shard")
    if not _finite(into):
        raise read.ReadError(
            f"tensor {t.name!r} holds NaN or infinite values",
            file=str(path),
            hint="the folder is damaged; specc never writes non-finite tensors",
        )
    return into


def _finite(t: torch.Tensor) -> bool:
    """No NaN or infinity in a float tensor: its minimum and maximum (which NaN reaches) are finite; one pass."""
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64) or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return math.isfinite(float(lo)) and math.isfinite(float(hi))
