"""Per-layer variation: ``layer_kinds`` + ``layer_pattern`` (attention mask and window / chunk, rotary variant or
none, mlp replaced per kind), the chunked mask, located errors, one class per kind, torch = ONNX, analyzer FLOPs
= FlopCounterMode, per-kind costs and the KV cache each layer really needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.backends.torch.layers import SelfAttention
from specc.errors import SpecError

KINDS = {
    "local": {"attention": {"mask": "sliding_window", "window": 4}, "position": {"theta": 100.0}},
    "chunk": {"attention": {"mask": "chunked", "chunk": 5}, "position": "none",
              "mlp": {"type": "moe", "experts": 4, "active": 2, "hidden": 24}},
    "full": {},
}  # fmt: skip
PATTERN = ["local", "local", "chunk", "full"]


def _doc(**over: Any) -> dict[str, Any]:
    doc = {
        "kind": "decoder", "name": "k", "vocab_size": 60, "context": 64, "d_model": 32, "blocks": 5,
        "attention": {"heads": 4, "kv_heads": 2}, "mlp": {"type": "swiglu", "hidden": 40},
        "position": {"type": "rotary", "scaling": {"type": "linear", "factor": 2.0}},
        "norm": {"type": "rmsnorm"}, "bias": False, "init": {"std": 0.3},
        "layer_kinds": KINDS, "layer_pattern": PATTERN,
    }  # fmt: skip
    doc.update(over)
    return doc


def test_lowering_resolves_each_block_of_its_kind() -> None:
    g = specc.lower(specc.load_spec(_doc()))
    assert g.meta["layer_kinds"] == ["local", "local", "chunk", "full", "local"]  # cyclic, truncated
    core = [g.op(f"blocks.{i}.attn.core").attrs for i in range(5)]
    assert [a.mask for a in core] == ["sliding_window", "sliding_window", "chunked", "causal", "sliding_window"]
    assert core[0].window == 4 and core[2].chunk == 5 and core[3].window is None
    assert core[0].rope_theta == 100.0 and core[3].rope_theta == 10000.0
    assert core[0].rope_scaling == core[3].rope_scaling == {"type": "linear", "factor": 2.0}  # inherited
    assert core[2].rope_dims == 0  # NoPE
    kinds = [op.kind for op in g.ops() if op.name.endswith((".mlp.experts", ".mlp.down"))]
    assert kinds == ["linear", "linear", "moe", "linear", "linear"]


def test_one_class_per_kind() -> None:
    model = specc.build_torch(specc.load_spec(_doc()))
    names = [type(b).__name__ for b in model.blocks]
    assert names[0] == names[1] == names[4] and len(set(names)) == 3


def test_chunked_mask_is_causal_inside_each_chunk() -> None:
    core = SelfAttention(2, 2, 4, mask="chunked", chunk=3)
    mask, causal = core.mask_for(7, 7, None, None, torch.zeros(1))
    want = [[k <= q and k // 3 == q // 3 for k in range(7)] for q in range(7)]
    assert not causal and mask[0, 0].tolist() == want


def _weights(model: Any, folder: Path) -> str:
    from safetensors.torch import save_file

    path = folder / "w.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return str(path)


def test_kinds_change_the_function_and_equal_their_plain_counterparts(tmp_path: Path) -> None:
    """A kind's layers compute what a spec with its settings at the top level computes (same weights)."""
    spec = specc.load_spec(_doc(blocks=1, layer_kinds={"chunk": KINDS["chunk"]}, layer_pattern=["chunk"]))
    model = specc.build_torch(spec).eval()
    w = _weights(model, tmp_path)
    plain = specc.load_spec(
        _doc(blocks=1, layer_kinds=None, layer_pattern=None, attention={"heads": 4, "kv_heads": 2, "mask": "chunked",
             "chunk": 5}, position="none", mlp=KINDS["chunk"]["mlp"])
    )  # fmt: skip
    ids = torch.randint(0, 60, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model.run({"input_ids": ids})["logits"]
        want = specc.build_torch(plain, weights=w).run({"input_ids": ids})["logits"]
        causal = specc.build_torch(
            specc.load_spec(_doc(blocks=1, layer_kinds=None, layer_pattern=None, position="none",
                                 mlp=KINDS["chunk"]["mlp"])), weights=w
        ).run({"input_ids": ids})["logits"]  # fmt: skip
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (got[:, 5:] - causal[:, 5:]).abs().max() > 1e-3  # the chunk boundary matters
    torch.testing.assert_close(got[:, :5], causal[:, :5], rtol=0, atol=1e-5)  # inside the first chunk: causal


def test_onnx_equals_torch_with_one_fused_attention_per_layer(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    import onnx

    spec = specc.load_spec(_doc())
    model = specc.build_torch(spec).eval()
    path = specc.export_onnx(spec, tmp_path / "m.onnx", weights=_weights(model, tmp_path))
    nodes = [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]
    assert nodes.count("Attention") == 5 and nodes.count("RotaryEmbedding") == 2 * 4  # the chunk layer has none
    ids = torch.randint(0, 60, (2, 14), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        want = model.run({"input_ids": ids, "attention_mask": mask})["logits"].numpy()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    keep = mask.bool().numpy()
    np.testing.assert_allclose(got[keep], want[keep], atol=1e-4, rtol=0)


def test_cached_generation_equals_recomputation_in_torch_and_onnx(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    spec = specc.load_spec(_doc())
    model = specc.build_torch(spec).eval()
    ids = torch.randint(0, 60, (1, 6), generator=torch.Generator().manual_seed(2))
    cached = model.generate(ids, 9, use_cache=True)
    assert cached.tolist() == model.generate(ids, 9, use_cache=False).tolist()
    path = specc.export_onnx(spec, tmp_path / "m.onnx", weights=_weights(model, tmp_path), kv_cache=True)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    onnx = greedy(OrtModel.open(path, provider="cpu", threads=1), feeds, 9)
    assert onnx.tolist() == cached[:, -9:].tolist()


@pytest.mark.parametrize(
    "position",
    [
        {"type": "rotary", "scaling": {"type": "linear", "factor": 2.0}},
        {"type": "rotary", "rotation": "interleaved", "fraction": 0.5, "scaling": {"type": "dynamic", "factor": 2.0,
                                                                                   "original_max_positions": 8}},
    ],
)  # fmt: skip
def test_analyzer_flops_equal_flop_counter(position: dict[str, Any]) -> None:
    spec = specc.load_spec(_doc(position=position))
    g, model = specc.lower(spec), specc.build_torch(spec).eval()
    ids = torch.randint(0, 60, (2, 12), generator=torch.Generator().manual_seed(3))
    expected = specc.analyze(g, batch=2, seq=12, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids)
    assert counter.get_total_flops() == expected


def test_per_kind_costs_and_kv_cache_per_layer() -> None:
    r = specc.analyze(specc.load_spec(_doc()), batch=2, seq=64)
    d = r.to_dict()
    kinds = d["flops"]["forward"]["per_kind"]
    assert {k: v["indices"] for k, v in kinds.items()} == {"local": [0, 1, 4], "chunk": [2], "full": [3]}
    assert kinds["local"]["window"] == 4 and kinds["chunk"]["chunk"] == 5
    one = 2 * 2 * 2 * 8 * 4  # k and v, batch 2, kv_heads 2, head_dim 8, fp32
    assert kinds["local"]["kv_cache_per_layer"] == 4 * one and kinds["chunk"]["kv_cache_per_layer"] == 5 * one
    assert kinds["full"]["kv_cache_per_layer"] == 64 * one
    assert d["memory"]["kv_cache"] == (3 * 4 + 5 + 64) * one  # not 5 layers × 64 positions
    assert kinds["chunk"]["by_category"]["router"] > 0 and "router" not in kinds["full"]["by_category"]
    assert sum(v["layers"] * v["total"] for v in kinds.values()) < d["flops"]["forward"]["total"]  # + embed, head
    useful = d["flops"]["causal_useful"]["by_category"]["qk"]
    pairs = 3 * sum(min(p + 1, 4) for p in range(64)) + sum(p % 5 + 1 for p in range(64)) + 64 * 65 // 2
    assert useful == 2 * 2 * 4 * pairs * 8
    from specc.analysis.output import render_text
    from specc.analysis.report_views import report_sections

    table = render_text("table", "t", report_sections(r), d, [])
    assert "Layer kinds" in table and "chunked chunk 5" in table


HEAD_YAML = (
    "kind: decoder\nname: k\nvocab_size: 60\ncontext: 64\nd_model: 32\nblocks: 4\n"
    "attention: {heads: 4}\nposition: rotary\n"
)


@pytest.mark.parametrize(
    ("tail", "needle", "line"),
    [
        ("layer_kinds:\n  a: {}\n  b: {}\nlayer_pattern: [a, bb]\n", "unknown layer kind 'bb'", 12),
        ("layer_kinds:\n  a: {}\n  b: {}\nlayer_pattern: [a]\n", "'b' is never used", 11),
        ("layer_pattern: [a]\n", "layer_pattern needs layer_kinds", 9),
        ("layer_kinds:\n  a: {}\n", "layer_kinds needs layer_pattern", 9),
        ("layer_kinds:\n  a:\n    attention: {heads: 2}\nlayer_pattern: [a]\n", "attention.heads is the same", 11),
        ("layer_kinds:\n  a:\n    attention: {mask: sliding_window}\nlayer_pattern: [a]\n",
         "layer kind 'a': mask sliding_window needs attention.window", 11),
        ("layer_kinds:\n  a:\n    position: {type: none, theta: 5.0}\nlayer_pattern: [a]\n",
         "position.theta is not used", 11),
        ("layer_kinds:\n  a:\n    position: {type: learned}\nlayer_pattern: [a]\n", "rotary or none", 11),
        ("layer_kinds:\n  a:\n    attention: {mask: chunked, chunk: 100}\nlayer_pattern: [a]\n",
         "chunk 100 is longer than context 64", 11),
        ("layer_kinds:\n  a: {}\nlayer_pattern: [a, a, a, a, a]\n", "5 entries but the model has 4 blocks", 11),
    ],
)  # fmt: skip
def test_errors_are_located(tmp_path: Path, tail: str, needle: str, line: int) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(HEAD_YAML + tail)
    with pytest.raises(SpecError) as e:
        specc.load_spec(str(f))
    d = next((d for d in e.value.diagnostics if needle in d.message), None)
    assert d is not None, [x.message for x in e.value.diagnostics]
    assert (d.file, d.line) == (str(f), line), d


def test_top_level_chunked_rules() -> None:
    with pytest.raises(SpecError, match=r"mask chunked needs attention\.chunk"):
        specc.load_spec(_doc(layer_kinds=None, layer_pattern=None, attention={"heads": 4, "mask": "chunked"}))
    with pytest.raises(SpecError, match=r"attention\.chunk is only used with mask chunked"):
        specc.load_spec(_doc(layer_kinds=None, layer_pattern=None, attention={"heads": 4, "chunk": 8}))
