"""Signals around a write: SIGTERM/SIGHUP raise while it runs (so temp files go), held back during renames."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_signal_depth = 0
_saved_handlers: dict[int, object] = {}
_CATCH = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While a write is in progress, SIGTERM / SIGHUP raise SystemExit (Ctrl-C already raises KeyboardInterrupt),
    so the ``finally`` that removes temporary files runs. Handlers a program installed itself are left alone."""
    global _signal_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _signal_depth == 0:
        for sig in _CATCH:
            prev = signal.getsignal(sig)
            if prev in (signal.SIG_DFL, None):
                _saved_handlers[sig] = prev
                signal.signal(sig, _exit_on_signal)
        if signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, None):
            _saved_handlers[signal.SIGINT] = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, signal.default_int_handler)
    _signal_depth += 1
    try:
        yield
    finally:
        _signal_depth -= 1
        if _signal_depth == 0:
            for sig, prev in _saved_handlers.items():
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)  # type: ignore[arg-type]
            _saved_handlers.clear()


@contextlib.contextmanager
def signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back while renames that belong together run (delivered right after)."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = {signal.SIGINT, *_CATCH}
    old = mask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)
