"""write_model_py: the generated source as a standalone model.py that needs torch (and safetensors), not specc.

The file holds the layer-library definitions the model uses (nothing else), the generated classes, and a
``build()`` that creates the same module, with the same state-dict names and the same seeded initialisation,
as ``specc.build_torch``. It is formatted with ruff when ruff is installed.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

from ...io import atomic_write
from ...version import __version__
from .build import as_graph
from .checkpoint import _spec_model, compile_checkpoint
from .codegen import model_source
from .codegen.facts import STEP_INPUTS, model_facts
from .codegen.inline import inline
from .codegen.sizes import model_sizes
from .codegen.specialise import specialise
from .layers import FILES
from .standalone_names import names_source

LAYERS = Path(__file__).parent / "layers"
KEEP = {"build", "init_weights"}  # what model.py offers though nothing in it calls it
GENERATING = {"generate", "step", "start"}  # ... and where the model generates (a decoder, an encoder-decoder)


def _definitions() -> tuple[dict[str, tuple[str, str, set[str]]], dict[str, list[str]]]:
    """Top-level definitions of the layer library: name → (file, source, names it reads); imports per file."""
    defs: dict[str, tuple[str, str, set[str]]] = {}
    imports: dict[str, list[str]] = {}
    for file in FILES:
        text = (LAYERS / f"{file}.py").read_text(encoding="utf-8")
        tree = ast.parse(text)
        imports[file] = []
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if not (isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__")):
                    imports[file].append(ast.get_source_segment(text, node) or "")
                continue
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue  # the module docstring
            reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            for name in names:
                defs[name] = (file, _short_docstrings(text, node), reads)
    return defs, imports


def _short_docstrings(text: str, node: ast.stmt) -> str:
    """A definition's source with each class docstring cut to its first sentence and no function docstrings:
    the library's documentation lives in specc; model.py stays short."""
    lines = text.splitlines()[node.lineno - 1 : node.end_lineno]
    cut: list[tuple[int, int, list[str]]] = []
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if not isinstance(sub, (ast.ClassDef, ast.FunctionDef)) or not body:
            continue
        doc = body[0]
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        indent = lines[doc.lineno - node.lineno][: doc.col_offset]
        keep: list[str] = []
        if isinstance(sub, ast.ClassDef):
            keep = [f'{indent}"""{one_line(doc.value.value, 114 - len(indent))}"""']
        if len(body) == 1 and not keep:
            keep = [f"{indent}pass"]
        cut.append((doc.lineno - node.lineno, (doc.end_lineno or doc.lineno) - node.lineno, keep))
    for start, end, keep in sorted(cut, reverse=True):
        lines[start : end + 1] = keep
    return "\n".join(lines)


# a cut after one of these words leaves the clause open ("... rotated together or.")
DANGLING = {"a", "an", "and", "as", "at", "but", "by", "for", "from", "in", "into", "nor", "of", "on", "or", "than"}
DANGLING |= {"that", "the", "then", "to", "when", "where", "which", "with"}


def one_line(doc: str, width: int) -> str:
    """A docstring's first sentence; where it does not fit ``width`` columns, cut at the last ``; `` or ``: ``,
    else the last ``, `` or `` (``, else the last space, where the text before closes every bracket and
    backquote and does not end on a word that leaves the clause open."""
    text = " ".join(doc.split()).split(". ")[0].rstrip(".")
    if len(text) + 1 > width:
        head = text[: width - 1]
        strong = [m.start() for m in re.finditer(r"[;:](?= )", head) if m.start() > width // 3]
        weak = [m.start() for m in re.finditer(r",(?= )| (?=\()", head) if m.start() > width // 4]
        words = [m.start() for m in re.finditer(" ", head)]
        closed = [c for cuts in (strong, weak, words) if (c := [i for i in cuts if _closed(text[:i])])]
        text = text[: max(closed[0]) if closed else width - 1]
    return text.rstrip(",;:") + "."


def _closed(text: str) -> bool:
    """Whether ``text`` ends a clause: brackets and backquotes closed, its last word not a DANGLING one."""
    last = text.rstrip(",;:").rsplit(" ", 1)[-1].lower()
    opened = text.count("(") + text.count("[") - text.count(")") - text.count("]")
    return opened == 0 and text.count("`") % 2 == 0 and last not in DANGLING


def _bound_names(line: str) -> list[str]:
    node = ast.parse(line).body[0]
    assert isinstance(node, (ast.Import, ast.ImportFrom))
    return [(a.asname or a.name).split(".")[0] for a in node.names]


def _merged_imports(lines: list[str]) -> list[str]:
    """import lines merged per module and sorted as ruff's isort does: standard library first, then torch."""
    plain: set[str] = set()
    froms: dict[str, set[str]] = {}
    for line in lines:
        tree = ast.parse(line).body[0]
        if isinstance(tree, ast.Import):
            plain.update(f"{a.name} as {a.asname}" if a.asname else a.name for a in tree.names)
        elif isinstance(tree, ast.ImportFrom) and tree.module:
            froms.setdefault(tree.module, set()).update(a.name for a in tree.names)

    def group(torch_part: bool) -> list[str]:
        def mine(m: str) -> bool:
            return m.split(".")[0] == "torch" if torch_part else m.split(".")[0] != "torch"

        straight = sorted((p for p in plain if mine(p.split()[0])), key=str.lower)
        froms_ = sorted((m for m in froms if mine(m)), key=str.lower)
        names = {m: ", ".join(sorted(froms[m], key=lambda n: (not n[0].isupper(), n))) for m in froms_}
        return [*(f"import {p}" for p in straight), *(f"from {m} import {names[m]}" for m in froms_)]

    return [*group(False), "", *group(True)]


def library_source(needed: tuple[str, ...]) -> tuple[list[str], str]:
    """(import lines, definitions) of the library names ``needed`` and everything they read, in file order."""
    defs, imports = _definitions()
    want, todo = set(), list(needed)
    while todo:
        name = todo.pop()
        if name in want or name not in defs:
            continue
        want.add(name)
        todo += sorted(defs[name][2])
    chunks, files, seen = [], [], set()
    for name, (file, source, _) in defs.items():
        if name in want and source not in seen:
            seen.add(source)
            if file not in files:
                files.append(file)
            chunks.append(source)
    lines = sorted({line for f in files for line in imports[f]})
    return lines, "\n\n\n".join(chunks)


def model_py_source(spec: Any, weights_file: str | None) -> str:
    graph = as_graph(spec)
    sizes = model_sizes(graph)
    src = model_source(graph, sizes, docs=True)
    name = graph.meta.get("name", "model")
    names = names_source(graph)  # Hugging Face checkpoint names, where a family fits
    imports, library = library_source((*src.library, "Model", *(["from_hf"] if names else [])))
    base = [
        "from typing import Any, ClassVar",
        "from dataclasses import dataclass",
        "import torch",
        "import torch.nn.functional as F",
        "from torch import Tensor, nn",
        "from pathlib import Path",
    ]

    usage = f"model = build(); {_usage(src.body, src.root, graph)}"
    hf = " or Hugging Face" if names else ""
    header = f'''"""{name}, written by specc {__version__}: the layers it uses, then one class per kind of block.
Needs torch (safetensors for weights), not specc. build() loads WEIGHTS (specc{hf} names) or seeds them:
{usage}
"""

'''
    load = "from_hf(model, tensors, HF_NAMES, HOW, HF_TIED, HF_SKIP)" if names else "tensors"
    config_arg = "config" if sizes else ""
    config_doc = "; ``config``: other sizes." if sizes else "."
    config_class = ("\n".join(sizes.source(name)) + "\n\n\n") if sizes else ""
    config = ", config: Config | None = None" if sizes else ""
    tail = f'''

{names}WEIGHTS = {weights_file!r}  # safetensors beside this file, or None for the seeded initialisation
DTYPES = {{"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}}


def build(weights: str | None = WEIGHTS, device: str | None = None, dtype: str | None = None{config}) -> {src.root}:
    """The model on ``device`` (default CPU) in ``dtype`` (the spec's), in eval mode{config_doc}"""
    dt, device = DTYPES[dtype or {src.root}.META["dtype"]], device or "cpu"
    with torch.device("meta"):
        model = {src.root}({config_arg}).to(dt)
    if weights is None:
        return model.to_empty(device=device).init_weights().eval()
    from safetensors.torch import load_file
    tensors = load_file(str(Path(__file__).resolve().parent / weights), device=device)
    model.load_state_dict({load}, assign=True)
    return model.to(dt).eval()
'''
    facts = model_facts(graph)
    if graph.meta["task"] == "causal_lm" and "state = state or State(" in src.body:  # the root's State reaches all
        facts.update({"state is not None": [True], "state is None": [False]})
    if ".#." not in names:  # no per-expert tensors in the table: from_hf never expands ``#``
        facts['any("#" in s for s in sources)'] = [False]
    keep = KEEP | (GENERATING if graph.meta["task"] in STEP_INPUTS else set())
    used = specialise(library + "\n\n\n" + config_class + src.body + tail, facts, keep=keep)
    used = inline(used, keep)  # the seams of the library that serve one use here
    imports = [i for i in [*imports, *base] if any(re.search(rf"\b{n}\b", used) for n in _bound_names(i))]
    imports = _merged_imports(imports)
    text = header + "\n".join(imports) + "\n\n\n" + used
    return ruff_format(text)


def _usage(body: str, root: str, graph: Any) -> str:
    """The header's example call, read from the root's ``forward`` (its required arguments) and the graph's outputs:
    what a call returns and, where the model generates, how."""
    cls = next(n for n in ast.parse(body).body if isinstance(n, ast.ClassDef) and n.name == root)
    forward = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward")
    required = forward.args.args[1 : len(forward.args.args) - len(forward.args.defaults)]  # after self
    args = [a.arg for a in required]
    call, outputs = f"model({', '.join(args)})", list(graph.outputs)
    room = 120 - len("model = build(); ")  # the header line stays within ruff's line length
    if outputs == ["logits"]:
        text = f"logits = {call}"
    elif "logits" in outputs:
        text = f"logits = {call}  # return_all=True: a dict of {', '.join(outputs)}"
    else:
        text = f"out = {call}  # a dict of {', '.join(outputs)}"
        text = text if len(text) <= room else f"out = {call}  # a dict of the {len(outputs)} OUTPUTS"
    if graph.meta["task"] in STEP_INPUTS:
        text += f"; tokens = model.generate({args[0]}, 20)"
        note = "  # KV cache, sampling options"
        text += note if len(text + note) <= room else ""
    return text


def ruff_format(text: str) -> str:
    """The text as ``ruff format`` writes it (line length 120), or unchanged where ruff is not installed."""
    ruff = shutil.which("ruff")
    if ruff is None:
        return text
    done = subprocess.run(
        [ruff, "format", "--line-length", "120", "--stdin-filename", "model.py", "-"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout if done.returncode == 0 else text


def write_model_py(
    spec: Any,
    path: str | os.PathLike[str],
    weights: str | os.PathLike[str] | dict[str, torch.Tensor] | None = None,
    last: bool = False,
) -> Path:
    """Write the standalone model.py. With ``weights``, they are checked against the spec and written in specc
    names beside it (same stem, .safetensors), and ``build()`` loads them by default. ``last``: model.py is the
    command's final output."""
    spec = _spec_model(spec)
    path = Path(path)
    weights_file = None
    if weights is not None:
        target = path.with_suffix(".safetensors")
        compile_checkpoint(spec, target, weights=weights)
        weights_file = target.name
    return atomic_write(path, model_py_source(spec, weights_file), last=last)
