"""Encoder towers imported from config.json (CLIP vision and text, SigLIP vision): the analyzer's matmul FLOPs
equal FlopCounterMode on the generated module, and the features that make them towers are in the graph (no final
norm over CLIP's tokens, a bias-free patch conv, the class token's own norm, SigLIP's probe and its one more
fused attention node). The torch / ONNX / parameter checks against HF are the zoo's (test_hf_equivalence.py,
cases vit-clip, vit-siglip*, cliptext-*)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from test_hf_zoo import BY_ID, Case, transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.analysis import analyze
from specc.interop import import_hf


def _spec(case: Case, folder: Path) -> Any:
    config_cls = getattr(transformers, getattr(transformers, case.arch).config_class.__name__)
    config = config_cls(**case.config)
    config.architectures = [case.arch]
    config.save_pretrained(folder)  # config.json only: FLOPs need no weights
    return import_hf(folder).spec


def _flops(spec: Any, inputs: dict[str, torch.Tensor], batch: int, seq: int) -> None:
    g, model = specc.lower(spec), specc.build_torch(spec).eval()
    want = analyze(g, batch=batch, seq=seq, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.run(dict(inputs))
    assert counter.get_total_flops() == want


def test_clip_vision_flops_equal_flop_counter(tmp_path: Path) -> None:
    case = BY_ID["vit-clip"]
    spec = _spec(case, tmp_path)
    size = case.config["image_size"]
    _flops(spec, {"pixel_values": torch.randn(2, 3, size, size)}, 2, 1)


def test_siglip_vision_flops_equal_flop_counter(tmp_path: Path) -> None:
    case = BY_ID["vit-siglip"]
    spec = _spec(case, tmp_path)
    size = case.config["image_size"]
    _flops(spec, {"pixel_values": torch.randn(2, 3, size, size)}, 2, 1)


def test_siglip_has_no_class_token_and_an_attention_pooling_head(tmp_path: Path) -> None:
    g = specc.lower(_spec(BY_ID["vit-siglip"], tmp_path))
    assert "cls_token.token" not in g.params() and "norm_f.weight" in g.params()
    assert g.op("head.probe").kind == "probe" and g.op("head.attn.core").attrs.cross
    assert g.shape_of("head.probe") == ("B", 1, 32)


def test_clip_text_flops_equal_flop_counter(tmp_path: Path) -> None:
    spec = _spec(BY_ID["cliptext-eos"], tmp_path)
    ids = torch.randint(3, 90, (2, 11), generator=torch.Generator().manual_seed(0))
    _flops(spec, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 2, 11)


def test_clip_text_is_a_causal_encoder_pooled_at_the_eos_id(tmp_path: Path) -> None:
    spec = _spec(BY_ID["cliptext-eos"], tmp_path)
    assert (spec.kind, spec.head, spec.eos_token, spec.attention.mask) == ("encoder", "eos", 94, "causal")
    pool = specc.lower(spec).op("pool")
    assert (pool.attrs.mode, pool.attrs.eos_token_id) == ("eos", 94)
    assert _spec(BY_ID["cliptext-legacy"], tmp_path / "legacy").eos_token is None  # eos id 2: the largest id


def test_clip_vision_graph_has_the_tower_features(tmp_path: Path) -> None:
    g = specc.lower(_spec(BY_ID["vit-clip"], tmp_path))
    params = g.params()
    assert "patch_embed.bias" not in params and "norm_f.weight" not in params
    assert {"embed_norm.weight", "pool_norm.weight", "pool_norm.bias", "cls_token.token"} <= set(params)
    assert g.op("blocks.0.mlp.act").attrs.fn == "quick_gelu"
    assert set(g.outputs) == {"last_hidden_state", "pooler_output"}


def test_quick_gelu_is_transformers_quick_gelu() -> None:
    from transformers.activations import ACT2FN

    from specc.backends.torch.layers import QuickGELU

    x = torch.linspace(-4, 4, 33)
    torch.testing.assert_close(QuickGELU()(x), ACT2FN["quick_gelu"](x))


def test_siglip_onnx_has_one_fused_attention_node_per_attention_layer(tmp_path: Path) -> None:
    import onnx

    spec = _spec(BY_ID["vit-siglip"], tmp_path)
    path = specc.export_onnx(spec, tmp_path / "model.onnx")
    graph = onnx.load(str(path)).graph
    fused = [n for n in graph.node if n.op_type in ("Attention", "MultiHeadAttention", "GroupQueryAttention")]
    assert len(fused) == spec.blocks + 1  # the blocks' and the pooling head's cross-attention
    assert [i.name for i in graph.input] == ["pixel_values"]
    assert [o.name for o in graph.output] == ["last_hidden_state", "pooler_output"]
