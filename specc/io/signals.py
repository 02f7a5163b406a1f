"""Signals around a write: SIGTERM/SIGHUP raise while it runs (so temp files go), held back during renames."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_signal_depth = 0
_saved_handlers: dict[int, object] = {}
_CATCH = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
_complete = False  # the command's final output is in place (``outputs_complete``)


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
    if _signal_depth == 0 and not _complete:
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
            if not _complete:  # after outputs_complete the signals stay ignored
                for sig, prev in _saved_handlers.items():
                    signal.signal(sig, prev if prev is not None else signal.SIG_DFL)  # type: ignore[arg-type]
            _saved_handlers.clear()


def outputs_complete() -> None:
    """The command's final output is in place: from here on SIGINT/SIGTERM/SIGHUP are ignored (one already
    pending is discarded), so a signal can no longer turn a finished command into a failure. Called inside
    ``signals_blocked`` right after the last rename, so that no signal lands in between."""
    global _complete
    if threading.current_thread() is not threading.main_thread():
        return
    _complete = True
    for sig in (signal.SIGINT, *_CATCH):
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def command_signals() -> Iterator[None]:
    """One command's signal dispositions, put back when it ends (``outputs_complete`` lasts until then)."""
    global _complete
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *_CATCH)}
    _complete = False
    try:
        yield
    finally:
        _complete = False
        for sig, prev in saved.items():
            if prev is not None:
                signal.signal(sig, prev)  # type: ignore[arg-type]


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
