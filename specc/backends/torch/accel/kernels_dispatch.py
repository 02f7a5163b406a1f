"""``linear``: F.linear by the kernel measured fastest for the call's shape class, for plain inference calls.

Only *plain* calls are routed: CPU tensors of type Tensor/Parameter, fp32 or bf16, no autograd needed, not
under torch.compile / torch.export / jit tracing or scripting / functorch transforms / autocast, and no
Python dispatch or torch-function mode active (so ``FlopCounterMode``, FakeTensorMode, the default-device
context and other modes see an ordinary ``aten`` linear). Everything else is plain ``F.linear``.

A shape class is (dtype, rows bucket 1 / 2-8 / 9-64 / 65-512 / more, out_features, in_features, thread
count, bias, contiguity); its first call is measured (kernels_measure) and the winner kept in a dict for the
rest of the process. A noisy measurement is taken again after 10×, 100× and 1000× as many calls of that class.
Decisions are not stored on disk: one taken while other processes load the machine would pick a wrong kernel
for good, and an in-process measurement costs milliseconds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import kernels_measure as measuring
from .kernels_candidates import CANDIDATES, onednn_ok
from .kernels_measure import FEW_ROWS, Choice

_DTYPES = (torch.float32, torch.bfloat16)
_PLAIN = (Tensor, nn.Parameter)
_STRIDED = torch.strided
_MEASUREMENTS, _AGAIN = 4, 10  # a noisy class is measured again at calls 10, 100, 1000


class _Entry:
    """A shape class's decision and its call count (it is measured again at call ``again`` when noisy)."""

    __slots__ = ("again", "calls", "choice", "fn")

    def __init__(self, choice: Choice):
        self.choice, self.fn, self.calls, self.again = choice, CANDIDATES[choice.kernel], 0, -1


_entries: dict[tuple, _Entry] = {}


def _plain(x: Tensor, w: Tensor, b: Tensor | None) -> bool:
    """Whether this call may leave F.linear: see the module docstring. The compile check comes first, so
    that torch.compile and torch.export (strict) trace nothing but a constant branch; the cheap checks next
    (this runs at every call: about 1 µs)."""
    if torch.compiler.is_compiling() or torch._C._is_tracing() or torch.jit.is_scripting():
        return False
    if type(x) is not Tensor or type(w) not in _PLAIN or (b is not None and type(b) not in _PLAIN):
        return False
    dtype = x.dtype
    if dtype not in _DTYPES or w.dtype != dtype or not (x.is_cpu and w.is_cpu) or w.dim() != 2 or x.dim() == 0:
        return False
    if b is not None and (b.dtype != dtype or not b.is_cpu or b.dim() != 1):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        return False
    if x.layout is not _STRIDED or w.layout is not _STRIDED:
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    if torch._C._are_functorch_transforms_active() or torch.is_autocast_enabled("cpu"):
        return False
    return not torch.compiler.is_exporting()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``, by the kernel measured fastest on this machine for plain CPU inference
    calls (see the module docstring); every other call is ``F.linear`` itself."""
    if not _plain(x, weight, bias):
        return F.linear(x, weight, bias)
    n_out, n_in = weight.shape
    rows = x.numel() // n_in if n_in else 0
    if rows == 0 or n_out == 0 or x.shape[-1] != n_in:
        return F.linear(x, weight, bias)  # F.linear raises or handles the degenerate case
    bucket = 1 if rows == 1 else 8 if rows <= FEW_ROWS else 64 if rows <= 64 else 512 if rows <= 512 else 513
    key = (
        x.dtype,
        bucket,
        n_out,
        n_in,
        torch.get_num_threads(),
        bias is None,
        x.is_contiguous(),
        weight.is_contiguous(),
    )
    entry = _entries.get(key)
    if entry is not None:
        entry.calls += 1
        if entry.calls != entry.again:
            return entry.fn(x, weight, bias)
    previous = entry.choice if entry is not None else None
    measured = measuring.measure(x, weight, bias, previous)
    if measured is None:  # not decidable on these inputs (non-finite values): decide at a later call
        return F.linear(x, weight, bias)
    choice, noisy = measured
    if entry is None:
        entry = _entries[key] = _Entry(choice)
    # A measurement disturbed by other load is taken again after 10×, 100×, ... as many calls (up to
    # _MEASUREMENTS in all); each candidate's best time over all of them counts, as noise only adds time.
    entry.choice, entry.fn = choice, CANDIDATES[choice.kernel]
    entry.again = max(entry.calls, 1) * _AGAIN if noisy and choice.measurements < _MEASUREMENTS else -1
    return entry.fn(x, weight, bias)


def choices() -> dict[tuple, Choice]:
    """The decisions taken so far in this process: key (dtype, rows bucket, out_features, in_features,
    threads, bias is None, input contiguous, weight contiguous) → Choice (kernel name, timings)."""
    return {key: entry.choice for key, entry in _entries.items()}


def reset() -> None:
    """Forget every decision and the oneDNN probe (the next plain call measures again)."""
    _entries.clear()
    onednn_ok.clear()
    measuring._LLC.clear()
