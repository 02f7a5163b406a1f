"""Layouts from the command line (``--parallel dp=2,tp=2,pp=2``) and the device mesh of a torchrun launch."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import Any

import torch

from ..errors import SpecError

KNOWN = ("dp", "tp")
RUN = ("dp", "tp", "pp", "ep")
STARTED = False  # this process started a process group: it ends by ``end_process``


def parse_layout(text: str) -> dict[str, int]:
    """``dp=2,tp=2`` → {"dp": 2, "tp": 2}, read as ``specc analyze --parallel`` reads it (any subset of the
    degrees, a missing one 1), so its layouts (``tp=2,pp=1,dp=4``) run as they are; what the runtime does not run
    (``specc.analysis.layouts.support``: cp > 1, ep with pp, ...) is refused here."""
    from ..analysis.layouts.layout import LayoutError
    from ..analysis.layouts.layout import parse_layout as read
    from ..analysis.layouts.support import runtime_gap

    try:
        layout = read(text)
    except LayoutError as e:  # the analyzer's hint names pp, which train does not run
        raise SpecError(e.message, hint="e.g. --parallel dp=2,tp=2" if e.hint else None) from None
    gap = runtime_gap(layout)  # what the degrees alone decide; check_runnable adds the graph's part
    if gap is not None:
        raise SpecError(gap.message, hint=gap.hint)
    return {key: getattr(layout, key) for key in RUN}


def check_runnable(
    graph: Any, layout: dict[str, int], micro_batches: int | None = None, schedule: str = "1f1b"
) -> None:
    """Refuse, before any work, a layout of ``graph`` this runtime does not run: the rule ``specc analyze --plan``
    leaves such layouts out by (``specc.analysis.layouts.support``)."""
    from ..analysis.layouts.layout import Layout
    from ..analysis.layouts.support import runtime_facts, runtime_gap

    lay = Layout(**{key: layout.get(key, 1) for key in RUN})
    gap = runtime_gap(lay, runtime_facts(graph), micro_batches, schedule)
    if gap is not None:
        raise SpecError(gap.message, hint=gap.hint)


def world_size() -> int:
    """Processes of this launch: torchrun's ``WORLD_SIZE`` (1 without torchrun)."""
    value = os.environ.get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def local_device(device: torch.device) -> torch.device:
    """cuda → this process's GPU (torchrun's ``LOCAL_RANK``); other devices as they are."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def describe(layout: dict[str, int]) -> str:
    """``dp=2,tp=1`` (and ``,pp=P`` when it pipelines)."""
    pp, ep = layout.get("pp", 1), layout.get("ep", 1)
    return f"dp={layout['dp']},tp={layout['tp']}" + (f",pp={pp}" if pp > 1 else "") + (f",ep={ep}" if ep > 1 else "")


def init_mesh(layout: dict[str, int], device: torch.device) -> Any:
    """The DeviceMesh of this launch, starting the process group (gloo on CPU, nccl on CUDA): dimensions
    ("dp", "tp"), or ("pp", "dp", "tp") with pp > 1 (pp outermost, tp innermost, as the analyzer orders ranks)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    pp = layout.get("pp", 1)
    need, have = layout["dp"] * layout["tp"] * pp, world_size()
    if need != have:
        how = "torchrun is not running this process" if "WORLD_SIZE" not in os.environ else f"{have} processes run"
        raise SpecError(
            f"--parallel {describe(layout)} needs {need} processes; {how}",
            hint=f"torchrun --nproc-per-node {need} -m specc train ...",
        )
    global STARTED
    if not dist.is_initialized():
        STARTED = True
        backend = "nccl" if device.type == "cuda" else "gloo"
        if "WORLD_SIZE" in os.environ:  # torchrun's env:// rendezvous
            dist.init_process_group(backend)
        else:  # one process without torchrun (dp=1,tp=1): a group of its own, no rendezvous to wait for
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if pp > 1:
        return init_device_mesh(device.type, (pp, layout["dp"], layout["tp"]), mesh_dim_names=("pp", *KNOWN))
    return init_device_mesh(device.type, (layout["dp"], layout["tp"]), mesh_dim_names=KNOWN)


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def end_process(code: int) -> None:
    """End a process that ran a process group: flush, run the ``atexit`` handlers, then ``os._exit(code)``.

    Why not a normal exit: objects that outlive ``destroy_process_group`` (FSDP2 and DTensor state of a model
    still referenced, holding gloo work and groups) are destroyed during interpreter finalization while gloo's
    C++ threads still run, and the process aborts now and then ("terminate called without an active
    exception", SIGABRT). A torchrun rank that ran FSDP2 ends so in about one launch in five on a loaded
    machine (tests/test_parallel_exit.py); skipping finalization leaves nothing to race.
    """
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more to say
                stream.flush()
        os._exit(code)
