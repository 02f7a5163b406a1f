"""Generated model sources as modules ``specc._generated.m_<hash>`` (hash: the source's SHA-256, 32 hex digits).

A module is always executed from source bytes whose hash is its name: compiled in memory under the file name of its
cache entry (registered with linecache, so tracebacks, ``pdb`` and ``inspect.getsource`` show the generated
lines) and entered in ``sys.modules`` (pickling within the process finds the classes). The source is also kept in
specc's private cache (``specc.cache``) as ``generated/m_<hash>.py``, so that a model pickled in one process
(``torch.save(model)``) loads in another: the finder below answers an import of ``specc._generated.m_<hash>``
by reading that entry as bytes, checking its hash against the name and executing those bytes. Nothing else is
ever imported from the folder: this package's ``__path__`` is empty (no package folder, no ``.pyc`` is read), and
no bytecode file is written.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import linecache
import re
import sys
import types

from .. import cache

__path__: list[str] = []  # no folder: modules come from the finder below or from ``load``

FOLDER = "generated"
DIGITS = 32  # of the SHA-256 in a module's name (128 bits)
SOURCE_BYTES = 64 << 20
_NAME = re.compile(rf"{re.escape(__name__)}\.m_([0-9a-f]{{{DIGITS}}})")


def load(text: str, label: str = "model") -> types.ModuleType:
    """The module executing ``text`` (the same module for the same text); ``label`` names it where the cache
    cannot be used (tracebacks then show ``<specc generated LABEL m_<hash>>``)."""
    data = text.encode("utf-8")
    key = cache.digest(data)[:DIGITS]
    name = f"{__name__}.m_{key}"
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__specc_digest__", None) == key:
        return module
    where = cache.folder(FOLDER)
    path = None
    if where is not None:
        entry = f"m_{key}.py"
        if cache.read_entry(where, entry, key, SOURCE_BYTES) is not None:
            path = where / entry
        else:  # missing or damaged: written afresh (where it cannot be, the module still runs from memory)
            path = cache.write_entry(where, entry, data)
    return _execute(name, key, text, str(path) if path else f"<specc generated {label} m_{key}>")


def _execute(name: str, key: str, text: str, filename: str, module: types.ModuleType | None = None) -> types.ModuleType:
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)  # mtime None: kept
    if module is None:
        module = types.ModuleType(name, "specc-generated model source")
        sys.modules[name] = module
    module.__file__ = filename
    module.__specc_digest__ = key
    try:
        exec(compile(text, filename, "exec", dont_inherit=True), module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    setattr(sys.modules[__name__], name.rpartition(".")[2], module)
    return module


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``specc._generated.m_<hash>`` from the verified cache entry (unpickling in a new process)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if _NAME.fullmatch(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        key = _NAME.fullmatch(module.__name__).group(1)  # type: ignore[union-attr]
        entry = f"m_{key}.py"
        where = cache.folder(FOLDER)
        data = cache.read_entry(where, entry, key, SOURCE_BYTES) if where is not None else None
        if data is None:
            raise ImportError(
                f"{module.__name__}: no cached source with this hash in specc's cache ({cache.root()}/{FOLDER}):"
                " build the model again (specc.build_torch) in this process before loading it",
                name=module.__name__,
            )
        _execute(module.__name__, key, data.decode("utf-8"), str(where / entry), module)  # type: ignore[operator]


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
