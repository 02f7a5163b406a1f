"""For bench/ort_gemv.py's ``thp`` variants: back what onnxruntime allocated for a session (its weights,
pre-packed for MLAS) with transparent huge pages.

A decode step streams every weight once. With 4 KiB pages that is one TLB miss per 64 cache lines; on the
Linux default (THP ``madvise``) onnxruntime's allocations never get 2 MiB pages, since nothing advises them
(numpy's large arrays do). ``collapsed`` notes the process's anonymous mappings before the session is made,
and afterwards asks the kernel to collapse the new ones into huge pages (``MADV_COLLAPSE``, Linux 6.1+),
advising them ``MADV_HUGEPAGE`` first so later growth gets them too. Advice only: the memory's contents and
the session's results do not change, and where the kernel (or the platform) says no, nothing happens.
Measured there (a decode step of the KV-cache graphs): no gain clearly above the run-to-run noise, so the
runtime does not do it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Iterator
from pathlib import Path

MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE = 2 << 20
Span = tuple[int, int]


def anonymous_spans() -> list[Span]:
    """[start, end) of this process's private anonymous mappings (heap included), from /proc/self/maps."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split()
        name = parts[5] if len(parts) > 5 else ""
        if parts[1].startswith("rw") and parts[1].endswith("p") and name in ("", "[heap]"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            spans.append((lo, hi))
    return spans


def new_spans(before: list[Span], after: list[Span]) -> list[Span]:
    """The parts of ``after`` not covered by ``before``, cut to whole huge pages (what can be collapsed)."""
    out = []
    for lo, hi in after:
        pieces = [(lo, hi)]
        for blo, bhi in before:
            pieces = [p for a, b in pieces for p in ((a, min(b, blo)), (max(a, bhi), b)) if p[0] < p[1]]
        for a, b in pieces:
            a2, b2 = -(-a // HUGE) * HUGE, b // HUGE * HUGE
            if b2 > a2:
                out.append((a2, b2))
    return out


def advise(spans: list[Span]) -> int:
    """MADV_HUGEPAGE then MADV_COLLAPSE on each span; the bytes the kernel collapsed."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for lo, hi in spans:
        libc.madvise(lo, hi - lo, MADV_HUGEPAGE)
        if libc.madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
    return done


@contextlib.contextmanager
def collapsed(enabled: bool = True) -> Iterator[list[int]]:
    """Whatever the block allocates in new anonymous mappings ends up on huge pages (see the module doc); the
    list yielded gets the bytes collapsed."""
    done: list[int] = []
    if not enabled or not sys.platform.startswith("linux"):
        yield done
        return
    try:
        before = anonymous_spans()
    except OSError:
        yield done
        return
    yield done
    with contextlib.suppress(OSError):
        done.append(advise(new_spans(before, anonymous_spans())))
