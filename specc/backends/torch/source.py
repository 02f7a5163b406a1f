"""Load generated model source as a real module, cached by the source's hash.

The source is written to specc's cache folder as ``specc._generated.m_<hash>`` and imported from there, so
tracebacks, ``pdb``, ``inspect.getsource`` and profilers show the generated lines, and pickled models load in
another process. Where the cache folder cannot be written, the module is executed in memory (registered with
linecache and sys.modules: tracebacks and pickling within this process still work).
"""

from __future__ import annotations

import hashlib
import importlib
import linecache
import os
import sys
import tempfile
import types

from ... import _generated
from ...ir.graph import LayerGraph
from .codegen import GeneratedSource, model_source
from .layers import Model

_CLASSES: dict[str, type[Model]] = {}


def load_source(src: GeneratedSource, name: str = "model") -> type[Model]:
    """The root class of ``src`` (the same class for the same source: loading it twice gives nothing new)."""
    text = src.text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:20]
    if digest not in _CLASSES:
        module_name = f"specc._generated.m_{digest}"
        module = _import_from_cache(module_name, text) or _exec_in_memory(module_name, text, name)
        cls = getattr(module, src.root)
        cls.SOURCE = text
        _CLASSES[digest] = cls
    return _CLASSES[digest]


def _import_from_cache(module_name: str, text: str) -> types.ModuleType | None:
    folder = _generated.folder()
    path = folder / f"{module_name.rsplit('.', 1)[1]}.py"
    try:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
            importlib.invalidate_caches()
        module = importlib.import_module(module_name)
    except (OSError, ImportError):
        return None
    return module if getattr(module, "__file__", None) == str(path) else None


def _exec_in_memory(module_name: str, text: str, name: str) -> types.ModuleType:
    filename = f"<specc generated {name} {module_name}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = types.ModuleType(module_name, f"specc-generated model {name}")
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(text, filename, "exec"), module.__dict__)
    return module


def model_class(graph: LayerGraph) -> type[Model]:
    return load_source(model_source(graph), str(graph.meta.get("name", "model")))
