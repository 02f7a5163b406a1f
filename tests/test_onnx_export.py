"""ONNX export structure: one fused attention node per attention layer, no Softmax, checker + shape inference,
metadata, dtypes, opsets, external data, and the export errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import specc
from specc.backends.onnx import save as save_mod
from specc.backends.onnx.export import export_onnx, step_path

TINY = ["blocks=2", "d_model=32", "attention.heads=4"]
SMALL = [*TINY, "context=32"]
SPECS = {
    "gpt2": ("gpt2", [*SMALL, "vocab_size=50", "mlp.hidden=64"]),
    "llama_gqa": ("llama2-7b", [*SMALL, "attention.kv_heads=2", "vocab_size=50", "mlp.hidden=48", "dtype=fp32"]),
    "mixtral": (
        "mixtral-8x7b",
        [*SMALL, "attention.kv_heads=2", "vocab_size=50", "mlp.hidden=48", "mlp.experts=4", "dtype=fp32"],
    ),
    "bert": ("bert-base", [*SMALL, "vocab_size=50", "mlp.hidden=64"]),
    "t5": ("transformer-base", [*SMALL, "vocab_size=50", "mlp.hidden=64"]),
    "vit": ("vit-b16", [*TINY, "image.size=16", "image.patch=8", "classes=5", "mlp.hidden=64"]),
}
ATTENTION_OPS = {"Attention", "MultiHeadAttention", "GroupQueryAttention"}


def _spec(name: str):
    preset, overrides = SPECS[name]
    return specc.load_spec(preset, overrides)


def _attention_layers(spec) -> int:
    return sum(1 for op in specc.lower(spec).ops() if op.kind == "attention")


@pytest.mark.parametrize("attention", ["standard", "contrib"])
@pytest.mark.parametrize("name", list(SPECS))
def test_one_fused_attention_node_per_layer_and_no_softmax(tmp_path: Path, name: str, attention: str) -> None:
    spec = _spec(name)
    path = export_onnx(spec, tmp_path / "m.onnx", attention=attention)
    model = onnx.load(str(path))
    ops = Counter(n.op_type for n in model.graph.node)
    fused = sum(ops[k] for k in ATTENTION_OPS)
    assert fused == _attention_layers(spec) > 0
    assert ops["Softmax"] == 0
    if attention == "standard":
        assert ops["Attention"] == fused
        assert all(n.domain == "" for n in model.graph.node)
    else:
        assert ops["Attention"] == 0
        assert {n.domain for n in model.graph.node if n.op_type in ATTENTION_OPS} == {"com.microsoft"}
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    logits = next(o for o in inferred.graph.output if o.name == "logits")
    assert logits.type.tensor_type.shape.dim[0].dim_param == "batch"  # dynamic batch axis


def test_gqa_and_rope_are_attributes_of_the_standard_node(tmp_path: Path) -> None:
    model = onnx.load(str(export_onnx(_spec("llama_gqa"), tmp_path / "m.onnx")))
    att = [n for n in model.graph.node if n.op_type == "Attention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in att[0].attribute}
    assert (attrs["q_num_heads"], attrs["kv_num_heads"], attrs["is_causal"]) == (4, 2, 1)
    assert sum(n.op_type == "RotaryEmbedding" for n in model.graph.node) == 2 * len(att)  # q and k per layer


def test_gqa_exports_as_group_query_attention_in_contrib(tmp_path: Path) -> None:
    model = onnx.load(str(export_onnx(_spec("llama_gqa"), tmp_path / "m.onnx", attention="contrib")))
    assert Counter(n.op_type for n in model.graph.node)["GroupQueryAttention"] == 2


def test_dynamic_axes_and_io_names(tmp_path: Path) -> None:
    model = onnx.load(str(export_onnx(_spec("t5"), tmp_path / "m.onnx")))
    ins = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    outs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    assert ins["input_ids"] == ["batch", "sequence"]
    assert ins["decoder_input_ids"] == ["batch", "decoder_sequence"]
    assert outs["logits"] == ["batch", "decoder_sequence", 50]
    model = onnx.load(str(export_onnx(_spec("gpt2"), tmp_path / "d.onnx", kv_cache=True)))
    ins = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    outs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output}
    assert ins["past_key_values.1.value"][::2] == ["batch", "past_sequence"]
    assert outs["present.0.key"][::2] == ["batch", "total_sequence"]
    assert [k for k in ins if k.startswith("past")] == [
        f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")
    ]  # encoder-decoder caches: tests/test_onnx_encdec.py


def test_initializers_are_named_after_ir_parameters(tmp_path: Path) -> None:
    spec = _spec("gpt2")
    model = onnx.load(str(export_onnx(spec, tmp_path / "m.onnx")))
    params = set(specc.lower(spec).params())
    inputs = {i.name for i in model.graph.input}
    named = {t.name for t in model.graph.initializer if not t.name.startswith("const/") and t.name not in inputs}
    assert named == params  # tied lm_head reuses embed.weight: no copy
    assert {t.name for t in model.graph.initializer} & inputs == {"position_ids"}  # the optional input's default


def test_metadata_holds_the_spec(tmp_path: Path) -> None:
    spec = _spec("bert")
    model = onnx.load(str(export_onnx(spec, tmp_path / "m.onnx")))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["specc.family"] == "encoder" and meta["specc.role"] == "model"
    again = specc.load_spec(json.loads(meta["specc.spec"]))
    assert specc.lower(again).num_params() == specc.lower(spec).num_params()
    assert json.loads(meta["specc.spec"])["vocab_size"] == 50


@pytest.mark.parametrize("dtype,elem", [("fp16", onnx.TensorProto.FLOAT16), ("bf16", onnx.TensorProto.BFLOAT16)])
def test_half_precision_exports_check(tmp_path: Path, dtype: str, elem: int) -> None:
    model = onnx.load(str(export_onnx(_spec("llama_gqa"), tmp_path / "m.onnx", dtype=dtype, kv_cache=True)))
    inputs = {i.name for i in model.graph.input}  # position_ids: an int64 input with a default
    params = [t for t in model.graph.initializer if not t.name.startswith("const/") and t.name not in inputs]
    assert params and all(t.data_type == elem for t in params)  # (rotary angles stay fp32, as in torch)
    out = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    assert out["logits"] == elem and out["present.0.key"] == elem


def test_opset_24(tmp_path: Path) -> None:
    path = export_onnx(_spec("gpt2"), tmp_path / "m.onnx", opset=24, kv_cache=True)
    model = onnx.load(str(path))
    assert {o.domain: o.version for o in model.opset_import}[""] == 24
    onnx.checker.check_model(model, full_check=True)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    past = {i.name: np.zeros((1, 4, 0, 8), np.float32) for i in sess.get_inputs() if i.name.startswith("past")}
    ids = np.array([[1, 2, 3]], np.int64)
    out = sess.run(["present.1.value"], {"input_ids": ids, "attention_mask": np.ones_like(ids), **past})
    assert out[0].shape == (1, 4, 3, 8)


def test_external_data_above_the_protobuf_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(save_mod, "PROTO_LIMIT", 1000)  # stands in for 2 GB
    path = export_onnx(_spec("gpt2"), tmp_path / "m.onnx")
    data = tmp_path / "m.onnx.data"
    assert data.is_file() and data.stat().st_size > path.stat().st_size
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 2, 3]], np.int64)
    assert sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0].shape == (1, 3, 50)
    assert not list(tmp_path.glob(".m.onnx*"))  # no temporary files left


def test_rnn_exports_two_graphs(tmp_path: Path) -> None:
    spec = specc.load_spec("gru-bahdanau", ["rnn.hidden=16", "rnn.embed=8", "vocab_size=20"])
    path = export_onnx(spec, tmp_path / "s2s.onnx")
    step = step_path(path)
    assert step.name == "s2s.decoder_step.onnx" and step.is_file()
    enc, dec = onnx.load(str(path)), onnx.load(str(step))
    assert {p.key: p.value for p in enc.metadata_props}["specc.decoder_step"] == step.name
    assert [i.name for i in dec.graph.input][:2] == ["decoder_input_ids", "state"]
    assert {"logits", "next_state", "attention_weights"} <= {o.name for o in dec.graph.output}


@pytest.mark.parametrize(
    "name,kwargs,message",
    [
        ("bert", {"kv_cache": True}, "needs a causal decoder"),
        ("gpt2", {"opset": 25}, "opset 25"),
        ("gpt2", {"dtype": "fp8"}, "dtype"),
        ("gpt2", {"attention": "flash"}, "attention op"),
    ],
)
def test_export_errors_are_spec_errors(tmp_path: Path, name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(specc.SpecError, match=message):
        export_onnx(_spec(name), tmp_path / "m.onnx", **kwargs)
    assert not (tmp_path / "m.onnx").exists()


def test_contrib_gqa_refuses_non_causal_masks(tmp_path: Path) -> None:
    spec = specc.load_spec(
        "llama2-7b",
        [
            *SMALL,
            "attention.kv_heads=2",
            "attention.mask=prefix",
            "attention.prefix=4",
            "vocab_size=50",
            "mlp.hidden=48",
            "dtype=fp32",
        ],
    )
    with pytest.raises(specc.SpecError, match="GroupQueryAttention is always causal"):
        export_onnx(spec, tmp_path / "m.onnx", attention="contrib")
