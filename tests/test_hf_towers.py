"""Encoders and towers imported from config.json (CLIP vision and text, SigLIP vision, ModernBERT): the
analyzer's matmul FLOPs equal FlopCounterMode on the generated module, and the features that make them what they
are sit in the graph (no final norm over CLIP's tokens, a bias-free patch conv, the class token's own norm,
SigLIP's probe and its one more fused attention node, ModernBERT's alternating two-sided windows). The torch /
ONNX / parameter checks against HF are the zoo's (test_hf_equivalence.py, cases vit-clip, vit-siglip*,
cliptext-*, modernbert-*)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
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


@pytest.mark.parametrize("case_id", ["modernbert-mlm", "modernbert-model"])
def test_modernbert_flops_equal_flop_counter(tmp_path: Path, case_id: str) -> None:
    spec = _spec(BY_ID[case_id], tmp_path)
    ids = torch.randint(3, 90, (2, 11), generator=torch.Generator().manual_seed(0))
    _flops(spec, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, 2, 11)


def test_modernbert_layers_alternate_global_and_two_sided_local(tmp_path: Path) -> None:
    spec = _spec(BY_ID["modernbert-mlm"], tmp_path)  # 4 layers, global every 3rd: global, local, local, global
    g = specc.lower(spec)
    cores = [g.op(f"blocks.{i}.attn.core").attrs for i in range(4)]
    assert [(a.mask, a.window, a.rope_theta) for a in cores] == [
        ("padding", None, 1000.0),
        ("local", 4, 50.0),
        ("local", 4, 50.0),
        ("padding", None, 1000.0),
    ]
    params = g.params()
    assert "blocks.0.norm1.weight" not in params and "blocks.1.norm1.weight" in params  # no attention norm in 0
    assert not any(n.endswith(".bias") and not n.startswith("lm_head") for n in params)  # bias-free but the decoder


@pytest.mark.parametrize("n", [1, 2, 5, 11, 40])
@pytest.mark.parametrize("window", [1, 2, 4, 7, 128])
def test_local_mask_pairs_count_the_two_sided_window(n: int, window: int) -> None:
    from specc.analysis.rules.attention_core import visible_pairs

    want = sum(1 for q in range(n) for k in range(n) if abs(k - q) <= window // 2)
    assert visible_pairs("local", n, n, window) == want


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


@pytest.mark.parametrize("case_id", ["vit-clip", "vit-siglip", "cliptext-eos"])
def test_model_py_loads_the_towers_hf_checkpoints(tmp_path: Path, case_id: str) -> None:
    """The standalone model.py reads the towers' save_pretrained checkpoints by its name table (the class
    embedding unsqueezed, SigLIP's packed in_proj split) and gives HF's hidden states and pooled outputs."""
    from test_hf_zoo import save
    from test_torch_model_py_names import _model_py

    hf, folder = save(BY_ID[case_id], tmp_path)
    model_py = _model_py(import_hf(folder).spec, tmp_path / "model.py")
    model = model_py.build(weights=str(folder / "model.safetensors"))
    c = hf.config
    if case_id.startswith("vit"):
        x = {"pixel_values": torch.randn(2, c.num_channels, c.image_size, c.image_size)}
    else:
        ids = torch.randint(3, c.vocab_size - 2, (2, 9), generator=torch.Generator().manual_seed(0))
        ids[:, 6] = c.eos_token_id
        x = {"input_ids": ids}
    with torch.no_grad():
        got, want = model(*x.values()), hf(**x)
    for name in ("last_hidden_state", "pooler_output"):
        torch.testing.assert_close(got[name], getattr(want, name), atol=1e-5, rtol=1e-5)


_TEXT = "name: t\nkind: encoder\nvocab_size: 50\ncontext: 16\nd_model: 32\nblocks: 1\nattention: {heads: 4}\n"
_IMAGE = "name: v\nkind: vit\nimage: {size: 16, patch: 4}\nd_model: 32\nblocks: 1\nattention: {heads: 4}\n"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (_TEXT + "head: mlm\neos_token: 7\n", 9, "eos_token is only used by head: eos"),
        (
            _TEXT.replace("encoder", "decoder").replace("{heads: 4}", "{heads: 4, mask: local, window: 4}"),
            7,
            "for encoders",
        ),
        (_TEXT.replace("{heads: 4}", "{heads: 4, mask: local}"), 7, "mask local needs attention.window"),
        (_TEXT + "norm: {placement: post, skip_first: true}\n", 8, "norm.skip_first drops the first pre-norm"),
        (_TEXT + "head: eos\neos_token: 50\n", 9, "eos_token 50 is not below vocab_size 50"),
        (_IMAGE + "pooling: none\nhead: pooled\n", 7, "head: pooled pools a token, but pooling is none"),
        (_IMAGE.replace("patch: 4", "patch: 5") + "head: none\n", 3, "image 16 is not divisible by patch 5"),
    ],
)
def test_tower_fields_are_checked_at_their_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(specc.SpecError) as e:
        specc.load_spec(str(path))
    d = e.value.diagnostics[0]
    assert words in d.message and d.line == line and d.file == str(path)
    fixed = text.replace("patch: 5", "patch: 5, drop_remainder: true")  # a strided conv's floor, when asked for
    if fixed != text:
        path.write_text(fixed, encoding="utf-8")
        assert specc.lower(specc.load_spec(str(path))).shape_of("patch_embed")[1] == 9  # 3 × 3 patches
