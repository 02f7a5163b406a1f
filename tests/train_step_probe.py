"""Run in a fresh process by test_analysis_measure.py: time `specc train` steps of a small character LM on
this CPU under each given recompute policy; print {policy: {"step_s", "step_quartiles_s", "peak_bytes"}} as JSON.

step_s: the median step time; step_quartiles_s: the steps a quarter from either end. peak_bytes: the step's
allocation peak (malloc's bytes in use, sampled after every op by a dispatch mode) over what was in use when the
step began, plus the weights, gradients and Adam states it began with: the tensors of one step. Policies as the
analyzer prices them: none; full (each block checkpointed); selective (each attention core checkpointed); op (each
block under torchtitan's op-level selective checkpointing, ``op_policy``)."""

from __future__ import annotations

import ctypes
import json
import sys
import time

import torch
from torch._functorch.partitioners import get_default_op_list
from torch.utils import checkpoint as ck
from torch.utils._python_dispatch import TorchDispatchMode

from specc.spec.loader import load_spec
from specc.train.loop import TrainConfig, setup, train_step

# torchtitan's save list (torchtitan/distributed/activation_checkpoint.py, _get_default_save_ops): torch's
# compute-intensive ops (mm, addmm, bmm, the flash / efficient SDPA kernels …) and the other SDPA variants, max,
# linear, topk and reduce-scatter; plus the CPU flash kernel, this machine's stand-in for the CUDA one.
SAVED = {op.default for op in get_default_op_list().compute_intensive_ops}
for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
             "_scaled_dot_product_fused_attention_overrideable", "max", "linear", "topk",
             "_scaled_dot_product_flash_attention_for_cpu"):  # fmt: skip
    if hasattr(torch.ops.aten, name):
        SAVED.add(getattr(torch.ops.aten, name).default)
SAVED.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
MM = {torch.ops.aten.mm.default, torch.ops.aten.linear.default}  # counted: every second one is recomputed


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]  # fmt: skip


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def in_use() -> int:
    m = _libc.mallinfo2()
    return int(m.uordblks + m.hblkhd)


class Peak(TorchDispatchMode):
    """The most bytes in use after any op run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = in_use()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, in_use())
        return out


def state_bytes(run: object) -> int:
    seen, n = set(), 0
    tensors = [t for p in run.model.parameters() for t in (p, p.grad)]  # type: ignore[attr-defined]
    tensors += [t for st in run.optimizer.state.values() for t in st.values()]  # type: ignore[attr-defined]
    for t in tensors:
        if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            n += t.untyped_storage().nbytes()
    return n


def op_policy() -> object:
    """torchtitan's SelectiveAC policy for one checkpoint region: ops in SAVED are saved except the even-numbered
    mm calls, counted afresh per region and separately for the forward and the recompute."""
    count = {False: 0, True: 0}

    def policy(ctx: object, func: object, *args: object, **kw: object) -> ck.CheckpointPolicy:
        again = bool(ctx.is_recompute)  # type: ignore[attr-defined]
        if func in MM:
            count[again] += 1
        if func in SAVED and not (func in MM and count[again] % 2 == 0):
            return ck.CheckpointPolicy.MUST_SAVE
        return ck.CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def wrap(module: torch.nn.Module, **kw: object) -> None:
    inner = type(module).forward.__get__(module)

    def forward(*a: object, **k: object) -> object:
        return ck.checkpoint(inner, *a, use_reentrant=False, **kw, **k)

    module.forward = forward  # type: ignore[method-assign]


def unwrap(model: torch.nn.Module) -> None:
    for m in model.modules():
        m.__dict__.pop("forward", None)  # back to the class's forward


def gemm_1024_flops() -> float:
    """The machine as the steps find it: a 1024³ GEMM's rate (median of 7), to hold against the profile's."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t0)
    return 2 * 1024**3 / sorted(times)[3]


def main() -> None:
    text, policies, threads, batch, window, steps = sys.argv[1:7]
    sets = sys.argv[7:]
    torch.set_num_threads(int(threads))
    cfg = TrainConfig(task="lm", steps=10**6, batch=int(batch), max_len=int(window), text=text, warmup=1)
    run = setup(load_spec("gpt2", sets), cfg, torch.device("cpu"))
    train_step(run)  # warm-up: Adam states, gradients
    out: dict = {"gemm_1024_flops_before": gemm_1024_flops()}
    for recompute in policies.split(","):
        unwrap(run.model)
        for block in run.model.blocks:
            if recompute == "full":
                wrap(block)
            elif recompute == "selective":
                wrap(block.attn.core)
            elif recompute == "op":
                wrap(block, context_fn=lambda: ck.create_selective_checkpoint_contexts(op_policy()))
        train_step(run)
        start, held = in_use(), state_bytes(run)
        with Peak() as mode:
            train_step(run)
        peak = mode.peak - start + held
        times = []
        for _ in range(int(steps)):
            t0 = time.perf_counter()
            train_step(run)
            times.append(time.perf_counter() - t0)
        times.sort()  # the median, and the steps either side of it: a load that changed during them shows
        out[recompute] = {"step_s": times[len(times) // 2], "peak_bytes": peak, "vocab": len(run.vocab)}
        out[recompute]["step_quartiles_s"] = [times[len(times) // 4], times[-1 - len(times) // 4]]
    out["gemm_1024_flops"] = gemm_1024_flops()  # before and after: a load that changed meanwhile shows
    print(json.dumps(out))


if __name__ == "__main__":
    main()
