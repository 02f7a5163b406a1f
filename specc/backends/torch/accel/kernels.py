"""The fastest CPU kernel for a linear layer, chosen by measuring it on this machine.

Which fp32 GEMM is fastest depends on the CPU: on Intel Xeons MKL's sgemm (behind ``F.linear``) is fast; on
AMD EPYCs with AVX-512 MKL does not use it and oneDNN's linear can be twice as fast; on others the two trade
places shape by shape. Decoding a few tokens is a weight-streaming GEMV that MKL may run on one core; a
batched matmul over row blocks of the weight streams on every core, and specc's native GEMV (compiled at first
use) streams each thread's rows as one sequential read. Nothing here assumes a vendor.

One job per file:
- ``kernels_candidates``: the candidate kernels (F.linear, oneDNN, row-split GEMV, native) and the oneDNN probe;
- ``kernels_native``: building, caching and loading the native GEMV (``SPECC_NATIVE=0`` turns it off);
- ``kernels_measure``: timing the candidates of a shape class on the call's own inputs, noise detection;
- ``kernels_dispatch``: ``linear`` — which calls may be routed, the per-class decisions, re-measuring;
- ``modules``: ``accelerate`` / ``restore`` of a model's ``nn.Linear`` layers (the pass: ``accel``).

``SPECC_KERNELS=torch`` (environment variable) forces plain ``F.linear`` everywhere and loads no native code;
unset, ``auto`` or anything else measures. It is read when a shape class is first seen (after changing it in a
running process, call ``reset()``; the native library reads it at every call). Importing runs no kernel, draws
from no random generator and registers nothing; the oneDNN probe runs at the first plain call.
"""

from __future__ import annotations

from .kernels_candidates import CANDIDATES
from .kernels_dispatch import choices, linear, reset
from .kernels_measure import ENV, FEW_ROWS, Choice
from .modules import FastForward, accelerate, restore

__all__ = ["CANDIDATES", "ENV", "FEW_ROWS", "Choice", "FastForward", "accelerate", "choices", "linear", "reset",
           "restore"]  # fmt: skip
