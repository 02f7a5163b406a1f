"""What CPU a bench ran on, in one line every bench prints: the model name, and for x86 the family / model
numbers and the widest vector ISA. Virtual machines often show a bare "AMD EPYC" for CPUs two generations
apart (Zen 3 without AVX-512, Zen 5 with it) whose GEMM peak and bandwidth differ 2-3x, so the name alone
does not say which machine a result holds for."""

from __future__ import annotations

import platform
import subprocess


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where it is missing)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
    except OSError:
        pass
    return fields


def _lscpu_name() -> str | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            return value.strip()
    return None


def vector_isa(flags: set[str]) -> str | None:
    """The widest x86 vector extension among cpuinfo ``flags``."""
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX")):
        if flag in flags:
            return name
    return None


def cpu_model() -> str:
    """E.g. ``AMD EPYC (family 26 model 2, AVX-512)``; the bare model name where cpuinfo has no more."""
    info = _cpuinfo()
    name = info.get("model name") or _lscpu_name() or platform.processor() or platform.machine()
    details = []
    if "cpu family" in info and "model" in info:
        details.append(f"family {info['cpu family']} model {info['model']}")
    isa = vector_isa(set(info.get("flags", "").split()))
    if isa:
        details.append(isa)
    return f"{name} ({', '.join(details)})" if details else name
