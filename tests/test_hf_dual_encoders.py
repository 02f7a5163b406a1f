"""CLIP and SigLIP as full dual encoders (CLIPModel, SiglipModel: both towers, projections, logit scale and bias)
and CLIP's towers with their projections (CLIPVisionModelWithProjection, CLIPTextModelWithProjection), imported
from config.json: image and text embeddings and logits_per_image / logits_per_text equal to HF in torch, ONNX and
the standalone model.py, parameters equal to num_parameters(), matmul FLOPs equal to FlopCounterMode, and the
spec's rules located in the YAML file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_hf_zoo import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.analysis import analyze
from specc.interop import import_hf

ATOL = 1e-4
STD = 0.3  # weights redrawn, norms, biases and the logit scale / bias moved by as much (test_hf_zoo.STD)
_TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
_TEXT = dict(_TOWER, vocab_size=96, max_position_embeddings=16)
_IMAGE = dict(_TOWER, image_size=16, patch_size=4)


@dataclass(frozen=True)
class Twin:
    id: str
    arch: str
    config: dict[str, Any]

    @property
    def image(self) -> bool:
        return "Text" not in self.arch

    @property
    def text(self) -> bool:
        return "Vision" not in self.arch


TWINS = [
    Twin(
        "clip",
        "CLIPModel",
        dict(text_config=dict(_TEXT, eos_token_id=94), vision_config=_IMAGE, projection_dim=24),
    ),
    Twin(  # a text head wider than the towers, and a 14-pixel image in patches of 4 (the conv drops 2)
        "siglip",
        "SiglipModel",
        dict(text_config=dict(_TEXT, projection_size=32), vision_config=dict(_IMAGE, image_size=14)),
    ),
    Twin("clip-vision-proj", "CLIPVisionModelWithProjection", dict(_IMAGE, projection_dim=24)),
    Twin("clip-text-proj", "CLIPTextModelWithProjection", dict(_TEXT, eos_token_id=94, projection_dim=20)),
]
BY_ID = {t.id: t for t in TWINS}
DUALS = [t for t in TWINS if t.image and t.text]


def _build(twin: Twin) -> Any:
    cls = getattr(transformers, twin.arch)
    config = getattr(transformers, cls.config_class.__name__)(**twin.config)
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, STD)
            else:  # norms, biases, CLIP's 0-d logit scale, SigLIP's [1] scale and bias
                p.add_(torch.randn_like(p) * STD)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[Any, Path, Any]] = {}

    def get(twin_id: str) -> tuple[Any, Path, Any]:
        if twin_id not in cache:
            model = _build(BY_ID[twin_id])
            folder = tmp_path_factory.mktemp(twin_id)
            model.save_pretrained(folder)
            cache[twin_id] = model, folder, import_hf(folder).spec
        return cache[twin_id]

    return get


def _inputs(twin: Twin, hf: Any) -> dict[str, torch.Tensor]:
    """Two images against three texts (right-padded, an EOS id in each row, one more after it in row 0)."""
    g = torch.Generator().manual_seed(1)
    out: dict[str, torch.Tensor] = {}
    if twin.image:
        c = hf.config.vision_config if twin.text else hf.config
        out["pixel_values"] = torch.randn(2, 3, c.image_size, c.image_size, generator=g)
    if twin.text:
        c = hf.config.text_config if twin.image else hf.config
        ids = torch.randint(3, c.vocab_size - 2, (3, 9), generator=g)
        mask = torch.ones_like(ids)
        mask[1, 6:], mask[2, 4:] = 0, 0
        ids[0, 8], ids[0, 3], ids[1, 5], ids[2, 3] = 94, 94, 94, 94
        out |= {"input_ids": ids, "attention_mask": mask}
    return out


def _reference(twin: Twin, hf: Any, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = hf(**x)
    names = ("image_embeds", "text_embeds", "logits_per_image", "logits_per_text", "last_hidden_state")
    return {n: getattr(out, n) for n in names if getattr(out, n, None) is not None}


def _compare(got: dict[str, Any], want: dict[str, torch.Tensor], twin: Twin, x: dict[str, torch.Tensor]) -> None:
    if twin.image and twin.text:
        assert set(got) == {"image_embeds", "text_embeds", "logits_per_image", "logits_per_text"}
    for name, ref in want.items():
        value = torch.as_tensor(np.asarray(got[name]))
        if name == "last_hidden_state" and twin.text:  # a padded position's state is never read
            keep = x["attention_mask"].bool()
            value, ref = value[keep], ref[keep]
        torch.testing.assert_close(value, ref, atol=ATOL, rtol=0, msg=lambda m, n=name: f"{twin.id} {n}: {m}")


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.id)
def test_torch_backend_matches_hf(saved, twin: Twin) -> None:
    hf, folder, spec = saved(twin.id)
    model = specc.build_torch(spec, weights=str(folder / "model.safetensors"))
    x = _inputs(twin, hf)
    with torch.no_grad():
        got = model.run(dict(x))
    _compare(got, _reference(twin, hf, x), twin, x)
    if twin.image and twin.text:  # the logits are felt: HF's are far from 0 and from a unit scale
        assert _reference(twin, hf, x)["logits_per_image"].abs().max() > 100 * ATOL


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.id)
def test_onnx_matches_hf(saved, twin: Twin, tmp_path: Path) -> None:
    import onnx

    ort = pytest.importorskip("onnxruntime")
    hf, folder, spec = saved(twin.id)
    path = specc.export_onnx(spec, tmp_path / "model.onnx", weights=str(folder / "model.safetensors"))
    graph = onnx.load(str(path)).graph
    g = specc.lower(spec)
    fused = [n for n in graph.node if n.op_type in ("Attention", "MultiHeadAttention", "GroupQueryAttention")]
    assert len(fused) == sum(1 for op in g.ops() if op.kind == "attention")  # one per attention layer
    x = _inputs(twin, hf)
    assert [i.name for i in graph.input] == list(x)  # pixel_values, input_ids, attention_mask as HF names them
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {k: v.numpy() for k, v in x.items()})
    got = dict(zip([o.name for o in sess.get_outputs()], outs, strict=True))
    _compare(got, _reference(twin, hf, x), twin, x)


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.id)
def test_parameter_counts_agree(twin: Twin, tmp_path: Path) -> None:
    config = getattr(transformers, getattr(transformers, twin.arch).config_class.__name__)(**twin.config)
    config.architectures = [twin.arch]
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        want = getattr(transformers, twin.arch)(config).num_parameters()
    spec = import_hf(tmp_path).spec
    assert analyze(specc.lower(spec), crossover=False).params.total == want


@pytest.mark.parametrize("twin", DUALS, ids=lambda t: t.id)
def test_flops_equal_flop_counter(twin: Twin, tmp_path: Path) -> None:
    """The analyzer counts B images against B texts of N tokens: towers, projections and the B × B logits."""
    config = getattr(transformers, getattr(transformers, twin.arch).config_class.__name__)(**twin.config)
    config.architectures = [twin.arch]
    config.save_pretrained(tmp_path)
    spec = import_hf(tmp_path).spec
    g, model = specc.lower(spec), specc.build_torch(spec).eval()
    b, n = 3, 9
    size = twin.config["vision_config"]["image_size"]
    x = {"pixel_values": torch.randn(b, 3, size, size), "input_ids": torch.randint(3, 90, (b, n))}
    want = analyze(g, batch=b, seq=n, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.run(x)
    assert counter.get_total_flops() == want
    assert g.op("contrastive").attrs.dim == (24 if twin.id == "clip" else 32)


@pytest.mark.parametrize("twin", DUALS, ids=lambda t: t.id)
def test_model_py_loads_the_hf_checkpoint(saved, twin: Twin, tmp_path: Path) -> None:
    """The standalone model.py reads CLIPModel's / SiglipModel's save_pretrained checkpoint by its name table and
    gives HF's embeddings and logits, and build_torch's to 1e-5."""
    from test_torch_model_py_names import _model_py

    hf, folder, spec = saved(twin.id)
    weights = str(folder / "model.safetensors")
    model = _model_py(spec, tmp_path / "model.py").build(weights=weights)
    x = _inputs(twin, hf)
    with torch.no_grad():
        got = model(**x)
        same = specc.build_torch(spec, weights=weights).run(dict(x))
    _compare(got, _reference(twin, hf, x), twin, x)
    for name, value in same.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=1e-5)


def test_the_dual_encoder_graph_is_two_towers_and_a_scoring(saved) -> None:
    _, _, spec = saved("siglip")
    g = specc.lower(spec)
    assert (spec.kind, spec.vision.head, spec.text.head) == ("dual_encoder", "attention_pool", "last")
    assert {op.stack for op in g.ops() if op.name.startswith(("vision.", "text."))} == {"vision", "text"}
    assert g.op("contrastive").params.keys() == {"logit_scale", "logit_bias"}
    assert g.op("text.projection").attrs.bias and "vision.projection.weight" not in g.params()
    assert g.shape_of("logits_per_image") == ("B", "B") and g.op("text.pool").attrs.mode == "last"


def test_siglip_without_the_vision_head_is_refused_at_its_line(tmp_path: Path) -> None:
    twin = BY_ID["siglip"]
    config = transformers.SiglipConfig(**{**twin.config, "vision_config": dict(_IMAGE, vision_use_head=False)})
    config.architectures = ["SiglipModel"]
    config.save_pretrained(tmp_path)
    with pytest.raises(specc.SpecError) as e:
        import_hf(tmp_path)
    d = e.value.diagnostics[0]
    text = (tmp_path / "config.json").read_text().splitlines()
    assert "vision_config.vision_use_head" in d.message and '"vision_use_head"' in text[d.line - 1]


_DUAL = """name: d
kind: dual_encoder
vision:
  image: {size: 16, patch: 4}
  d_model: 32
  blocks: 1
  attention: {heads: 4}
  head: pooled_norm
  projection: 16
text:
  vocab_size: 50
  context: 16
  d_model: 32
  blocks: 1
  attention: {heads: 4, mask: causal}
  head: eos
  projection: 16
"""


@pytest.mark.parametrize(
    ("old", "new", "line", "words"),
    [
        ("attention: {heads: 4}\n  head: pooled", "attention: {heads: 5}\n  head: pooled", 7, "not divisible"),
        ("  head: eos\n  projection: 16", "  head: eos\n  projection: 12", 17, "different widths: vision 16, text 12"),
        ("head: pooled_norm\n  projection: 16\n", "head: none\n", 8, "vision tower embeds its pooled output"),
        ("  blocks: 1\n  attention: {heads: 4}\n", "  blocks: 1\n  dtype: fp16\n  attention: {heads: 4}\n", 7, "dtype"),
        ("  head: eos\n", "  head: mlm\n", 17, "projection maps the pooled output, but head mlm"),
        ("name: d\n", "name: d\ncontrastive: {logit_scale: 1.0, bias: 1}\n", 2, "unknown key 'bias'"),
    ],
)
def test_dual_encoder_fields_are_checked_at_their_line(
    tmp_path: Path, old: str, new: str, line: int, words: str
) -> None:
    assert old in _DUAL
    path = tmp_path / "spec.yaml"
    path.write_text(_DUAL.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(specc.SpecError) as e:
        specc.load_spec(str(path))
    d = e.value.diagnostics[0]
    assert words in d.message and d.line == line and d.file == str(path), d
    path.write_text(_DUAL, encoding="utf-8")
    assert specc.load_spec(str(path)).contrastive.logit_bias is None  # the unchanged spec is valid


ROUND_TRIPPED = {t.arch for t in TWINS}  # export-hf checked here (test_export_hf counts every import family)


@pytest.mark.parametrize("twin", TWINS, ids=lambda t: t.id)
def test_export_hf_round_trips(saved, twin: Twin, tmp_path: Path) -> None:
    """import-hf → specc model → export-hf → transformers loads the class again with the same outputs."""
    from specc.interop.hf_export import export_hf

    hf, folder, spec = saved(twin.id)
    model = specc.build_torch(spec, weights=str(folder / "model.safetensors"))
    state = model.state_dict()
    done = export_hf(spec, {k: state[k] for k in model.graph.params()}, tmp_path / "out")
    assert done.architecture == twin.arch
    back = getattr(transformers, twin.arch).from_pretrained(done.folder).eval()
    x = _inputs(twin, hf)
    want, got = _reference(twin, hf, x), _reference(twin, back, x)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=0, rtol=0)


def test_export_hf_refuses_what_clip_cannot_state(saved) -> None:
    """A CLIP spec given SigLIP's logit bias is no CLIPModel, and a SigLIP one has no class either then."""
    from specc.interop.hf_export import choose

    _, _, spec = saved("clip")
    biased = spec.model_copy(update={"contrastive": spec.contrastive.model_copy(update={"logit_bias": -10.0})})
    with pytest.raises(specc.SpecError) as e:
        choose(biased)
    assert "CLIPModel cannot express a logit bias" in e.value.diagnostics[0].message


def test_specc_initialisation_starts_the_logit_scale_and_bias_at_the_spec_s_values(tmp_path: Path) -> None:
    """Without weights, the learned scale and bias start where the contrastive section says (SigLIP: log 10, -10),
    in the torch module and in the ONNX export's seeded weights alike."""
    import onnx
    from onnx import numpy_helper

    path = tmp_path / "spec.yaml"
    contrastive = f"contrastive: {{logit_scale: {float(np.log(10.0))!r}, logit_bias: -10.0}}\n"
    path.write_text(_DUAL + contrastive, encoding="utf-8")
    spec = specc.load_spec(str(path))
    model = specc.build_torch(spec)
    scale, bias = model.contrastive.logit_scale.item(), model.contrastive.logit_bias.item()
    assert (scale, bias) == pytest.approx((np.log(10.0), -10.0))
    path = specc.export_onnx(spec, tmp_path / "model.onnx")
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    assert inits["contrastive.logit_scale"].tolist() == pytest.approx([scale])
    assert inits["contrastive.logit_bias"].tolist() == pytest.approx([bias])


# One mistake per dual encoder that the comparisons above must catch (each keeps the checkpoint loadable): with
# the twins' weights each moves the logits by more than 10 × ATOL.
MUTATIONS = [
    ("clip", "text.attention.mask", "padding"),  # CLIP's text tower bidirectional instead of causal
    ("clip", "vision.mlp.activation", "gelu"),  # quick_gelu read as gelu
    ("siglip", "text.attention.mask", "causal"),  # SigLIP's text tower causal instead of bidirectional
    ("siglip", "text.head", "eos"),  # pooled at the largest id instead of the last position
]


@pytest.mark.parametrize(("twin_id", "key", "value"), MUTATIONS)
def test_a_mutated_import_fails_the_comparison(saved, twin_id: str, key: str, value: Any) -> None:
    hf, folder, spec = saved(twin_id)
    data = spec.model_dump(mode="json", exclude_none=True)
    node = data
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    wrong = specc.build_torch(specc.load_spec(data), weights=str(folder / "model.safetensors"))
    x = _inputs(BY_ID[twin_id], hf)
    with torch.no_grad():
        got = wrong.run(dict(x))["logits_per_image"]
    assert (got - _reference(BY_ID[twin_id], hf, x)["logits_per_image"]).abs().max() > 10 * ATOL


@pytest.mark.parametrize("preset", ["clip-vit-large-patch14-dual", "siglip-so400m-dual"])
def test_a_dual_encoder_spec_round_trips_through_the_form_artifacts_store(preset: str) -> None:
    """Artifacts (safetensors and ONNX metadata, model.py) keep ``spec_dict``: it must load back to the same spec,
    so the towers' dtype and init (the model's) are never written into them."""
    from specc.spec.serialize import spec_dict

    spec = specc.load_spec(preset, ["dtype=bf16", "init.seed=3"])
    data = spec_dict(spec)
    assert not {"dtype", "init"} & (set(data["vision"]) | set(data["text"]))
    assert specc.load_spec(data) == spec
    g = specc.lower(spec)
    assert (g.meta["dtype"], g.meta["seed"]) == ("bf16", 3)


def test_clip_s_config_dict_dialect_replaces_the_tower_configs(saved, tmp_path: Path) -> None:
    """Older CLIP configs (openai/clip-vit-*) carry ``text_config_dict`` / ``vision_config_dict`` beside the tower
    configs: transformers completes each dict with the tower config's defaults and lets it replace every field, so
    here the dict's EOS id 94 replaces text_config's legacy 2 (pool at the largest id), as HF's own load shows."""
    import json
    import shutil

    hf, folder, _ = saved("clip")
    shutil.copytree(folder, tmp_path / "clip")
    path = tmp_path / "clip" / "config.json"
    config = json.loads(path.read_text())
    text, vision = config["text_config"], config["vision_config"]
    text["eos_token_id"] = 2
    sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    config["text_config_dict"] = {k: text[k] for k in (*sizes, "vocab_size", "max_position_embeddings")}
    config["text_config_dict"]["eos_token_id"] = 94
    config["vision_config_dict"] = {k: vision[k] for k in (*sizes, "image_size", "patch_size")}
    path.write_text(json.dumps(config, indent=2))
    imported = import_hf(path.parent)
    assert imported.spec.text.eos_token == 94 and any("text_config_dict replaces" in n for n in imported.notes)
    back = transformers.CLIPModel.from_pretrained(path.parent).eval()
    assert back.config.text_config.eos_token_id == 94
    x = _inputs(BY_ID["clip"], hf)
    x["input_ids"][0, 6] = 95  # the largest id, after row 0's first 94: the two pooling rules differ here
    model = specc.build_torch(imported.spec, weights=str(path.parent / "model.safetensors"))
    with torch.no_grad():
        got = model.run(dict(x))
    _compare(got, _reference(BY_ID["clip"], back, x), BY_ID["clip"], x)
