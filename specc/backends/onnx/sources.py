"""Where an export's parameters come from, one tensor (or a piece of one) at a time.

- A safetensors file, a sharded index or a save_pretrained folder (specc names, a ``specc compile --target
  torch`` checkpoint, or a known Hugging Face family's names): the headers are checked up front (names, shapes,
  dtypes, tied tensors), then each parameter is a handle that reads only the rows asked for, by ``pread`` from
  the checked regular file (``specc.io.read``; no memory map that a truncated file turns into SIGBUS), and refuses
  NaN / infinite values as it reads them. A Hugging Face tensor maps to a parameter by the family's plan: copies,
  row slices, concatenations and stacks along axis 0 stay row by row; other transforms (transposes, regrouped
  rows, Marian's interleave) build that one parameter whole.
- The seeded initialisation: the torch backend's own ``init_weights`` draws every parameter, in its order, from
  one generator (so both backends hold the same values); each is handed on as it is drawn and dropped after.
- A dict of tensors (the Python API): the torch backend's loader checks and renames them.

Every source hands its parameters to ``feed(name, handle)`` in its own order; ``stream.py`` runs the recipes
that read them and lets go of each handle once nothing more needs it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from ...errors import SpecError
from ...interop import safetensors_read as checkpoint
from ...interop import tensor_ops
from ...interop import weight_map as plans
from ...interop.names import hf_family
from ...interop.safetensors_read import TensorInfo
from ...io import read
from ...ir.graph import LayerGraph
from .recipes import CHUNK_BYTES, Param

Feed = Callable[[str, Param], None]
NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
WHOLE = object()  # cache key of a parameter built whole


@dataclass
class ArrayParam:
    """A parameter held in memory."""

    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> Any:
        return self.array.dtype

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.array[start:stop] if self.array.ndim else self.array


@dataclass
class FileParam:
    """One tensor of a safetensors file, read rows at a time."""

    path: str
    info: TensorInfo

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def dtype(self) -> Any:
        return NUMPY[self.info.dtype]

    def rows(self, start: int, stop: int) -> np.ndarray:
        out = _read(self, start, stop)
        if not _finite(out):
            _refuse_nonfinite(self)
        return out


def _read(p: FileParam, start: int, stop: int) -> np.ndarray:
    shape = p.info.shape
    if not shape:
        start, stop = 0, 1
    row = math.prod(shape[1:]) * np.dtype(p.dtype).itemsize
    if stop <= start:
        return np.empty((0, *shape[1:]), p.dtype)
    with read.open_regular(p.path, "a safetensors file") as (f, _):
        buf = _pread(f, p.info.start + start * row, (stop - start) * row, p.path)
    return buf.view(p.dtype).reshape((stop - start, *shape[1:]) if shape else ())


def _pread(f: Any, offset: int, count: int, name: str) -> np.ndarray:
    """``count`` bytes at ``offset`` into a fresh uninitialised array (``read.read_exact`` zero-fills a
    bytearray first: a second pass over every byte of the model); a file that ends sooner is truncated."""
    buf = np.empty(count, np.uint8)
    view, done = memoryview(buf), 0
    while done < count:
        try:
            n = os.preadv(f.fileno(), [view[done:]], offset + done)
        except OSError as e:
            raise read.ReadError(f"cannot read {name}: {e.strerror}", file=name) from None
        if n == 0:
            raise read.ReadError(
                f"the safetensors file is truncated: it ends at byte {offset + done:,}, {count - done:,} bytes early",
                file=name,
            )
        done += n
    return buf


def _finite(a: np.ndarray) -> bool:
    """No NaN / infinity, judged on the bits for 16-bit floats (all-ones exponent), so nothing is widened. fp32:
    a finite sum (one pass, no temporary) proves it; an infinite one (NaN, inf, or an overflow) is looked at
    value by value."""
    if a.dtype == np.float32:
        return bool(np.isfinite(np.add.reduce(a.reshape(-1)))) or bool(np.isfinite(a).all())
    mask = 0x7C00 if a.dtype == np.float16 else 0x7F80
    return not bool(((a.view(np.uint16) & mask) == mask).any())


def _refuse_nonfinite(p: FileParam) -> None:
    """The torch loader's message (``check_finite``), counted over the whole tensor."""
    import torch

    from ..torch.weights import check_finite

    whole = _read(p, 0, p.shape[0] if p.shape else 1).astype(np.float32)
    check_finite({p.info.name: torch.from_numpy(whole)}, p.path)


@dataclass
class BuiltParam:
    """A parameter a Hugging Face plan builds from checkpoint tensors (``rule``), then ``after`` (or None)."""

    rule: plans.Rule
    sources: list[FileParam]
    shape: tuple[int, ...]
    after: tuple[Any, ...] | None = None
    _whole: dict[Any, np.ndarray] = field(default_factory=dict)

    @property
    def dtype(self) -> Any:
        kinds = {np.dtype(s.dtype) for s in self.sources}
        return kinds.pop() if len(kinds) == 1 else np.dtype(np.float32)

    def rows(self, start: int, stop: int) -> np.ndarray:
        op = self.rule.op[0] if self.rule.op else None
        if self.after is None and self.shape:
            if op == "copy":
                return self.sources[0].rows(start, stop)
            if op == "rows":
                off = self.rule.op[1]
                return self.sources[0].rows(start + off, stop + off)
            if op == "narrow":
                axis, first, last = self.rule.op[1:]
                if axis == 0:
                    return self.sources[0].rows(first + start, first + stop)
                return np.ascontiguousarray(tensor_ops.narrow(self.sources[0].rows(start, stop), axis, first, last))
            if op == "stack":
                return np.stack([self._source_whole(s) for s in self.sources[start:stop]]).astype(self.dtype)
            if op == "cat" and self.rule.op[1] == 0:
                return self._cat_rows(start, stop)
        if WHOLE not in self._whole:  # built whole once, kept until the stream lets go of this handle
            built = self.rule.build(*(self._source_whole(s) for s in self.sources))
            if self.after is not None:
                built = getattr(tensor_ops, self.after[0])(built, *self.after[1:])
            self._whole[WHOLE] = np.ascontiguousarray(built)
        whole = self._whole[WHOLE]
        return whole[start:stop] if whole.ndim else whole

    def pieces(self, start: int, stop: int) -> list[np.ndarray]:
        """Rows ``start:stop`` as consecutive pieces: a concatenation's parts are not copied into one array."""
        if self.after is None and self.shape and self.rule.op[:2] == ("cat", 0):
            return self._cat_parts(start, stop)
        return [self.rows(start, stop)]

    def _source_whole(self, s: FileParam) -> np.ndarray:
        return s.rows(0, s.shape[0] if s.shape else 1)

    def _cat_rows(self, start: int, stop: int) -> np.ndarray:
        parts = self._cat_parts(start, stop)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _cat_parts(self, start: int, stop: int) -> list[np.ndarray]:
        parts, at = [], 0
        for s in self.sources:
            lo, hi = max(start, at), min(stop, at + s.shape[0])
            if lo < hi:
                parts.append(s.rows(lo - at, hi - at).astype(self.dtype, copy=False))
            at += s.shape[0]
        return parts


class WeightSource:
    """Hands every parameter of the graph to ``feed``, in the order cheapest for the source."""

    def feed(self, feed: Feed) -> None:
        raise NotImplementedError

    def held_bytes(self) -> int:
        """Bytes the source itself may hold at once beyond the recipes' chunks (a parameter built whole)."""
        return 0


@dataclass
class FileSource(WeightSource):
    params: dict[str, Param]
    whole_bytes: int

    def feed(self, feed: Feed) -> None:
        for name, p in self.params.items():
            feed(name, p)

    def held_bytes(self) -> int:
        return self.whole_bytes


@dataclass
class SeededSource(WeightSource):
    """The torch backend's seeded initialisation (``Model.init_weights``: one generator, the module tree's
    parameter order, fp32), drawn as the stream reads it: a parameter over ``CHUNK_BYTES`` is drawn piece by piece
    (``DrawnParam``), the rest whole."""

    graph: LayerGraph

    def _plan(self) -> tuple[Any, list[tuple[str, tuple[int, ...], str, float]]]:
        """(the meta model, [(name, shape, rule, std or bound)]), as ``init_weights`` walks them."""
        import re

        import torch

        from ..torch.layers.model import init_rule, param_owner
        from ..torch.source import model_class

        with torch.device("meta"):
            model = model_class(self.graph)()
        out = []
        for name, param in model.named_parameters():  # a tied parameter once, as init_weights walks them
            owner, local = param_owner(model, name)
            rule, scale = init_rule(owner, local), 0.0
            if rule == "rnn":
                scale = (owner.hidden_size if isinstance(owner, torch.nn.RNNBase) else owner.hidden) ** -0.5
            elif rule == "constant":
                scale = owner.constants[local]  # the value it starts at
            elif rule == "normal":
                scale = model.META["residual_std" if re.match(model.RESIDUAL, name) else "init_std"]
            out.append((name, tuple(param.shape), rule, scale))
        return model, out

    def feed(self, feed: Feed) -> None:
        import torch

        model, plan = self._plan()
        gen = torch.Generator().manual_seed(int(model.META["seed"]))
        for name, shape, rule, scale in plan:
            if rule == "normal" and 4 * math.prod(shape) > CHUNK_BYTES:
                drawn = DrawnParam(shape, scale, gen)
                feed(name, drawn)
                drawn.finish()
                continue
            t = torch.empty(shape)
            if rule in ("zeros", "ones"):
                t.fill_(float(rule == "ones"))
            elif rule == "constant":
                t.fill_(scale)
            elif rule == "rnn":
                t.uniform_(-scale, scale, generator=gen)
            else:
                t.normal_(0.0, scale, generator=gen)
            feed(name, ArrayParam(t.numpy()))

    def held_bytes(self) -> int:
        _, plan = self._plan()
        return max((4 * math.prod(s) for _, s, rule, _ in plan if rule != "normal"), default=0)


class DrawnParam:
    """A ``normal`` parameter drawn from the shared generator as its rows are read. torch's CPU ``normal_``
    turns the uniforms of 16-element groups into normals in order and redraws the last 16 of an odd-sized
    tensor, so pieces of a multiple of 16 elements (the last one at least 16) drawn one after another equal the
    whole tensor drawn at once. Reading from the start again replays the generator from this parameter's
    state; ``finish`` draws what no reader took, leaving the generator where ``init_weights`` leaves it."""

    def __init__(self, shape: tuple[int, ...], std: float, gen: Any) -> None:
        self.shape, self.dtype, self.std, self.gen = shape, np.dtype(np.float32), std, gen
        self.total, self.row = math.prod(shape), math.prod(shape[1:])
        self.start = gen.get_state()
        self.drawn = self.served = 0
        self.buf = np.empty(0, np.float32)
        self.closed = False

    def rows(self, start: int, stop: int) -> np.ndarray:
        assert not self.closed, "a drawn parameter was read after the generator moved on"
        lo, hi = start * self.row, stop * self.row
        if lo < self.served:  # a second reader: replay this parameter's draws
            self.gen.set_state(self.start)
            self.drawn = self.served = 0
            self.buf = np.empty(0, np.float32)
        while self.served < lo:
            self._take(min(lo - self.served, CHUNK_BYTES // 4))
        return self._take(hi - lo).reshape((stop - start, *self.shape[1:]))

    def finish(self) -> None:
        while self.drawn < self.total:
            self._draw(CHUNK_BYTES // 4)
        self.buf = np.empty(0, np.float32)
        self.closed = True

    def _take(self, count: int) -> np.ndarray:
        if self.buf.size < count:
            self._draw(count - self.buf.size)
        out, self.buf = self.buf[:count], self.buf[count:]
        self.served += count
        return out

    def _draw(self, need: int) -> None:
        import torch

        left = self.total - self.drawn
        count = min(left, -(-need // 16) * 16)
        if left - count < 16:
            count = left  # the last piece keeps at least 16 elements
        t = torch.empty(count)
        t.normal_(0.0, self.std, generator=self.gen)
        self.buf = np.concatenate([self.buf, t.numpy()]) if self.buf.size else t.numpy()
        self.drawn += count


@dataclass
class DictSource(WeightSource):
    tensors: dict[str, Any]

    def feed(self, feed: Feed) -> None:
        for name, t in self.tensors.items():
            feed(name, ArrayParam(_numpy(t)))


def _numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def open_weights(g: LayerGraph, weights: Any = None) -> WeightSource:
    """The parameters of ``g`` from ``weights``: None (seeded init), a safetensors path or a dict of tensors."""
    if weights is None:
        return SeededSource(g)
    if isinstance(weights, dict):
        return dict_source(g, weights)
    return file_source(g, os.fspath(weights))


def dict_source(g: LayerGraph, weights: dict[str, Any]) -> DictSource:
    """The torch loader's checks (names, shapes, dtypes, finite values), without its copy: the export only reads."""
    import torch

    from ...interop.names import to_specc_names
    from ..torch.weights import check_dtypes, check_finite, check_matches

    bad = [k for k, v in weights.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise SpecError(f"weights must map names to torch tensors; {bad[0]!r} does not", file="weights")
    check_finite(weights, "weights")
    tensors = to_specc_names(g, dict(weights))
    check_matches(g, {n: tuple(t.shape) for n, t in tensors.items()}, "weights")
    check_dtypes(tensors, "weights")
    return DictSource(tensors)


def file_source(g: LayerGraph, path: str) -> FileSource:
    """Checked from the headers alone: names, shapes and dtypes as the torch loader checks them."""
    from ..torch.weights import check_dtype_names, check_matches

    if not os.path.lexists(path):
        raise SpecError(f"no such weights file: {path}", file=path)
    tensors: dict[str, FileParam] = {}
    for h, _ in checkpoint.headers(path):
        for t in h.tensors.values():
            tensors[t.name] = FileParam(h.path, t)
    shapes = {n: p.shape for n, p in tensors.items()}
    family = hf_family(g, shapes)
    if family is None:
        check_matches(g, shapes, path)
        _check_dtypes(tensors, list(g.params()), path, check_dtype_names)
        return FileSource(dict(tensors.items()), 0)
    plan = family.plan(g, set(shapes))
    checked = plans.check(plan, shapes)
    if checked.problems:
        raise SpecError(checked.problems)
    _check_dtypes(tensors, [s for r in checked.chosen.values() for s in r.sources], path, check_dtype_names)
    _check_tied(plan, tensors)
    plans.warn_dropped(plan, checked, stacklevel=4)
    params: dict[str, Param] = {}
    whole = 0
    for target in g.params():
        rule = checked.chosen[target]
        built = BuiltParam(rule, [tensors[s] for s in rule.sources], tuple(g.params()[target].shape),
                           plan.after.get(target))  # fmt: skip
        streamed = built.after is None and rule.op and rule.op[0] in ("copy", "rows", "narrow", "stack", "cat")
        if not streamed or (rule.op[0] == "cat" and rule.op[1] != 0):
            whole = max(whole, 4 * math.prod(built.shape))
        params[target] = built
    return FileSource(params, whole)


def _check_dtypes(tensors: dict[str, FileParam], used: list[str], path: str, check: Callable) -> None:
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    check({n: names.get(tensors[n].info.dtype, checkpoint.DTYPES[tensors[n].info.dtype][1]) for n in used}, path)


def _check_tied(plan: plans.Plan, tensors: dict[str, FileParam]) -> None:
    """Tensors the spec ties into one parameter hold equal values (compared chunk by chunk)."""
    from .recipes import row_chunks

    differing = []
    for group in plan.tied:
        here = [tensors[n] for n in group if n in tensors]
        for other in here[1:]:
            first = here[0]
            rows = first.shape[0] if first.shape else 1
            same = first.info.dtype == other.info.dtype and all(
                np.array_equal(first.rows(a, b), other.rows(a, b))
                for a, b in row_chunks(rows, math.prod(first.shape[1:]))
            )
            if not same:
                differing.append(f"{other.info.name} differs from {first.info.name}")
    if differing:
        raise SpecError(
            plans.listed(
                f"{plan.family} checkpoint: untied tensor",
                differing,
                "the spec ties these weights but the checkpoint holds different values: untie them in the spec "
                "(tie_embeddings: false / shared_embeddings: false)",
            )
        )
