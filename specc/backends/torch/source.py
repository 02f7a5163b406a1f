"""Load generated model source as a real module, by the source's hash (``specc._generated``).

The module is executed from the source text itself and registered with linecache and ``sys.modules``, so
tracebacks, ``pdb``, ``inspect.getsource`` and profilers show the generated lines and pickling works; the source
is kept in specc's private, checked cache so that a pickled model loads in another process.
"""

from __future__ import annotations

from ... import _generated
from ...ir.graph import LayerGraph
from .codegen import GeneratedSource, model_source
from .layers import Model


def load_source(src: GeneratedSource, name: str = "model") -> type[Model]:
    """The root class of ``src`` (the same class for the same source: loading it twice gives nothing new)."""
    text = src.text()
    cls = getattr(_generated.load(text, name), src.root)
    cls.SOURCE = text
    return cls


def model_class(graph: LayerGraph) -> type[Model]:
    return load_source(model_source(graph), str(graph.meta.get("name", "model")))
