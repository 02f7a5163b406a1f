"""onnxruntime sessions: provider choice that checks what really loaded, explicit thread counts, clear errors."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

from ..errors import SpecError

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


def default_threads() -> int:
    """Intra-op threads: the cores this process may run on (ORT's own default ignores CPU affinity)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


def open_session(
    path: str | os.PathLike[str], provider: str = "auto", threads: int | None = None, verbose: bool = False
) -> tuple[object, str]:
    """An ``InferenceSession`` and the provider that actually runs it.

    ``provider``: ``cpu``; ``cuda`` (an error if the CUDA EP does not load); ``auto`` (CUDA if it loads, else
    CPU). ``get_available_providers()`` lists CUDA whenever the GPU package is installed, GPU or not, so the
    answer comes from ``session.get_providers()`` after creation.
    """
    import onnxruntime as ort

    if provider not in ("auto", "cuda", "cpu"):
        raise SpecError(f"unknown provider {provider!r}", hint="auto | cuda | cpu")
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"no such file: {p}", file=str(p))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or default_threads()
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # VERBOSE shows node placement and the attention kernel chosen; otherwise errors only reach the user as
    # specc's one-line messages, not as onnxruntime's coloured log lines.
    opts.log_severity_level = 0 if verbose else 3
    want_cuda = provider != "cpu" and CUDA in ort.get_available_providers()
    if provider == "cuda" and not want_cuda:
        raise SpecError(
            "this onnxruntime has no CUDA execution provider", hint="install onnxruntime-gpu or use --provider cpu"
        )
    providers = [CUDA, CPU] if want_cuda else [CPU]
    if want_cuda:
        _preload_cuda()
    try:
        if want_cuda and not verbose:
            ort.set_default_logger_severity(4)  # a failed CUDA load is reported below in one line, not as a log dump
        sess = ort.InferenceSession(str(p), opts, providers=providers)
    except Exception as e:  # onnxruntime raises its own pybind exception types
        hint = None
        if "NOT_IMPLEMENTED" in str(e):
            hint = "no kernel for this dtype on the provider that loaded (bf16 needs CUDA): export --dtype fp32 or fp16"
        raise SpecError(_load_error(p, e), file=str(p), hint=hint) from None
    finally:
        if want_cuda and not verbose:
            ort.set_default_logger_severity(3)
    active = sess.get_providers()[0]
    if provider == "cuda" and active != CUDA:
        raise SpecError(
            f"the CUDA execution provider did not load: {cuda_failure()}",
            hint="use --provider cpu or auto; CUDA needs an NVIDIA GPU with its driver and the CUDA 13 / cuDNN 9 "
            "libraries (pip install 'onnxruntime-gpu[cuda,cudnn]', or a CUDA 13 build of torch imported first)",
        )
    return sess, active


def cuda_failure() -> str:
    """Why the CUDA EP fell back to the CPU: no GPU device, and/or the first library its provider cannot load
    (what onnxruntime logs and specc silences: it would print a multi-line log for a one-line answer)."""
    import ctypes

    import onnxruntime as ort

    reasons = []
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0")):
        reasons.append("no NVIDIA GPU is visible (no /dev/nvidia* device)")
    lib = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
    if lib.is_file():
        try:
            ctypes.CDLL(str(lib))
        except OSError as e:
            missing = str(e).split(":", 1)[0].strip()
            reasons.append(f"{missing} cannot be loaded" if missing.startswith("lib") else str(e).splitlines()[0])
    return "; ".join(reasons) or "the GPU or its driver is unusable (run with --verbose for onnxruntime's log)"


def _preload_cuda() -> None:
    """Load CUDA / cuDNN from the nvidia pip wheels so the CUDA EP finds them (a CUDA build of torch imported
    earlier has done this already); best effort: the session reports what really loaded."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(Exception):
        preload()


def _load_error(path: Path, e: Exception) -> str:
    text = str(e)
    if "INVALID_PROTOBUF" in text or "No graph was found" in text or "Protobuf parsing failed" in text:
        return f"{path.name} is not an ONNX model"
    first = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return f"onnxruntime cannot load {path.name}: {first}"
