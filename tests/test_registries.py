"""The four tables keyed by op kind cover the same kinds, and nothing writes into the op catalogue.

The tables: the catalogue (shapes, parameters) in ``specc.ir.ops``, the cost rules in ``specc.analysis.rules``,
the torch layer emitters in ``specc.backends.torch.codegen`` and the ONNX emitters in ``specc.backends.onnx.emit``.
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
    importlib.import_module("specc.backends.onnx")
    emit = importlib.import_module("specc.backends.onnx.emit")
    load = getattr(emit, "_load_emitters", None)  # the ops_* modules register themselves when first needed
    if load is not None:
        load()
    return set(emit.EMITTERS)


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
