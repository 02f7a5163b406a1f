"""Typed op attributes: every op of every preset carries its kind's frozen dataclass, a bad attribute fails
when the graph is built (naming op and field), and the torch layers' constructor defaults are the declared ones."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from specc.ir.attrs import OpAttrs, OpAttrsError
from specc.ir.graph import LayerGraph
from specc.ir.lower import lower
from specc.ir.ops import CATALOGUE, AttentionAttrs, MoEAttrs, RNNDecoderAttrs
from specc.spec.loader import load_spec
from specc.spec.presets import preset_names


@pytest.mark.parametrize("preset", preset_names())
def test_every_op_of_every_preset_has_its_kinds_attrs_class(preset: str) -> None:
    graph = lower(load_spec(preset))
    kinds = set()
    for op in graph.ops():
        cls = CATALOGUE[op.kind].attrs
        assert type(op.attrs) is cls, f"{op.name}: {type(op.attrs).__name__} is not {cls.__name__}"
        assert dataclasses.is_dataclass(op.attrs) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        kinds.add(op.kind)
    assert "linear" in kinds


def test_one_class_per_kind_each_frozen() -> None:
    classes = [d.attrs for d in CATALOGUE.values()]
    assert len(set(classes)) == len(classes)
    for kind, d in CATALOGUE.items():
        assert issubclass(d.attrs, OpAttrs) and d.attrs.kind == kind
    a = AttentionAttrs(heads=2, kv_heads=1, head_dim=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.heads = 3  # type: ignore[misc]


def test_attrs_compare_and_hash_by_value_dict_fields_included() -> None:
    one = AttentionAttrs(heads=2, kv_heads=1, head_dim=4, rope_scaling={"type": "linear", "factor": 2.0})
    two = AttentionAttrs(heads=2, kv_heads=1, head_dim=4, rope_scaling={"factor": 2.0, "type": "linear"})
    other = dataclasses.replace(one, rope_scaling={"type": "linear", "factor": 4.0})
    assert one == two and hash(one) == hash(two) and len({one, two, other}) == 2
    with pytest.raises(OpAttrsError, match="'heads'"):
        dataclasses.replace(one, heads=2.5)  # replace() checks types too


def _graph() -> LayerGraph:
    g = LayerGraph()
    g.add_input("input_ids", ("B", "N"), "int64")
    g.add("embedding", "embed", ["input_ids"], "embed", vocab=10, dim=8)
    return g


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"in_features": 8, "out_features": 4, "bias": True, "tied": "embed.weight"}, "unknown attribute 'tied'"),
        ({"in_features": 8, "bias": True}, "missing attribute 'out_features'"),
        ({"in_features": 8, "out_features": "4"}, "attribute 'out_features': '4' (str) is not int"),
        ({"in_features": 8, "out_features": 4, "bias": 1}, "attribute 'bias': 1 (int) is not bool"),
        ({"in_features": 8, "out_features": 4, "init": "uniform"}, "attribute 'init': 'uniform'"),
    ],
)
def test_a_bad_attribute_fails_at_graph_build_naming_op_and_field(attrs: dict[str, Any], message: str) -> None:
    g = _graph()
    with pytest.raises(OpAttrsError) as info:
        g.add("linear", "blocks.0.attn.qkv", ["embed"], "qkv_proj", **attrs)
    assert "op blocks.0.attn.qkv (linear" in str(info.value) and message in str(info.value)
    assert "blocks.0.attn.qkv" not in g.graph  # nothing half-added


def test_serialised_attrs_leave_out_unset_optional_fields() -> None:
    g = _graph()
    g.add("linear", "head", ["embed"], "lm_head", in_features=8, out_features=10, bias=False, tied_to="embed.weight")
    g.add("linear", "fc", ["embed"], "mlp", in_features=8, out_features=4)
    ops = {o["name"]: o["attrs"] for o in g.to_dict()["ops"]}
    assert ops["embed"] == {"vocab": 10, "dim": 8, "scale": 1.0}
    assert ops["head"] == {"in_features": 8, "out_features": 10, "bias": False, "tied_to": "embed.weight"}
    assert ops["fc"] == {"in_features": 8, "out_features": 4, "bias": True}
    assert g.op("head").params == {} and g.op("fc").params["weight"].init == "normal"


ROPE_INTERLEAVED = "rope_interleaved"


def _defaults(fn: Any, rename: dict[str, str] | None = None) -> dict[str, Any]:
    rename = rename or {}
    return {
        rename.get(n, n): p.default
        for n, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty and n != "rope"
    }


@pytest.mark.parametrize(
    ("layer", "cls", "rename"),
    [
        ("SelfAttention", AttentionAttrs, {}),
        ("Rotary", AttentionAttrs, {"theta": "rope_theta", "interleaved": ROPE_INTERLEAVED}),
        (
            "ScaledRotary",
            AttentionAttrs,
            {"theta": "rope_theta", "scaling": "rope_scaling", "interleaved": ROPE_INTERLEAVED},
        ),
        ("MoE", MoEAttrs, {}),
        ("RNNDecoder", RNNDecoderAttrs, {}),
    ],
)
def test_layer_defaults_are_the_declared_ones(layer: str, cls: type[OpAttrs], rename: dict[str, str]) -> None:
    # The codegen leaves an argument out when it equals the declared default: the layer must then agree.
    from specc.backends.torch import layers

    given = _defaults(getattr(layers, layer).__init__, rename)
    assert given, layer
    for name, value in given.items():
        assert cls.default(name) == value, f"{layer}({name}={value!r}) vs {cls.__name__}.{name}"
