"""Reading safetensors checkpoints as ``save_pretrained`` writes them: one file, or shards with an index.

specc reads the format itself, through ``specc.io.read``: the 8-byte header length, then a strict JSON header
(duplicate keys, deep nesting and non-finite numbers refused), then exactly the bytes the header describes.
Every tensor's dtype, shape and byte range is checked before any data is read, so a truncated, random or
hostile file is one located error naming the file (and the tensor), never a crash or a read past the limit.
Data is read with ``pread`` from the regular file that was checked (no memory map that a truncation turns into
SIGBUS). A sharded index names its shards by bare file name in its own folder.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..io import read

INDEX = "model.safetensors.index.json"

# safetensors dtype → (bytes per element, torch dtype name)
DTYPES: dict[str, tuple[int, str]] = {
    "F64": (8, "float64"),
    "F32": (4, "float32"),
    "F16": (2, "float16"),
    "BF16": (2, "bfloat16"),
    "F8_E4M3": (1, "float8_e4m3fn"),
    "F8_E5M2": (1, "float8_e5m2"),
    "I64": (8, "int64"),
    "I32": (4, "int32"),
    "I16": (2, "int16"),
    "I8": (1, "int8"),
    "U64": (8, "uint64"),
    "U32": (4, "uint32"),
    "U16": (2, "uint16"),
    "U8": (1, "uint8"),
    "BOOL": (1, "bool"),
}
MAX_RANK = 8


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors name: F32, BF16, I64, ...
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


@dataclass(frozen=True)
class Header:
    path: str
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]


# ---------------------------------------------------------------------------------------------- headers


def read_header(path: str | os.PathLike[str], what: str = "a safetensors file") -> Header:
    """The tensor table and metadata of one .safetensors file, checked against the file's size."""
    name = os.fspath(path)
    with read.open_regular(path, what, missing=f"no such file: {name}") as (f, size):
        return _header(f, size, name, what)


def _header(f: Any, size: int, name: str, what: str) -> Header:
    def bad(message: str) -> SpecError:
        return read.ReadError(
            f"not {what}: {message}",
            file=name,
            hint="safetensors files come from save_file / save_pretrained; this one is damaged or something else",
        )

    if size < 8:
        raise bad(f"{size} bytes, shorter than the 8-byte header length" if size else "the file is empty")
    n = int.from_bytes(read.read_exact(f, 0, 8, name, what), "little")
    if n > read.HEADER_BYTES:
        raise bad(f"its header claims {n:,} bytes (at most {read.size_text(read.HEADER_BYTES)})")
    if 8 + n > size:
        raise bad(f"its header claims {n:,} bytes but the file has {size - 8:,} after the length: truncated")
    raw = bytes(read.read_exact(f, 8, n, name, what))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("its header is not UTF-8 JSON") from None
    if not text.lstrip().startswith("{"):
        raise bad("its header is not a JSON object")
    data = read.parse_json(text, name, "the safetensors header", max_depth=4, located=False)
    data = read.json_object(data, name, "the safetensors header")
    meta = data.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad("__metadata__ must map names to strings")
    for k, v in meta.items():
        if len(v) > read.METADATA_BYTES:
            raise bad(f"metadata {k!r} is {len(v):,} characters (at most {read.size_text(read.METADATA_BYTES)})")
    base, data_len = 8 + n, size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for tname, entry in data.items():
        tensors[tname] = _tensor(tname, entry, base, bad)
    spans = sorted((t.start, t.end, t.name) for t in tensors.values())
    at = base
    for start, end, tname in spans:
        if start != at:
            gap = "overlaps the previous tensor" if start < at else f"leaves {start - at:,} unused bytes before it"
            raise bad(f"tensor {tname!r} {gap}")
        at = end
    if at != base + data_len:
        if at > base + data_len:
            raise bad(f"its tensors need {at - base:,} bytes of data but the file has {data_len:,}: truncated")
        raise bad(f"{base + data_len - at:,} bytes follow the last tensor")
    return Header(name, tensors, dict(meta))


def _tensor(name: str, entry: Any, base: int, bad: Any) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad(f"tensor {name!r} must be an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad(f"tensor {name!r} has unknown dtype {read.json_kind(dtype) if not isinstance(dtype, str) else dtype}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 62 for d in shape)
    ):
        raise bad(f"tensor {name!r} has shape {read.json_kind(shape)}; expected up to {MAX_RANK} sizes ≥ 0")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 1 << 62 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise bad(f"tensor {name!r} has data_offsets {read.json_kind(offsets)}; expected [begin, end], 0 ≤ begin ≤ end")
    need = math.prod(shape) * DTYPES[dtype][0]
    if offsets[1] - offsets[0] != need:
        raise bad(
            f"tensor {name!r} {dtype} {shape} needs {need:,} bytes but data_offsets span {offsets[1] - offsets[0]:,}"
        )
    return TensorInfo(name, dtype, tuple(shape), base + offsets[0], base + offsets[1])


# ---------------------------------------------------------------------------------------------- files


def read_index(path: str | os.PathLike[str]) -> dict[str, Path]:
    """A sharded checkpoint's index: tensor name → the shard file (a bare name in the index's folder)."""
    p = Path(path)
    data, _ = read.read_json(p, "a safetensors index")
    data = read.json_object(data, str(p), "a safetensors index")
    wmap = data.get("weight_map")
    if not isinstance(wmap, dict):
        raise read.ReadError(
            f"the index's weight_map must map tensor names to shard files, not {read.json_kind(wmap)}",
            file=str(p),
            hint='expected {"weight_map": {"tensor.name": "model-00001-of-00002.safetensors", ...}}',
        )
    if not wmap:
        raise read.ReadError("the index's weight_map is empty", file=str(p))
    if "metadata" in data and not isinstance(data["metadata"], (dict, type(None))):
        raise read.ReadError(
            f"the index's metadata must be an object, not {read.json_kind(data['metadata'])}", file=str(p)
        )
    folder = p.parent
    return {k: read.sibling(folder, v, str(p), f"weight_map[{k!r}]") for k, v in wmap.items()}


def files(path: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of a checkpoint file or folder (sharded folders through their index)."""
    return [f for f, _ in _shards(path)]


def _shards(path: str | os.PathLike[str]) -> list[tuple[Path, set[str] | None]]:
    """Each file with the tensor names the index assigns it (None: a lone file, all of its tensors)."""
    p = Path(path)
    if p.name.endswith(".index.json") and not p.is_dir():
        by_file: dict[Path, set[str]] = {}
        for tensor, shard in read_index(p).items():
            by_file.setdefault(shard, set()).add(tensor)
        return sorted(by_file.items())
    if p.is_dir():
        if (p / INDEX).exists():
            return _shards(p / INDEX)
        if (p / "model.safetensors").exists() or (p / "model.safetensors").is_symlink():
            return [(p / "model.safetensors", None)]
        raise SpecError(f"no safetensors weights at {p}", file=str(p), hint="expected model.safetensors or " + INDEX)
    return [(p, None)]


def find(folder: str | os.PathLike[str]) -> Path | None:
    """The checkpoint beside a config.json, if there is one."""
    p = Path(folder)
    p = p.parent if not p.is_dir() else p
    for name in (INDEX, "model.safetensors"):
        if (p / name).exists() or (p / name).is_symlink():
            return p / name
    return None


def headers(path: str | os.PathLike[str]) -> list[tuple[Header, set[str] | None]]:
    """The header of every file of a checkpoint; a shard must hold exactly what the index says."""
    out = []
    seen: dict[str, str] = {}
    for f, names in _shards(path):
        h = read_header(f)
        if names is not None and set(h.tensors) != names:
            missing = sorted(names - set(h.tensors))
            extra = sorted(set(h.tensors) - names)
            detail = f"lacks {missing[0]!r}" if missing else f"holds {extra[0]!r}, which the index puts elsewhere"
            raise read.ReadError(f"shard {f.name} {detail}", file=str(f), hint="the index and its shards disagree")
        for t in h.tensors:
            if t in seen:
                raise read.ReadError(f"tensor {t!r} is in both {seen[t]} and {f.name}", file=str(f))
            seen[t] = f.name
        out.append((h, names))
    return out


def shapes(path: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes from the headers only (no tensor data is read)."""
    return {t.name: t.shape for h, _ in headers(path) for t in h.tensors.values()}


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All tensors of a checkpoint as torch tensors, under their stored names (every dtype as stored)."""
    out: dict[str, Any] = {}
    for h, _ in headers(path):
        out.update(load_file(h.path, h))
    return out


def load_file(path: str | os.PathLike[str], header: Header | None = None) -> dict[str, Any]:
    """The tensors of one .safetensors file, read from the checked regular file."""
    import torch

    name = os.fspath(path)
    out: dict[str, Any] = {}
    with read.open_regular(name, "a safetensors file") as (f, size):
        h = header if header is not None else _header(f, size, name, "a safetensors file")
        for t in h.tensors.values():
            dtype = getattr(torch, DTYPES[t.dtype][1])
            if t.end == t.start:
                out[t.name] = torch.empty(t.shape, dtype=dtype)
                continue
            buf = read.read_exact(f, t.start, t.end - t.start, name, "the safetensors file")
            out[t.name] = torch.frombuffer(buf, dtype=dtype).reshape(t.shape)
    return out
