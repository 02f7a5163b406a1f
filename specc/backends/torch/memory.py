"""Never allocate what will not fit: parameter bytes of a meta-device model against the memory available.

On the host, "available" is the tightest of three limits, whichever binds:

- ``MemAvailable`` of ``/proc/meminfo`` (what the kernel can hand out without swapping);
- the process's address-space limits, ``RLIMIT_AS`` (``ulimit -v``) and ``RLIMIT_DATA`` (``ulimit -d``), less
  what the process already maps (``VmSize`` / ``VmData`` of ``/proc/self/status``);
- its memory cgroup (v2 ``memory.max`` or v1 ``memory.limit_in_bytes``, at every level up the hierarchy), less
  the working set charged to it (usage minus the reclaimable inactive page cache).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import SpecError

UNLIMITED_V1 = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


# Each intra-op thread, started on the first parallel op, reserves its stack (8 MiB) and a glibc malloc arena
# (64 MiB): address space that RLIMIT_AS / RLIMIT_DATA count though little of it is ever resident.
THREAD_ADDRESS_SPACE = (8 + 64) << 20


@dataclass(frozen=True)
class Limit:
    bytes: int
    source: str  # which limit this is, for messages: "MemAvailable", "RLIMIT_AS (ulimit -v)", "cgroup memory.max"
    address_space: bool = False  # counts reserved address space (rlimits), not resident memory


@dataclass(frozen=True)
class Need:
    """What building a model holds at its peak: what it keeps, plus the largest transient copy on the way."""

    kept: int
    transient: int = 0
    transient_what: str = ""

    def against(self, limit: Limit) -> int:
        """Bytes needed under ``limit``: an address-space limit also pays for the threads' reservations."""
        threads = torch.get_num_threads() * THREAD_ADDRESS_SPACE if limit.address_space else 0
        return self.kept + self.transient + threads

    def extra(self, limit: Limit) -> str:
        parts = [f"{gib(self.transient)} for {self.transient_what}"] if self.transient else []
        if limit.address_space:
            parts.append(f"{gib(self.against(limit) - self.kept - self.transient)} of thread stacks and arenas")
        return f" and {gib(self.against(limit) - self.kept)} more while it builds ({', '.join(parts)})" if parts else ""


def shortfall(need: Need, device: torch.device) -> Limit | None:
    """The limit ``need`` exceeds by the most on ``device``, or None when it fits every one."""
    over = [(need.against(lim) - lim.bytes, lim) for lim in limits(device) if need.against(lim) > lim.bytes]
    return max(over, key=lambda o: o[0])[1] if over else None


def init_transient(model: torch.nn.Module) -> Need:
    """``init_weights`` draws each parameter whole in fp32 on the CPU (a shard's source too) before copying it in."""
    largest = max((p.numel() for p in model.parameters()), default=0)
    return Need(0, largest * 4, "the fp32 draw of its largest parameter")


def param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's free memory, or the tightest host limit (see the module docstring)."""
    return available(device).bytes


def available(device: torch.device) -> Limit:
    """The binding limit on ``device``, with what it is."""
    return min(limits(device), key=lambda lim: lim.bytes)


def limits(device: torch.device) -> list[Limit]:
    """Every memory limit that applies on ``device``."""
    if device.type == "cuda":
        return [Limit(int(torch.cuda.mem_get_info(device)[0]), f"{device} (free device memory)")]
    return host_limits()


def host_limits(
    meminfo: str | os.PathLike[str] = "/proc/meminfo",
    status: str | os.PathLike[str] = "/proc/self/status",
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
    mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo",
) -> list[Limit]:
    """Every host limit that applies (at least one: MemAvailable or the free physical pages)."""
    found = [_mem_available(meminfo)]
    found += rlimit_headroom(status)
    cg = cgroup_headroom(proc_cgroup, mountinfo)
    if cg is not None:
        found.append(cg)
    return found


def _mem_available(meminfo: str | os.PathLike[str]) -> Limit:
    fields = _kv_file(meminfo)
    if "MemAvailable" in fields:
        return Limit(fields["MemAvailable"] * 1024, "MemAvailable")
    try:
        return Limit(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical memory")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return Limit(1 << 62, "unknown")


def rlimit_headroom(status: str | os.PathLike[str] = "/proc/self/status") -> list[Limit]:
    """``RLIMIT_AS`` / ``RLIMIT_DATA`` less the address space / data segment the process already uses."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return []
    used = _kv_file(status)
    out = []
    for name, field, flag in (("RLIMIT_AS", "VmSize", "ulimit -v"), ("RLIMIT_DATA", "VmData", "ulimit -d")):
        which = getattr(resource, name, None)
        if which is None:
            continue
        soft = resource.getrlimit(which)[0]
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        out.append(Limit(max(0, soft - used.get(field, 0) * 1024), f"{name} ({flag})", address_space=True))
    return out


def cgroup_headroom(
    proc_cgroup: str | os.PathLike[str] = "/proc/self/cgroup",
    mountinfo: str | os.PathLike[str] = "/proc/self/mountinfo",
) -> Limit | None:
    """The smallest (limit − working set) over this process's memory cgroup and its ancestors; None: no limit."""
    try:
        groups = Path(proc_cgroup).read_text().splitlines()
        mounts = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    best: Limit | None = None
    for version, cg_path in _memory_cgroups(groups):
        for mount_root, mount_point in _cgroup_mounts(mounts, version):
            folder = _cgroup_folder(Path(mount_point), mount_root, cg_path)
            for lim in _walk_up(folder, Path(mount_point), version):
                if best is None or lim.bytes < best.bytes:
                    best = lim
    return best


def _memory_cgroups(lines: list[str]) -> list[tuple[int, str]]:
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            out.append((2, path))
        elif "memory" in controllers.split(","):
            out.append((1, path))
    return out


def _cgroup_mounts(lines: list[str], version: int) -> list[tuple[str, str]]:
    """(root of the mount inside the hierarchy, mount point) of every cgroup mount of that version."""
    out = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        if (version == 2 and fstype == "cgroup2") or (version == 1 and fstype == "cgroup" and "memory" in options):
            out.append((_unescape(fields[3]), _unescape(fields[4])))
    return out


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _cgroup_folder(mount_point: Path, mount_root: str, cg_path: str) -> Path:
    """The cgroup's folder under a mount; in a cgroup namespace the mount root is the process's own group."""
    rel = os.path.relpath(cg_path, mount_root) if cg_path.startswith(mount_root) else "."
    folder = (mount_point / rel).resolve() if rel != "." else mount_point
    return folder if folder.is_dir() and folder.is_relative_to(mount_point.resolve()) else mount_point


def _walk_up(folder: Path, mount_point: Path, version: int) -> list[Limit]:
    out = []
    top = mount_point.resolve()
    here = folder.resolve()
    while True:
        lim = _level(here, version)
        if lim is not None:
            out.append(lim)
        if here == top or here.parent == here:
            return out
        here = here.parent


def _level(folder: Path, version: int) -> Limit | None:
    if version == 2:
        limit, usage = _read_int(folder / "memory.max"), _read_int(folder / "memory.current")
        inactive = _kv_file(folder / "memory.stat", scale=1).get("inactive_file", 0)
        name = "cgroup memory.max"
    else:
        limit, usage = _read_int(folder / "memory.limit_in_bytes"), _read_int(folder / "memory.usage_in_bytes")
        stat = _kv_file(folder / "memory.stat", scale=1)
        inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
        name = "cgroup memory.limit_in_bytes"
        if limit is not None and limit >= UNLIMITED_V1:
            limit = None
    if limit is None:
        return None
    working = max(0, (usage or 0) - inactive)
    return Limit(max(0, limit - working), f"{name} ({folder})")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2): no limit


def _kv_file(path: str | os.PathLike[str], scale: int = 1) -> dict[str, int]:
    """``key: 123 kB`` / ``key 123`` lines → {key: 123}; missing or unreadable files give {}."""
    out: dict[str, int] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * scale
    return out


def gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(model: torch.nn.Module, device: torch.device, name: str, transient: Need | None = None) -> None:
    """Raise a SpecError with the estimate when building ``model`` on ``device`` would exceed a memory limit: its
    parameters, plus ``transient`` (the largest copy made on the way: init's fp32 draw by default), plus, under an
    address-space limit, what the threads reserve."""
    extra = transient if transient is not None else init_transient(model)
    need = Need(param_bytes(model), extra.transient, extra.transient_what)
    lim = shortfall(need, device)
    if lim is not None:
        params = sum(p.numel() for p in model.parameters())
        dtype = next(model.parameters()).dtype
        raise SpecError(
            f"{name} needs {gib(need.kept)} for its {params:,} {str(dtype).removeprefix('torch.')} parameters"
            f"{need.extra(lim)}, but only {gib(lim.bytes)} of memory is available on {device} (limited by "
            f"{lim.source})",
            hint="nothing was allocated; try a smaller spec (--set blocks=...)"
            + (", --dtype bf16" if dtype == torch.float32 else "")
            + ", or `specc analyze` for the costs without weights",
        )
