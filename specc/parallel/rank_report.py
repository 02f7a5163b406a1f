"""``train --parallel ... --report``: the analyzer's prediction for the run's layout and schedule, per rank,
beside what the run measured on its last step.

Predicted (``specc.analysis.layouts.analyze_layout`` for tp, pp, dp, the micro-batches and the schedule;
FSDP2 is ZeRO-3 over dp; attention as the run computes it, torch's fused SDPA: ``flash``; activations as torch's
eager ops keep them, ``kernels`` ``torch-cpu`` on the CPU, ``torch`` on a GPU; the head's logits gathered whole on
every tp rank, as the run's cross-entropy reads them: ``loss_parallel`` off): per pipeline stage
the weights, gradients, Adam moments and activations, their sum, the bubble formula and, with a device
profile, the step time.

Measured on each rank, in its last training step:

- weights, gradients, optimizer states: bytes of the tensors the rank holds (its shards: ``to_local``; the Adam
  moments ``exp_avg`` and ``exp_avg_sq``, the one-element step counters aside);
- activations: the most bytes of tensors saved for the backward pass alive at once (``saved_tensors_hooks``:
  each storage once, released when autograd drops it; parameters and views of them, FSDP2's gathered ones
  included, are weights, not activations);
- peak: CUDA ``max_memory_allocated``; on the CPU, the C heap's bytes in use (glibc ``mallinfo2``) sampled
  after every op by a dispatch mode, over what was in use when the step began, plus the tensors the step began
  with (weights, gradients, Adam moments): the tensors of one step, as the analyzer counts them;
- step time: the step's wall clock; bubble: the share of the step this rank's stages spent outside their
  forward and backward computations (their timestamps, ``specc.parallel.pipeline.Timeline``).
"""

from __future__ import annotations

import ctypes
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

ITEMS = ("weights", "gradients", "optimizer_states", "activations", "peak", "step_time", "bubble")
MOMENTS = ("exp_avg", "exp_avg_sq")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors: Any) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if torch.is_tensor(t))


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of this rank's weights, gradients and Adam moments."""
    params = list(model.parameters())
    moments = [st[k] for st in optimizer.state.values() for k in MOMENTS if k in st]
    return {
        "weights": _bytes(params),
        "gradients": _bytes(p.grad for p in params if p.grad is not None),
        "optimizer_states": _bytes(moments),
    }


def _plain(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors with storage inside ``t``: itself, or a wrapper subclass's inner ones (a DTensor op's local
    result can be an AsyncCollectiveTensor, which has no storage of its own)."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()  # type: ignore[attr-defined]
    return [x for name in names for x in _plain(getattr(t, name))]


class SavedTensors:
    """The most bytes of autograd's saved tensors alive at once (each storage counted once)."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude, self.live, self.now, self.peak = exclude, {}, 0, 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if isinstance(base, torch.nn.Parameter):  # a parameter (FSDP2's gathered one too), or a view of one
            return t
        for plain in _plain(_local(t)):
            storage = plain.untyped_storage()
            key = storage.data_ptr()
            if key in self.exclude or storage.nbytes() == 0:
                continue
            refs, size = self.live.get(key, (0, storage.nbytes()))
            if refs == 0:
                self.now += size
                self.peak = max(self.peak, self.now)
            self.live[key] = (refs + 1, size)
            weakref.finalize(t, self._drop, key)
        return t

    def _drop(self, key: int) -> None:
        refs, size = self.live[key]
        if refs == 1:
            del self.live[key]
            self.now -= size
        else:
            self.live[key] = (refs - 1, size)

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]  # fmt: skip


def _heap() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return None
    return libc


class HeapPeak(TorchDispatchMode):
    """The most C-heap bytes in use after any op run under it (glibc)."""

    def __init__(self, libc: Any) -> None:
        super().__init__()
        self.libc = libc
        self.start = self.peak = self.in_use()

    def in_use(self) -> int:
        m = self.libc.mallinfo2()
        return int(m.uordblks + m.hblkhd)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.in_use())
        return out


@dataclass
class Measurement:
    """What ``measure`` recorded of one step on this rank (bytes; seconds; the bubble share)."""

    values: dict[str, float] = field(default_factory=dict)
    peak_how: str = ""

    @contextmanager
    def step(self, run: Any) -> Iterator[None]:
        model, opt, device = run.model, run.optimizer, run.device
        exclude = {_local(p).untyped_storage().data_ptr() for p in model.parameters()}
        saved = SavedTensors(exclude)
        began = sum(state_bytes(model, opt).values())
        libc = _heap() if device.type == "cpu" else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        heap = HeapPeak(libc) if libc is not None else None
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            if heap is not None:
                with heap:
                    yield
            else:
                yield
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.values = {**state_bytes(model, opt), "activations": saved.peak, "step_time": time.perf_counter() - t0}
        if device.type == "cuda":
            self.values["peak"] = torch.cuda.max_memory_allocated(device)
            self.peak_how = "torch.cuda.max_memory_allocated"
        elif heap is not None:
            self.values["peak"] = heap.peak - heap.start + began
            self.peak_how = "C heap in use (mallinfo2) after each op, over the step's start, + the tensors held then"
        else:
            self.values["peak"] = float("nan")
            self.peak_how = "not measured on this platform"
        pipe = getattr(run, "pipeline", None)
        self.values["bubble"] = pipe.timeline.bubble() if pipe is not None else 0.0


def predict(run: Any, device_profile: str | None = None) -> list[dict[str, float]]:
    """The analyzer's items for every pipeline stage of the run's layout (a rank of stage s: entry s)."""
    from ..analysis.layouts.layout import Layout, Training
    from ..analysis.layouts.run import analyze_layout
    from ..analysis.layouts.timing import bubble

    mesh, cfg, pipe = run.mesh, run.cfg, getattr(run, "pipeline", None)
    names = tuple(mesh.mesh_dim_names or ())
    tp = mesh["tp"].size() if "tp" in names else 1
    dp = mesh["dp"].size() if "dp" in names else 1
    pp = mesh["pp"].size() if "pp" in names else 1
    rows = cfg.batch // dp
    micro = rows // pipe.micro_batches if pipe is not None else rows
    schedule = pipe.schedule_name if pipe is not None else "1f1b"
    virtual = pipe.virtual if pipe is not None else 1
    t = Training(zero=3 if dp > 1 else 0, micro_batch=micro, global_batch=cfg.batch, schedule=schedule,
                 virtual_stages=virtual if schedule == "interleaved-1f1b" else 1, attention="flash",
                 kernels="torch-cpu" if run.device.type == "cpu" else "torch",
                 loss_parallel=False)  # fmt: skip
    ep = getattr(run, "ep", 1)  # experts sharded over the dp ranks
    cost = analyze_layout(run.graph, Layout(tp=tp, pp=pp, dp=dp, ep=ep), training=t, is_training=True,
                          seq=int(run.lengths[1]), dtype="fp32", device=device_profile)  # fmt: skip
    out = []
    for st in cost.stages:
        extra = sum(st.get(k, 0) for k in ("runtime_context", "allocator_reserve", "comm_buffers"))
        row = {k: float(st[k]) for k in ("weights", "gradients", "optimizer_states", "activations")}
        row["peak"] = float(st["total"] - extra)
        row["step_time"] = float(cost.step_time) if cost.step_time is not None else float("nan")
        row["bubble"] = bubble(pp, cost.micro_batches, schedule, virtual)
        out.append(row)
    return out


def gather(values: dict[str, float]) -> list[dict[str, float]]:
    """Every rank's measurement, on every rank (a collective)."""
    mine = torch.tensor([float(values.get(k, float("nan"))) for k in ITEMS], dtype=torch.float64)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [dict(zip(ITEMS, mine.tolist(), strict=True))]
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [dict(zip(ITEMS, t.tolist(), strict=True)) for t in every]


def stage_of_rank(mesh: Any) -> list[int]:
    """The pipeline stage of every global rank (0 without pp)."""
    names = tuple(mesh.mesh_dim_names or ())
    n = int(mesh.mesh.numel())
    if "pp" not in names:
        return [0] * n
    grid = mesh.mesh.reshape(mesh["pp"].size(), -1)
    out = [0] * n
    for s in range(grid.shape[0]):
        for r in grid[s].tolist():
            out[int(r)] = s
    return out


def rows(predicted: list[dict[str, float]], measured: list[dict[str, float]], stages: list[int]) -> list[list[str]]:
    """Table rows: rank, stage, then per item "predicted / measured"."""
    out = []
    for rank, got in enumerate(measured):
        want = predicted[stages[rank]]
        cells = [str(rank), str(stages[rank])]
        for k in ITEMS:
            cells.append(f"{_show(k, want[k])} / {_show(k, got[k])}")
        out.append(cells)
    return out


def _show(item: str, v: float) -> str:
    if v != v:  # NaN: not predicted (no device profile) or not measured
        return "–"
    if item == "step_time":
        return f"{v * 1e3:.1f} ms"
    if item == "bubble":
        return f"{100 * v:.1f}%"
    return f"{v / 2**20:.3f} MiB" if v >= 2**20 else f"{int(v):,} B"
