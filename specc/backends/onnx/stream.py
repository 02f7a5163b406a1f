"""Writing exported graphs with their weights streamed in: each parameter comes from its source, goes through
its recipes (cast, concatenation, quantization; recipes.py) a bounded chunk at a time, is written to the output
and let go. Neither the graph (placeholders only) nor anything else ever holds all the weights.

Layout: a model whose tensors pass ``save.PROTO_LIMIT`` keeps them in an external data file (each tensor of
1 MiB or more starts at a multiple of the page size, as onnx's own writer aligns them, so onnxruntime can map
it); a smaller one holds them inline, written straight into the protobuf: the graph is serialised first, then
each weight is appended as one more ``graph`` field holding one initializer (protobuf merges repeated
occurrences of an embedded message, so readers see one graph with every initializer).

Checking: before anything is written, every graph is checked with the full checker, its weight placeholders
standing in as graph inputs of the same type and shape (the checker would read data it is given; these
graphs have none). A model with external data is checked again from the staged file, which the checker reads
without its data.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import helper

from ...io import atomic_files
from . import save as _save
from .builder import PENDING, LazyModel
from .recipes import Out, Param, Recipe
from .sources import WeightSource

ALIGN = mmap.ALLOCATIONGRANULARITY
ALIGN_FROM = 1 << 20  # tensors of at least this many bytes start aligned (onnx's writer does the same)


# ---------------------------------------------------------------------------------------------- sinks


class Sink:
    """Receives the weights of one model, each tensor's bytes in order (``begin``, ``write`` ..., ``end``)."""

    def begin(self, out: Out) -> None:
        raise NotImplementedError

    def write(self, chunk: np.ndarray) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Everything received: complete the model file."""


def _bytes(chunk: np.ndarray) -> memoryview:
    a = np.ascontiguousarray(chunk)
    if sys.byteorder != "little" and a.dtype.itemsize > 1:
        a = a.byteswap()
    return memoryview(a.reshape(-1).view(np.uint8))


@dataclass
class _Counting(Sink):
    current: Out | None = None
    written: int = 0

    def _start(self, out: Out) -> None:
        assert self.current is None, f"{out.name} begun inside {self.current}"
        self.current, self.written = out, 0

    def _count(self, n: int) -> None:
        self.written += n

    def _stop(self) -> Out:
        out = self.current
        assert out is not None and self.written == out.nbytes, f"{out}: {self.written} bytes written"
        self.current = None
        return out


@dataclass(kw_only=True)
class _FileSink(_Counting):
    """A sink that streams each chunk's bytes into one open file as they arrive."""

    _file: BinaryIO | None = None

    def write(self, chunk: np.ndarray) -> None:
        assert self._file is not None
        view = _bytes(chunk)
        self._file.write(view)
        self._count(view.nbytes)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


@dataclass(kw_only=True)
class ExternalSink(_FileSink):
    """Tensors into ``data`` (the staged file named ``location`` beside the model), the model proto last."""

    model: onnx.ModelProto
    path: Path
    data: Path
    location: str
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    _start_at: int = 0

    def __post_init__(self) -> None:
        self._file = open(self.data, "wb")  # noqa: SIM115  (closed by finish / close)

    def begin(self, out: Out) -> None:
        self._start(out)
        assert self._file is not None
        at = self._file.tell()
        if out.nbytes >= ALIGN_FROM and at % ALIGN:
            self._file.write(b"\0" * (ALIGN - at % ALIGN))
        self._start_at = self._file.tell()

    def end(self) -> None:
        out = self._stop()
        self.spans[out.name] = (self._start_at, out.nbytes)

    def finish(self) -> None:
        for t in self.model.graph.initializer:  # constants of 1 KiB or more go to the data file too
            if not _pending(t) and t.name not in self.spans and len(t.raw_data) >= 1024:
                self.begin(Out(t.name, np.uint8, (len(t.raw_data),)))
                self.write(np.frombuffer(t.raw_data, np.uint8))
                self.end()
                t.ClearField("raw_data")
        self.close()
        for t in self.model.graph.initializer:
            if t.name in self.spans:
                offset, length = self.spans[t.name]
                t.data_location = onnx.TensorProto.EXTERNAL
                del t.external_data[:]
                for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
        pending = [t.name for t in self.model.graph.initializer if _pending(t)]
        assert not pending, f"weights never written: {pending[:4]}"
        self.path.write_bytes(self.model.SerializeToString())


@dataclass(kw_only=True)
class InlineSink(_FileSink):
    """The model proto without its weights first, then each weight as one more ``graph`` field (see above)."""

    model: onnx.ModelProto
    path: Path

    def __post_init__(self) -> None:
        graph = self.model.graph
        keep = [t for t in graph.initializer if not _pending(t)]
        shell = onnx.ModelProto()
        shell.CopyFrom(self.model)
        del shell.graph.initializer[:]
        shell.graph.initializer.extend(keep)
        self._file = open(self.path, "wb")  # noqa: SIM115  (closed by finish / close)
        self._file.write(shell.SerializeToString())

    def begin(self, out: Out) -> None:
        self._start(out)
        t = onnx.TensorProto()
        t.name = out.name
        t.data_type = helper.np_dtype_to_tensor_dtype(np.dtype(out.dtype))
        t.dims.extend(out.shape)
        head = t.SerializeToString() + _tag(9) + _varint(out.nbytes)  # TensorProto.raw_data = 9
        tensor_len = len(head) + out.nbytes
        initializer = _tag(5) + _varint(tensor_len)  # GraphProto.initializer = 5
        assert self._file is not None
        self._file.write(_tag(7) + _varint(len(initializer) + tensor_len) + initializer + head)  # ModelProto.graph

    def end(self) -> None:
        self._stop()

    def finish(self) -> None:
        self.close()


@dataclass(kw_only=True)
class MemorySink(_Counting):
    """Weights into the model itself (``raw_data``): for the whole-model quantizer (quantize.py, dynamic)."""

    model: onnx.ModelProto
    parts: list[bytes] = field(default_factory=list)
    data: dict[str, bytes] = field(default_factory=dict)

    def begin(self, out: Out) -> None:
        self._start(out)
        self.parts = []

    def write(self, chunk: np.ndarray) -> None:
        view = _bytes(chunk)
        self.parts.append(view.tobytes())
        self._count(view.nbytes)

    def end(self) -> None:
        self.data[self._stop().name] = b"".join(self.parts)
        self.parts = []

    def finish(self) -> None:
        for t in self.model.graph.initializer:
            if t.name in self.data:
                del t.external_data[:]
                t.data_location = onnx.TensorProto.DEFAULT
                t.raw_data = self.data.pop(t.name)


def _tag(field_number: int) -> bytes:
    return _varint(field_number << 3 | 2)  # wire type 2: length-delimited


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _pending(t: onnx.TensorProto) -> bool:
    return any(e.key == "location" and e.value == PENDING for e in t.external_data)


# ---------------------------------------------------------------------------------------------- the stream


def fixed_mmap_threshold() -> None:
    """Have glibc serve allocations of 1 MiB or more by mmap, and so return them when freed. Its default
    threshold slides up to 32 MiB after the first large free, after which the chunks of a stream (tens of MiB,
    each freed right away) come from the heap and fragment it: measured, 2-3x the working set stays resident.
    Process-wide and permanent (mallopt has no getter); a no-op off glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def run(source: WeightSource, jobs: list[tuple[LazyModel, Sink]]) -> None:
    """Feed every parameter from ``source`` through the recipes of each model into its sink. A recipe runs as
    soon as the last parameter it reads has arrived; a parameter is let go once every recipe reading it ran."""
    tasks: list[tuple[Recipe, Sink]] = []
    for lazy, sink in jobs:
        used = {t.name for t in lazy.model.graph.initializer if _pending(t)}
        seen: set[int] = set()
        for name, recipe in lazy.recipes.items():
            if name in used and id(recipe) not in seen:
                seen.add(id(recipe))
                tasks.append((recipe, sink))
    if not tasks:
        return
    if sys.platform.startswith("linux"):
        fixed_mmap_threshold()
    waiting = {i: set(r.params) for i, (r, _) in enumerate(tasks)}
    readers: dict[str, list[int]] = {}
    for i, (r, _) in enumerate(tasks):
        for p in set(r.params):
            readers.setdefault(p, []).append(i)
    left = {p: len(ids) for p, ids in readers.items()}
    held: dict[str, Param] = {}

    def feed(name: str, handle: Param) -> None:
        if name not in readers:
            return
        held[name] = handle
        for i in readers[name]:
            waiting[i].discard(name)
            if waiting[i]:
                continue
            recipe, sink = tasks[i]
            _produce(recipe, sink, held)
            for p in set(recipe.params):
                left[p] -= 1
                if not left[p]:
                    del held[p]

    source.feed(feed)
    missing = sorted({p for ps in waiting.values() for p in ps})
    assert not missing, f"the weight source never gave {missing[:4]}"


def _produce(recipe: Recipe, sink: Sink, held: dict[str, Param]) -> None:
    current = -1
    for index, chunk in recipe.produce(held.__getitem__):
        if index != current:
            if current >= 0:
                sink.end()
            sink.begin(recipe.outs[index])
            current = index
        sink.write(chunk)
    sink.end()


def materialize(lazy: LazyModel, source: WeightSource) -> onnx.ModelProto:
    """The model with every weight in it (for tools that need the whole model in memory)."""
    sink = MemorySink(model=lazy.model)
    run(source, [(lazy, sink)])
    sink.finish()
    return lazy.model


# ---------------------------------------------------------------------------------------------- files


def weight_bytes(lazy: LazyModel) -> int:
    """Bytes of every tensor the model will hold (constants and weights)."""
    total = 0
    for t in lazy.model.graph.initializer:
        if _pending(t):
            total += next(o.nbytes for o in lazy.recipes[t.name].outs if o.name == t.name)
        else:
            total += len(t.raw_data)
    return total


def weightless(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose weight placeholders are graph inputs of the same type and shape (for the checker)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    pending = [t for t in graph.initializer if _pending(t)]
    keep = [t for t in graph.initializer if not _pending(t)]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in pending)
    return out


def write_models(
    models: list[tuple[LazyModel, Path]], source: WeightSource, check: bool = True, last: bool = False
) -> None:
    """Save ``models`` (each to its path, all in one folder) as one atomic group, their weights streamed from
    ``source``: checked first (weightless), staged, then renamed data files first, the models in the order
    given. Tensors go to an external data file when they pass ``save.PROTO_LIMIT``. ``last``: the command's
    final outputs (a signal once they are in place no longer fails the command)."""
    if check:
        for lazy, _ in models:
            onnx.checker.check_model(weightless(lazy.model), full_check=True)
    plans: list[tuple[LazyModel, Path, str | None]] = []
    for lazy, path in models:
        external = weight_bytes(lazy) >= _save.PROTO_LIMIT
        plans.append((lazy, path, fresh_data_name(path) if external else None))
    data_targets = [path.with_name(data) for _, path, data in plans if data]
    targets = [*data_targets, *(path for _, path, _ in plans)]
    with atomic_files(targets, like=plans[-1][1], last=last) as staged:
        by_target = dict(zip(targets, staged, strict=True))
        sinks: list[Sink] = []
        try:
            for lazy, path, data in plans:
                if data:
                    sinks.append(ExternalSink(model=lazy.model, path=by_target[path],
                                              data=by_target[path.with_name(data)], location=data))  # fmt: skip
                else:
                    sinks.append(InlineSink(model=lazy.model, path=by_target[path]))
            run(source, [(lazy, sink) for (lazy, _, _), sink in zip(plans, sinks, strict=True)])
            for sink in sinks:
                sink.finish()
        finally:
            for sink in sinks:
                with contextlib.suppress(Exception):
                    sink.close()  # type: ignore[attr-defined]
        if check:
            for _, path, data in plans:
                if data:
                    onnx.checker.check_model(str(by_target[path]), full_check=True)
    for _, path, data in plans:
        remove_unused_data(path, keep=data)


def _data_names(path: Path) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(path.name)}(\.[0-9a-f]{{8}})?\.data$")


def fresh_data_name(path: Path) -> str:
    """``<name>.data`` unless a file of that name exists (the data of the model being replaced)."""
    name = f"{path.name}.data"
    while os.path.lexists(path.with_name(name)):
        name = f"{path.name}.{secrets.token_hex(4)}.data"
    return name


def remove_unused_data(path: Path, keep: str | None) -> None:
    """Data files of this model's naming that the model just written does not use (an earlier export's)."""
    pattern = _data_names(path)
    folder = path.parent if str(path.parent) else Path(".")
    for entry in os.scandir(folder):
        if entry.name != keep and pattern.match(entry.name) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
