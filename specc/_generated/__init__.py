"""Generated model sources, one module per source (``m_<hash>.py``), kept in specc's cache folder.

The folder is on this package's ``__path__``, so a model pickled in one process (``torch.save(model)``) finds
its classes again in another process on the same machine: unpickling imports ``specc._generated.m_<hash>``.
"""

from __future__ import annotations

import os
from pathlib import Path


def folder() -> Path:
    """``$SPECC_CACHE/generated``, or ``~/.cache/specc/generated``."""
    base = os.environ.get("SPECC_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "specc")
    return Path(base).expanduser() / "generated"


__path__.append(str(folder()))
