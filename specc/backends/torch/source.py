"""Execute generated model source as a real module: registered with linecache (tracebacks, pdb and profilers show
the generated lines) and in sys.modules (pickle and deepcopy find the classes), cached by the source's hash."""

from __future__ import annotations

import hashlib
import linecache
import sys
import types

from ...ir.graph import LayerGraph
from .codegen import GeneratedSource, model_source
from .layers import Model

_CLASSES: dict[str, type[Model]] = {}


def load_source(src: GeneratedSource, name: str = "model") -> type[Model]:
    """The root class of ``src`` (the same class for the same source: executing it twice gives nothing new)."""
    text = src.text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    if digest in _CLASSES:
        return _CLASSES[digest]
    module_name = f"specc_generated_{digest}"
    filename = f"<specc generated {name} {digest}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = types.ModuleType(module_name, f"specc-generated model {name}")
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(text, filename, "exec"), module.__dict__)
    cls = getattr(module, src.root)
    cls.SOURCE = text
    _CLASSES[digest] = cls
    return cls


def model_class(graph: LayerGraph) -> type[Model]:
    return load_source(model_source(graph), str(graph.meta.get("name", "model")))
