"""The candidate kernels for a CPU linear layer, and the check that oneDNN's is present and agrees.

Each candidate computes ``F.linear(x, w, b)``: ``torch`` is F.linear itself (MKL or whatever this build
uses), ``onednn`` is ``torch.ops.mkldnn._linear_pointwise`` (a private op: used only where a probe shows it
exists and agrees with F.linear), ``split`` is a batched matmul over row blocks of the weight (a GEMV of a few
rows then streams the weight on every core instead of one), ``native`` is specc's own fp32 / bf16-weight GEMV
(kernels_native: compiled at first use, used only where it builds and agrees).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .kernels_native import native_linear

Kernel = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # |candidate − F.linear| ≤ tol · (max|F.linear| + 1)


def _torch(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return F.linear(x, w, b)


def _onednn(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def _split(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x @ wᵀ + b as one batched matmul over ``torch.get_num_threads()`` row blocks of w (views, no copies),
    the bias added by the same call (baddbmm)."""
    k = torch.get_num_threads()
    rows = x.reshape(-1, x.shape[-1])
    n_out = w.shape[0]
    main = n_out - n_out % k
    blocks, xs = w[:main].view(k, main // k, -1), rows.t().expand(k, -1, -1)
    if b is None:
        y = torch.bmm(blocks, xs)  # [k, main / k, rows]
    else:
        y = torch.baddbmm(b[:main].view(k, main // k, 1), blocks, xs)
    y = y.permute(2, 0, 1).reshape(rows.shape[0], main)
    if main < n_out:
        y = torch.cat((y, F.linear(rows, w[main:], None if b is None else b[main:])), 1)
    return y.view(*x.shape[:-1], n_out)


CANDIDATES: dict[str, Kernel] = {"torch": _torch, "onednn": _onednn, "split": _split, "native": native_linear}

onednn_ok: dict[torch.dtype, bool] = {}  # the probe's verdict per dtype


def onednn_available(dtype: torch.dtype) -> bool:
    """Whether this torch build has oneDNN's linear and it agrees with F.linear on a probe in ``dtype``
    (a private generator: the global RNG is untouched)."""
    ok = onednn_ok.get(dtype)
    if ok is None:
        ok = False
        try:
            op = torch.ops.mkldnn._linear_pointwise  # AttributeError / RuntimeError where the build lacks it
            g = torch.Generator().manual_seed(0)
            x, w, b = (torch.randn(s, generator=g).to(dtype) for s in ((3, 2, 40), (24, 40), (24,)))
            with torch.no_grad():
                ok = agrees(op(x, w, b, "none", [], ""), F.linear(x, w, b)) and agrees(
                    op(x, w, None, "none", [], ""), F.linear(x, w, None)
                )
        except (AttributeError, RuntimeError, NotImplementedError):
            ok = False
        onednn_ok[dtype] = ok
    return ok


def agrees(y: Tensor, ref: Tensor) -> bool:
    if y.shape != ref.shape or y.dtype != ref.dtype:
        return False
    tol = TOL[ref.dtype]
    ref32, y32 = ref.float(), y.float()
    return bool((y32 - ref32).abs().max() <= tol * (ref32.abs().max() + 1)) if ref.numel() else True


def runs_and_agrees(fn: Kernel, x: Tensor, w: Tensor, b: Tensor | None, ref: Tensor) -> bool:
    """One call (also the warm-up) of a candidate: it must not raise and must match F.linear."""
    try:
        return agrees(fn(x, w, b), ref)
    except (RuntimeError, NotImplementedError):
        return False
