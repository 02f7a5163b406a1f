"""write_model_py: a standalone, readable model.py that needs torch (and safetensors for weights), not specc.

The file is the runtime (runtime.py, verbatim but for its module docstring), the graph as data (one ``Op``
line per op), and a ``build()`` function. ``build()`` creates the same module with the same state-dict names
and the same seeded initialisation as ``specc.build_torch``.
"""

from __future__ import annotations

import ast
import os
import pprint
import re
from pathlib import Path
from typing import Any

import torch

from ... import __version__
from ...io import atomic_write
from ...spec.serialize import spec_dict
from . import runtime
from .build import as_graph, graph_data
from .checkpoint import _spec_model, compile_checkpoint


def runtime_source() -> str:
    """runtime.py without its module docstring (model.py has its own)."""
    text = Path(runtime.__file__).read_text(encoding="utf-8")
    tree = ast.parse(text)
    first = tree.body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant), "runtime.py starts with a docstring"
    return "\n".join(text.splitlines()[first.end_lineno :]).strip() + "\n"


BLOCK = re.compile(r"^(?P<prefix>(?:\w+\.)?)blocks\.(?P<i>\d+)\.")


def _op_source(op: runtime.Op, name: str, inputs: list[str]) -> str:
    stack = f", stack={op.stack!r}" if op.stack else ""
    args = f"({inputs[0]},)" if len(inputs) == 1 else f"({', '.join(inputs)})"
    return f"Op({name}, {op.kind!r}, {args}, {op.attrs!r}, {op.params!r}{stack}),"


class _Blocks:
    """A run of n identical blocks (``<prefix>blocks.<i>.*``), emitted as one function chained by ``repeat``."""

    def __init__(self, prefix: str, blocks: list[list[runtime.Op]], x: str):
        self.prefix, self.blocks, self.x = prefix, blocks, x

    @property
    def function(self) -> str:
        return f"{self.prefix.rstrip('.')}_block" if self.prefix else "block"

    def _inputs(self, i: int, x: str, op: runtime.Op) -> list[tuple[str, str]]:
        """Each input as (kind, value): a value of this block, the block input, or a fixed name."""
        own = f"{self.prefix}blocks.{i}."
        return [
            ("own", v[len(own) :]) if v.startswith(own) else ("x", "") if v == x else ("fixed", v) for v in op.inputs
        ]

    def is_regular(self) -> bool:
        """True when every block equals block 0 with its index and input substituted."""
        x, first = self.x, self.blocks[0]
        for i, ops in enumerate(self.blocks):
            own = f"{self.prefix}blocks.{i}."
            if [op.name[len(own) :] for op in ops] != [op.name[len(f"{self.prefix}blocks.0.") :] for op in first]:
                return False
            if any(
                (o.kind, o.attrs, o.params, o.stack) != (f.kind, f.attrs, f.params, f.stack)
                for o, f in zip(ops, first, strict=True)
            ):
                return False
            template = [self._inputs(0, self.x, op) for op in first]
            if [self._inputs(i, x, op) for op in ops] != template:
                return False
            x = ops[-1].name
        return True

    def source(self) -> str:
        lines = [
            f"def {self.function}(i: int, x: str) -> list[Op]:",
            f'    """The ops of {self.prefix.replace(".", " ")}block i, reading the value x."""',
            f'    p = f"{self.prefix}blocks.{{i}}"',
            "    return [",
        ]
        for op in self.blocks[0]:
            inputs = [
                f'f"{{p}}.{v}"' if kind == "own" else "x" if kind == "x" else repr(v)
                for kind, v in self._inputs(0, self.x, op)
            ]
            local = op.name[len(f"{self.prefix}blocks.0.") :]
            lines.append("        " + _op_source(op, f'f"{{p}}.{local}"', inputs))
        lines.append("    ]")
        return "\n".join(lines)


def _segments(ops: list[runtime.Op]) -> list[runtime.Op | _Blocks]:
    """The op list with each run of regular repeated blocks folded into one _Blocks."""
    out: list[runtime.Op | _Blocks] = []
    i = 0
    while i < len(ops):
        match = BLOCK.match(ops[i].name)
        if not match or match["i"] != "0" or i == 0:
            out.append(ops[i])
            i += 1
            continue
        prefix, blocks, j = match["prefix"], [], i
        while j < len(ops) and ops[j].name.startswith(f"{prefix}blocks.{len(blocks)}."):
            k = j
            while k < len(ops) and ops[k].name.startswith(f"{prefix}blocks.{len(blocks)}."):
                k += 1
            blocks.append(ops[j:k])
            j = k
        run = _Blocks(prefix, blocks, ops[i - 1].name)
        if run.is_regular():
            out.append(run)
            i = j
        else:
            out.append(ops[i])
            i += 1
    return out


def _graph_source(graph: runtime.Graph) -> str:
    segments = _segments(graph.ops)
    functions = [seg.source() for seg in segments if isinstance(seg, _Blocks)]
    entries = []
    for seg in segments:
        if isinstance(seg, _Blocks):
            entries.append(f"    *repeat({seg.function}, {len(seg.blocks)}, {seg.x!r}),")
        else:
            entries.append("    " + _op_source(seg, repr(seg.name), [repr(v) for v in seg.inputs]))
    repeat = (
        "def repeat(block: Callable[[int, str], list[Op]], n: int, x: str) -> list[Op]:\n"
        '    """n blocks in sequence, each reading the output (last op) of the one before."""\n'
        "    ops: list[Op] = []\n"
        "    for i in range(n):\n"
        "        ops += block(i, x)\n"
        "        x = ops[-1].name\n"
        "    return ops\n"
    )
    parts = [repeat, *functions] if functions else []
    ops = "\n".join(entries)
    header = "    # Op(scope name, kind, inputs, attributes, {local parameter name: (shape, init rule)})"
    return "\n\n\n".join(parts) + ("\n\n\n" if parts else "") + f"OPS = [\n{header}\n{ops}\n]"


def model_source(spec_json: dict[str, Any], graph: runtime.Graph, weights_file: str | None) -> str:
    name = graph.meta.get("name", "model")
    usage = {
        "causal_lm": [("logits = model(input_ids)", "[B, N, vocab]"), ("tokens = model.generate(input_ids, 20)", "")],
        "seq2seq": [("logits = model(input_ids, decoder_input_ids)", "[B, N_dec, vocab]"),
                    ("tokens = model.generate(input_ids, 20)", "")],
        "image_classification": [("logits = model(pixel_values)", "[B, classes]")],
    }.get(graph.meta["task"], [("out = model(input_ids)", "logits, or a dict of outputs")])  # fmt: skip
    usage = [("model = build()", "weights: WEIGHTS, or the spec's seeded initialisation"), *usage]
    usage.append(("with model.attention_maps() as maps: model(...)", "attention probabilities by scope name"))
    example = "\n    ".join(f"{code:<48} # {note}" if note else code for code, note in usage)
    header = f'''"""{name}: a standalone PyTorch model written by specc {__version__} (`specc compile --target python`).

It needs torch (and safetensors to load weights) and does not import specc. The model is the graph at the
end of this file, run by the small executor before it: each entry of OPS is one op (scope name, kind,
inputs, attributes, parameters as (shape, init rule)); parameters live at their scope names, so
``model.state_dict()`` keys match specc checkpoints.

    {example}
"""

'''
    ops = _graph_source(graph)
    graph_part = f'''

# ================================================================================= this model

SPEC = {pprint.pformat(spec_json, width=116, sort_dicts=False)}

META = {pprint.pformat(graph.meta, width=116, sort_dicts=False)}
INPUTS = {graph.inputs!r}
OUTPUTS = {graph.outputs!r}
{ops}
GRAPH = Graph(META, INPUTS, OUTPUTS, OPS)
WEIGHTS = {weights_file!r}  # safetensors beside this file, or None for the seeded initialisation


def build(weights: str | None = WEIGHTS, device: str | None = None, dtype: str | None = None) -> Model:
    """The model on ``device`` (default CPU) in ``dtype`` (default META["dtype"]), eval mode."""
    tensors = None
    if weights is not None:
        from pathlib import Path

        from safetensors.torch import load_file

        tensors = load_file(str(Path(__file__).resolve().parent / weights))
    return create(GRAPH, tensors=tensors, device=device, dtype=dtype)


if __name__ == "__main__":
    model = build()
    with torch.inference_mode():
        outputs = model.run(example_inputs(GRAPH))
    print({{name: tuple(value.shape) for name, value in outputs.items()}})
'''
    return header + runtime_source() + graph_part


def write_model_py(
    spec: Any, path: str | os.PathLike[str], weights: str | os.PathLike[str] | dict[str, torch.Tensor] | None = None
) -> Path:
    """Write the standalone model.py. With ``weights``, they are checked against the spec and written in specc
    names beside it (same stem, .safetensors), and ``build()`` loads them by default."""
    spec = _spec_model(spec)
    path = Path(path)
    weights_file = None
    if weights is not None:
        target = path.with_suffix(".safetensors")
        compile_checkpoint(spec, target, weights=weights)
        weights_file = target.name
    described = spec_dict(spec)
    source = model_source(described, graph_data(as_graph(spec)), weights_file)
    return atomic_write(path, source)
