"""specc's native GEMV (kernels_native.cpp): compiled at first use with this machine's C++ compiler, loaded by ctypes.

fp32 and bf16 weights (bf16 is widened as it is read; x, the bias and the sums are fp32). Decoding is a chain
of one-row linears that stream each weight once; on some CPUs every torch kernel reads those
weights well below the memory's speed (measured: 7–13 GB/s where ``sum()`` reads 14–18). The native kernel is one
more candidate for ``kernels_measure`` to time: it is chosen only where it measures fastest, and where it cannot be
built (no compiler, no OpenMP runtime in torch, not Linux, ``SPECC_NATIVE=0`` or ``SPECC_KERNELS=torch``, specc's
cache folder not private) the other candidates are used as before — ``status()`` says why. Those two switches
load no native code at all.

Build: ``$CXX`` (else ``c++``) ``-O3 -march=native -fopenmp``, linked to the OpenMP runtime torch has loaded (so the
kernel's threads are torch's threads, not a second pool competing for the cores). The library is cached in
``kernels/`` of specc's private cache (``specc.cache``: ``$SPECC_CACHE``, checked before use), named by a hash of
the source, the compiler, the flags, the CPU and torch's OpenMP runtime, written whole with its content hash in a
manifest beside it (concurrent first uses each build and one rename wins), and loaded only where its bytes match
that hash (a planted, truncated or otherwise different file is built afresh, never loaded). Building takes about
half a second; loading a cached one, a few milliseconds (mostly asking the compiler its version; reading and
hashing the 50 KB library takes about 0.2 ms).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from .... import cache

ENV = "SPECC_NATIVE"  # "0": never build or load the native kernel
KERNELS_ENV = "SPECC_KERNELS"  # "torch": plain F.linear everywhere, and no native code loaded
FOLDER = "kernels"  # in specc's cache
LIBRARY_BYTES = 64 << 20
HERE = Path(__file__).parent
SOURCES = (HERE / "kernels_native.cpp", HERE / "decode_native.cpp")  # one library: the GEMV and the decode step
HEADERS = (HERE / "native_gemv.h",)
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++17"]
VERSION = 3  # specc_gemv_version() of a library this loader accepts
_TIMEOUT_S = 120

_state: dict[str, object] = {}  # "fns": the GEMV entry points by weight dtype (None: see "why"), "lib", "path"


def status() -> str:
    """``"ready: PATH"`` once the kernel is loaded, else why it is not (tries to build it first)."""
    if _entry() is not None:
        return f"ready: {_state['path']}"
    return f"unavailable: {_switched_off() or _state['why']}"


def available() -> bool:
    """Whether the native kernel is built and loaded (building it at the first call)."""
    return _entry() is not None


def supports(dtype: torch.dtype) -> bool:
    """Whether the native kernel is available for weights (and inputs) of ``dtype``."""
    fns = _entry()
    return fns is not None and dtype in fns


def native_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """``F.linear(x, w, b)`` for CPU tensors by the native GEMV (any number of rows; it is timed only on a few):
    fp32, or bf16 (the weight read as bf16, everything else in fp32, the result rounded to bf16 once)."""
    fns = _entry()
    fn = fns.get(w.dtype) if fns is not None else None
    if fn is None or x.dtype != w.dtype:
        raise RuntimeError("specc's native GEMV is fp32/bf16-only and must be available")
    n_out, n_in = w.shape
    rows = x.reshape(-1, n_in).float().contiguous()
    w = w.contiguous()
    y = torch.empty(rows.shape[0], n_out)
    b = b.float().contiguous() if b is not None else None  # held: the kernel reads it through a raw pointer
    bias = b.data_ptr() if b is not None else None
    fn(rows.data_ptr(), w.data_ptr(), bias, y.data_ptr(), rows.shape[0], n_in, n_out, torch.get_num_threads())
    return y.view(*x.shape[:-1], n_out).to(x.dtype)


def library() -> ctypes.CDLL | None:
    """The loaded native library (building it at the first call), for the other entry points it holds."""
    return _state.get("lib") if _entry() is not None else None


def reset() -> None:
    """Forget the loaded library's handle (the next call loads it again from the cache, or builds it)."""
    _state.clear()


# ================================================================================================== building


def _entry() -> dict[torch.dtype, ctypes._CFuncPtr] | None:
    """The loaded entry points by weight dtype, building the library at the first call; None where it can't be."""
    if _switched_off():  # read at every call: a library loaded before the switch is not used after it
        return None
    if "fns" in _state:
        return _state["fns"]
    fns, why, path, lib = None, "", None, None
    if not sys.platform.startswith("linux"):
        why = f"built on Linux only (this is {sys.platform})"
    else:
        omp = _torch_openmp()
        where = cache.folder(FOLDER) if omp is not None else None
        if omp is None:
            why = "torch has no OpenMP runtime loaded in this process"
        elif where is None:
            why = f"specc's cache folder {cache.root() / FOLDER} is not private (see the warning above)"
        else:
            try:
                path, cxx = target(omp)
                loaded = _load(where, path.name)
                if loaded is None:  # missing, or not the bytes specc built there: built (again)
                    _build(where, path.name, cxx, omp)
                    loaded = _load(where, path.name)
                if loaded is None:
                    raise RuntimeError(f"{path} does not match its recorded hash after building it")
                lib, fns = loaded
            except (OSError, subprocess.SubprocessError, RuntimeError) as e:
                why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
    _state.update(fns=fns, why=why, path=path, lib=lib)
    return fns


def _switched_off() -> str | None:
    """Which switch turns native code off ("SPECC_NATIVE=0", "SPECC_KERNELS=torch"), if one does."""
    for name, value in ((ENV, "0"), (KERNELS_ENV, "torch")):
        if os.environ.get(name) == value:
            return f"{name}={value}"
    return None


def _torch_openmp() -> str | None:
    """The OpenMP runtime library torch's own CPU kernels run on, as this process has mapped it."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "/" in line}
    except OSError:
        return None
    for name in ("libgomp", "libiomp5", "libomp"):
        hits = sorted(p for p in paths if Path(p).name.startswith(name) and ".so" in Path(p).name)
        torch_own = [p for p in hits if "torch" in p]
        if torch_own or hits:
            return (torch_own or hits)[0]
    return None


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX") or "c++")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            keep = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(keep)))
    except OSError:
        return platform.processor()


def target(omp: str) -> tuple[Path, list[str]]:
    """Where the library built for this source, compiler, CPU and OpenMP runtime is cached, and the compiler."""
    cxx = _compiler()
    try:
        version = subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=30, check=True)
    except FileNotFoundError as e:
        raise RuntimeError(f"no C++ compiler ({' '.join(cxx)}: not found)") from e
    code = b"\0".join(p.read_bytes() for p in (*SOURCES, *HEADERS))
    parts = (code, version.stdout, " ".join(FLAGS), _cpu_flags(), omp, platform.machine())
    key = hashlib.sha256(b"\0".join(p.encode() if isinstance(p, str) else p for p in parts)).hexdigest()[:16]
    return cache.root() / FOLDER / f"gemv-{key}.so", cxx


def _build(where: Path, name: str, cxx: list[str], omp: str) -> None:
    """Compile the library in a private temporary folder and store it as ``where/name`` with its hash."""
    with tempfile.TemporaryDirectory(prefix=".build-", dir=where) as tmp:
        out = Path(tmp) / name
        # compiled with -fopenmp, linked to torch's runtime by path (its soname, already loaded, is reused)
        cmd = [*cxx, *FLAGS, *map(str, SOURCES), "-o", str(out), omp, f"-Wl,-rpath,{Path(omp).parent}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cxx)} failed: {(done.stderr or done.stdout).strip()}")
        if cache.write_entry(where, name, out.read_bytes(), manifest=True) is None:
            raise RuntimeError(f"cannot write {where / name}")


def _load(where: Path, name: str) -> tuple[ctypes.CDLL, dict[torch.dtype, ctypes._CFuncPtr]] | None:
    """The library ``where/name`` where its bytes are those recorded when specc built it; else None."""
    with cache.open_entry(where, name, LIBRARY_BYTES) as fd:
        if fd is None:
            return None
        try:  # the descriptor of the checked bytes, not the name: nothing can be swapped in between
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
            version = lib.specc_gemv_version
            fns = {torch.float32: lib.specc_gemv_f32, torch.bfloat16: lib.specc_gemv_bf16}
        except (OSError, AttributeError):  # built here but not loadable: built afresh
            return None
    version.restype = ctypes.c_int
    if version() != VERSION:
        return None
    for f in fns.values():
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
        f.restype = None
    return lib, fns
