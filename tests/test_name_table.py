"""The HF name tables: every family's table, run backwards then forwards, gives back every specc parameter exactly
(no transformers model needed: configs only); the table engine's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_families_zoo import FAMILY_CASES, missing_features
from test_hf_zoo import CASES, Case, transformers

import specc
from specc import SpecError
from specc.interop import import_hf, weight_map
from specc.interop import tensor_ops as ops
from specc.interop.name_table import Table, plan
from specc.interop.registry import by_architecture


def _graph(case: Case, tmp_path: Path) -> specc.LayerGraph:
    cls = getattr(transformers, case.arch).config_class
    data = {**cls(**case.config).to_dict(), "architectures": [case.arch]}
    (tmp_path / "config.json").write_text(json.dumps(data), encoding="utf-8")
    return specc.lower(import_hf(tmp_path).spec)


@pytest.mark.parametrize("case", [*CASES, *FAMILY_CASES], ids=lambda c: c.id)
def test_table_runs_backwards_then_forwards_to_the_same_parameters(case: Case, tmp_path: Path) -> None:
    if missing_features(case):
        pytest.skip(f"needs {missing_features(case)}")
    g = _graph(case, tmp_path)
    family = by_architecture(case.arch)
    p = family.plan(g, set())
    assert all(r.op[0] in ops.OPS for rules in p.rules.values() for r in rules)  # every operation is data
    gen = torch.Generator().manual_seed(0)
    params = {name: torch.randn(spec.shape, generator=gen) for name, spec in g.params().items()}
    present = {s for rules in p.rules.values() for s in rules[0].sources}  # every row's first alternative
    hf = weight_map.reverse(p, params, present)
    assert set(hf) == present
    back = weight_map.run(p, hf)
    assert back.keys() == params.keys()
    assert all(torch.equal(back[k], params[k]) for k in params)


def test_model_py_engine_knows_every_operation_a_table_uses() -> None:
    """standalone model.py's loader (HOW) implements the same operations as tensor_ops' engine; a slice of a
    fused tensor (narrow) it writes as parts of it, so that a smaller build(config=...) loads too."""
    from specc.backends.torch.standalone_names import HOW

    as_parts = {"narrow": "parts", "narrow_swap": "parts_swap"}
    assert set(HOW) == {as_parts.get(name, name) for name in ops.OPS}


def test_a_parameter_no_row_names_is_an_error_naming_it() -> None:
    g = specc.lower(specc.load_spec("gpt2"))
    table = Table("Tiny", {"embed.weight": "wte.weight"})
    with pytest.raises(SpecError, match=r"Tiny checkpoints have no tensor for pos\.weight"):
        plan(table, g, set())


def test_prefix_block_index_kind_and_tf_names_fill_in() -> None:
    g = _only(specc.lower(specc.load_spec("gpt2", ["blocks=2"])), "blocks.1.norm1", "blocks.1.mlp.fc1")
    rows = {
        "blocks.*.norm1.{k}": ["{p}h.*.ln_1.{k}", "{p}h.*.ln1.{tf}"],
        "blocks.*.mlp.fc1.weight": ("t", "{p}h.*.fc"),
        "blocks.*.mlp.fc1.bias": "{p}h.*.fc_b",
    }
    table = Table("Tiny", rows, prefix="transformer.")
    p = plan(table, g, {"transformer.h.1.ln_1.weight"})
    sources = [r.sources for r in p.rules["blocks.1.norm1.bias"]]
    assert sources == [("transformer.h.1.ln_1.bias",), ("transformer.h.1.ln1.beta",)]
    assert p.rules["blocks.1.mlp.fc1.weight"][0].op == ("t",)
    assert p.rules["blocks.1.mlp.fc1.weight"][0].expect == ((768, 3072),)  # stored [in, out]
    bare = plan(table, g, {"h.1.ln_1.weight"})  # a bare model's checkpoint: no prefix
    assert bare.rules["blocks.1.norm1.weight"][0].sources == ("h.1.ln_1.weight",)


def _only(g: specc.LayerGraph, *ops_: str) -> specc.LayerGraph:
    """A graph of just the ops named (the engine reads their parameters)."""
    from specc.ir.graph import LayerGraph

    small = LayerGraph(meta=g.meta)
    for name in ops_:
        small._ops[name] = g.op(name)
    return small
