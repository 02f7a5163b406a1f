"""Layer graph → Python source of nn.Module classes (the torch backend is generated code, not an interpreter).

``model_source(graph)`` gives the source of one module: a class per distinct scope structure (identical
blocks share one ``Block`` in an ``nn.ModuleList``), standard torch modules where they fit and the layer
library (``specc.backends.torch.layers``) for the rest. ``build_torch`` executes it; ``specc compile
--target python`` writes it, with the library definitions it uses inlined, as a standalone model.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ....ir.graph import LayerGraph
from .. import layers
from .classes import plan_classes
from .emitters import EMITTERS, lit
from .facts import STEP_INPUTS, runtime_meta
from .scopes import Scope, build_tree, dynamic_values, signatures
from .sizes import Sizes
from .writer import Writer

__all__ = ["EMITTERS", "GeneratedSource", "model_source"]

LIBRARY = tuple(layers.__all__)  # the names generated code may import (only those it uses are)


@dataclass(frozen=True)
class GeneratedSource:
    body: str  # the classes, without imports
    root: str  # the model's class name
    library: tuple[str, ...]  # layer-library names the body uses

    def text(self) -> str:
        """A complete module that imports the layer library from specc."""
        names = ",\n    ".join(n if n != "Model" else "SpeccModel as Model" for n in self.library)
        return f"{IMPORTS}from specc.backends.torch.layers import (\n    {names},\n)\n\n\n{self.body}"


IMPORTS = "from typing import Any, ClassVar\n\nimport torch\nimport torch.nn.functional as F\n"
IMPORTS += "from torch import Tensor, nn\n\n"


def residual_pattern(graph: LayerGraph) -> str:
    """One regular expression for the parameters initialised with the residual std (block numbers generalised)."""
    names = sorted(
        {re.sub(r"\\\.\d+\\\.", r"\\.\\d+\\.", re.escape(n)) for n, p in graph.params().items() if p.init == "residual"}
    )
    return f"^(?:{'|'.join(names)})$" if names else "$^"


def tied_params(graph: LayerGraph) -> dict[str, str]:
    """Parameter of a tied op → the parameter it is (the IR's ``tied_to``): the model's ``TIED`` table."""
    return {f"{op.name}.weight": op.tied_to for op in graph.ops() if op.tied_to is not None}


def model_source(graph: LayerGraph, sizes: Sizes | None = None, docs: bool = False) -> GeneratedSource:
    """The module's source; with ``sizes`` (model.py) the constructors read them from a ``Config`` ``c``;
    ``docs``: a one-line docstring per class (what it holds, in order)."""
    meta = dict(graph.meta)
    task = meta["task"]
    step = STEP_INPUTS.get(task)
    follow = meta.get("positions_follow")  # decided by lowering
    root = build_tree(graph)
    signatures(root, graph, dynamic_values(graph, step, [follow] if follow else []))
    plans = plan_classes(root, task)
    w = Writer(graph, plans, root, follow, generates=step is not None, sizes=sizes)
    sized = sizes.meta(runtime_meta(graph)) if sizes is not None else {}
    chunks = []
    for plan in plans.values():
        is_root = plan.rep is root
        base = "Model" if is_root else "nn.Module"
        lines = [f"class {plan.name}({base}):"]
        if is_root:
            lines += _root_facts(graph, meta, step, sized)
        elif docs:
            lines += [f'    """{_summary(plan.rep)}"""', ""]
        params = "".join(f", {name}" for name in plan.params.values())
        if sizes is None:
            lines += [f"    def __init__(self{params}):", "        super().__init__()"]
        elif is_root:
            lines += [f"    def __init__(self, config: Config | None = None{params}):", "        super().__init__()"]
            lines += ["        c = self.config = config or Config()"]
            if sized:  # a variant's own table length and residual std
                lines += [f"        self.META = self.META | dict({', '.join(f'{k}={v}' for k, v in sized.items())})"]
        else:
            lines += [f"    def __init__(self, c: Config{params}):", "        super().__init__()"]
        lines += [f"        {line}" for line in w.init_lines(plan)]
        if is_root and tied_params(graph):
            lines.append("        self.tie_weights()  # each TIED weight IS its owner's Parameter")
        lines += ["", f"    def forward(self, {', '.join(w.forward_params(plan))}):"]
        lines += [f"        {line}" for line in w.forward_lines(plan)]
        chunks.append("\n".join(lines))
    body = "\n\n\n".join(chunks) + "\n"
    used = tuple(n for n in LIBRARY if re.search(rf"\b{n}\b", body))
    return GeneratedSource(body, plans[("root",)].name, used)


def _summary(scope: Scope) -> str:
    """``blocks.*: norm1 → attn → norm2 → mlp.`` (its modules in call order), cut to one line."""
    path = re.sub(r"\.\d+(?=\.|$)", ".*", scope.path)
    held = [u for u in scope.units if u.scope is not None or EMITTERS[u.op.kind].ctor is not None]  # type: ignore[union-attr]
    parts = list(dict.fromkeys(u.key.partition(".")[0] for u in held))
    text = f"{path}: {' → '.join(parts)}."
    return text if len(text) <= 110 else text[: text.rfind(" → ", 0, 106)] + " → …"


def _root_facts(graph: LayerGraph, meta: dict, step: str | None, sized: dict[str, str]) -> list[str]:
    doc = f'    """{meta.get("name", "model")}: {meta.get("family", "")}, generated by specc from its layer graph."""'
    runtime = runtime_meta(graph)  # what the code reads; model.graph has the rest
    runtime = {k: v for k, v in runtime.items() if k not in sized}  # set per instance, from its Config
    values = {k: _residual(v, runtime["init_std"]) if k == "residual_std" else lit(v) for k, v in runtime.items()}
    return [
        doc,
        "",
        f"    INPUTS, OUTPUTS = {lit(tuple(graph.inputs))}, {lit(tuple(graph.outputs))}",
        f"    STEP_INPUT = {lit(step)}",
        *([f"    TIED: ClassVar[dict[str, str]] = {lit(tied_params(graph))}"] if tied_params(graph) else []),
        f"    RESIDUAL = {_long_raw(residual_pattern(graph))}",
        *_meta_lines([f"{k}={v}" for k, v in values.items()]),
        "",
    ]


def _meta_lines(items: list[str], width: int = 120) -> list[str]:
    """``META = dict(...)``, continued by ``META |= dict(...)`` lines where one line would be too long (rather
    than one line per fact); model.py's formatter wraps a single fact too long for a line of its own."""
    lines = ["    META: ClassVar[dict[str, Any]] = dict("]
    for item in items:
        if lines[-1].endswith("(") or len(lines[-1]) + len(item) + 3 <= width:
            lines[-1] += ("" if lines[-1].endswith("(") else ", ") + item
        else:
            lines[-1] += ")"
            lines.append(f"    META |= dict({item}")
    return [*lines[:-1], lines[-1] + ")"]


def _residual(std: float, init_std: float) -> str:
    """``init_std / sqrt(2 · layers)`` as that expression where it gives the same float, else the literal."""
    k = round((init_std / std) ** 2) if std else 0
    expr = f"{init_std!r} / {k}**0.5"
    return expr if k > 1 and init_std / k**0.5 == std else lit(std)  # the same float arithmetic the file will do


def _long_raw(pattern: str, width: int = 96) -> str:
    """A raw-string literal, split at ``|`` into implicitly concatenated lines when it is long."""
    if len(pattern) <= width:
        return f'r"{pattern}"'
    parts, line = [], ""
    for piece in pattern.split("|"):
        if line and len(line) + len(piece) > width:
            parts.append(line + "|")
            line = ""
        line += ("" if not line else "|") + piece
    parts.append(line)
    return "(\n" + "".join(f'        r"{p}"\n' for p in parts) + "    )"
