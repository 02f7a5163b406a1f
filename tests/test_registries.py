"""The four tables keyed by op kind cover the same kinds, and nothing writes into the op catalogue.

The tables: the catalogue (shapes, parameters) in ``specc.ir.ops``, the cost rules in ``specc.analysis.rules``,
the torch layer emitters in ``specc.backends.torch.codegen`` and the ONNX emitters in
``specc.backends.onnx.op_registry``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_CODEGEN = "specc.backends.torch.codegen"


def _onnx_kinds() -> set[str]:
    importlib.import_module("specc.backends.onnx.emit")  # imports every ops_* module, which fill the table
    return set(importlib.import_module("specc.backends.onnx.op_registry").EMITTERS)


def _torch_kinds() -> set[str]:
    # Skip only while the module does not exist; once it does, an import error is a failure like any other.
    if importlib.util.find_spec(TORCH_CODEGEN) is None:
        pytest.skip(f"{TORCH_CODEGEN} does not exist yet")
    return set(importlib.import_module(TORCH_CODEGEN).EMITTERS)


def _kinds(table: str) -> set[str]:
    if table == "cost rules":
        from specc.analysis.rules import RULES

        return set(RULES)
    return _onnx_kinds() if table == "onnx emitters" else _torch_kinds()


@pytest.mark.parametrize("table", ["cost rules", "onnx emitters", "torch emitters"])
def test_every_table_covers_the_catalogue_op_kinds(table: str) -> None:
    from specc.ir.ops import CATALOGUE

    kinds, catalogue = _kinds(table), set(CATALOGUE)
    assert (sorted(catalogue - kinds), sorted(kinds - catalogue)) == ([], []), "(missing, unknown) kinds"


SNAPSHOT = """
import dataclasses, json, sys
from specc.ir.ops import CATALOGUE

def snapshot():
    # every attribute of every entry, fields or not: callables by identity, the rest by value
    return {
        kind: {k: repr(v) if not callable(v) else f"{v.__module__}.{v.__qualname__}@{id(v)}"
               for k, v in sorted(vars(op).items())}
        for kind, op in sorted(CATALOGUE.items())
    }

fields = sorted(f.name for f in dataclasses.fields(next(iter(CATALOGUE.values()))))
before = snapshot()
assert "specc.analysis" not in sys.modules, "the catalogue must be taken before the analyzer is imported"
import specc.analysis
import specc.analysis.rules
specc.analysis.analyze("gpt2", crossover=False)  # and using the rules changes nothing either
print(json.dumps({"fields": fields, "before": before, "after": snapshot()}))
"""


def test_importing_the_analyzer_leaves_the_catalogue_alone() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SNAPSHOT], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    r = json.loads(out.stdout)
    assert "flops" not in r["fields"] and "memory" not in r["fields"]  # cost rules are their own table
    assert r["before"].keys() == r["after"].keys()
    for kind in r["before"]:
        assert r["before"][kind] == r["after"][kind], kind


def test_an_op_kind_without_cost_rules_is_a_clear_error() -> None:
    from specc.analysis.rules import rules_for

    with pytest.raises(NotImplementedError, match=r"no cost rule for op kind 'warp' \(blocks.0.warp\): add"):
        rules_for("warp", "blocks.0.warp")


# The native decoding step is a fifth reader of the layer graph: its op table (decode_native.KINDS / CODES /
# FNS) and its ctypes Op must be decode_native.cpp's enums and struct, and name only catalogue op kinds.
NATIVE_CPP = ROOT / "specc/backends/torch/accel/decode_native.cpp"
C_TYPES = {"int32_t": "c_int", "int64_t": "c_long", "float": "c_float"}  # ctypes' names of the fixed widths


def _cpp_enum(source: str, name: str) -> list[str]:
    import re

    body = re.search(rf"enum {name} : int32_t \{{([^}}]*)\}};", source)
    assert body, f"enum {name} not found in {NATIVE_CPP.name}"
    return [item.strip() for item in body.group(1).split(",") if item.strip()]


def _cpp_struct_fields(source: str) -> list[tuple[str, str]]:
    """(name, ctypes type name) of each field of ``struct Op``, in order (pointers: c_void_p)."""
    import re

    body = re.search(r"struct Op \{(.*?)\n\};", source, re.S)
    assert body, f"struct Op not found in {NATIVE_CPP.name}"
    fields = []
    for line in body.group(1).splitlines():
        decl = line.split("//")[0].strip().rstrip(";")
        if not decl:
            continue
        kind, names = re.match(r"(?:const )?(\w+)(.*)", decl).groups()
        for item in names.split(","):
            item = item.strip()
            fields.append((item.lstrip("*").strip(), "c_void_p" if item.startswith("*") else C_TYPES[kind]))
    return fields


def test_the_native_step_op_table_is_the_cpp_one_and_names_catalogue_kinds() -> None:
    import ctypes

    from specc.backends.torch.accel import decode_native
    from specc.ir.ops import CATALOGUE

    source = NATIVE_CPP.read_text()
    assert [c.upper() for c in decode_native.CODES] == _cpp_enum(source, "Code")
    assert [f.upper() for f in sorted(decode_native.FNS, key=decode_native.FNS.get)] == _cpp_enum(source, "Fn")
    assert sorted(decode_native.FNS.values()) == list(range(len(decode_native.FNS)))
    assert sorted(set(decode_native.KINDS) - set(CATALOGUE)) == [], "op kinds the catalogue does not have"
    assert set(decode_native.CODES) == {c for c in decode_native.KINDS.values() if c}
    ours = [(name, getattr(t, "__name__", "")) for name, t in decode_native._Op._fields_]
    as_ctypes = [(n, getattr(ctypes, t).__name__) for n, t in _cpp_struct_fields(source)]
    assert ours == as_ctypes, "decode_native._Op is not decode_native.cpp's struct Op, field for field"
