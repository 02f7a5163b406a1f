"""Never allocate what will not fit: parameter bytes of a meta-device model against the memory available."""

from __future__ import annotations

import os

import torch

from ...errors import SpecError


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(model: torch.nn.Module, device: torch.device, name: str) -> None:
    """Raise a SpecError with the estimate when the parameters alone exceed the free memory of ``device``."""
    need = param_bytes(model)
    free = available_bytes(device)
    if need > free:
        params = sum(p.numel() for p in model.parameters())
        dtype = next(model.parameters()).dtype
        raise SpecError(
            f"{name} needs {gib(need)} for its {params:,} {str(dtype).removeprefix('torch.')} parameters, "
            f"but only {gib(free)} of memory is available on {device}",
            hint="nothing was allocated; try a smaller spec (--set blocks=...)"
            + (", --dtype bf16" if dtype == torch.float32 else "")
            + ", or `specc analyze` for the costs without weights",
        )
