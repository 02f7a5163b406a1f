"""T5 without its LM head: the encoder alone (T5EncoderModel, MT5EncoderModel, UMT5EncoderModel: the text encoder
of today's diffusion models) as an encoder spec with relative positions, and the whole encoder-decoder returning
the decoder's states (T5Model, MT5Model, UMT5Model: encoder_decoder with head none). last_hidden_state equal to
HF in torch, ONNX and model.py, parameters equal to num_parameters(), matmul FLOPs equal to FlopCounterMode,
export-hf back to the class."""

from __future__ import annotations

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
STD = 0.3
# 8 buckets up to distance 6: the 11-token rows reach the logarithmic buckets
_T5 = dict(vocab_size=90, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
           relative_attention_max_distance=6, dropout_rate=0.0)  # fmt: skip
CASES = {  # class → (config class, its fields): v1.0 relu, mT5 gated-gelu, UMT5 per-layer tables
    "T5EncoderModel": ("T5Config", _T5),
    "MT5EncoderModel": ("MT5Config", dict(_T5, feed_forward_proj="gated-gelu")),
    "UMT5EncoderModel": ("UMT5Config", dict(_T5, feed_forward_proj="gated-silu")),
}
MODELS = {  # the same, whole and headless: a decoder of one layer
    arch.replace("EncoderModel", "Model"): (config, dict(fields, num_decoder_layers=1))
    for arch, (config, fields) in CASES.items()
}
CASES |= MODELS
ENCODERS = [a for a in CASES if a not in MODELS]
ROUND_TRIPPED = set(CASES)  # export-hf checked here (test_export_hf counts every import family)


def _config(arch: str) -> Any:
    config_cls, fields = CASES[arch]
    config = getattr(transformers, config_cls)(**fields)
    config.architectures = [arch]
    return config


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[Any, Path, Any]] = {}

    def get(arch: str) -> tuple[Any, Path, Any]:
        if arch not in cache:
            torch.manual_seed(0)
            hf = getattr(transformers, arch)(_config(arch)).eval()
            with torch.no_grad():  # weights redrawn, norms moved: a dropped norm or a wrong bucket shows
                for _, p in hf.named_parameters():
                    p.normal_(0.0, STD) if p.dim() >= 2 else p.add_(torch.randn_like(p) * STD)
            folder = tmp_path_factory.mktemp(arch)
            hf.save_pretrained(folder)
            cache[arch] = hf, folder, import_hf(folder).spec
        return cache[arch]

    return get


def _inputs(arch: str = "T5EncoderModel") -> dict[str, torch.Tensor]:
    """Right-padded source rows (11, 7, 4 tokens); a T5Model also reads 5 decoder tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 88, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:], mask[2, 4:] = 0, 0
    decoder = {"decoder_input_ids": torch.randint(2, 88, (3, 5), generator=g)} if arch in MODELS else {}
    return {"input_ids": ids, "attention_mask": mask, **decoder}


def _check(got: Any, hf: Any, x: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        want = hf(**x).last_hidden_state
    got = torch.as_tensor(np.asarray(got))
    if "decoder_input_ids" not in x:  # an encoder's padded position is never read (a decoder's rows are unpadded)
        keep = x["attention_mask"].bool()
        got, want = got[keep], want[keep]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", CASES)
def test_torch_and_onnx_match_hf(saved, arch: str, tmp_path: Path) -> None:
    import onnx

    ort = pytest.importorskip("onnxruntime")
    hf, folder, spec = saved(arch)
    kind = "encoder_decoder" if arch in MODELS else "encoder"
    assert (spec.kind, spec.head, spec.position.type, spec.position.per_layer) == (
        kind,
        "none",
        "relative",
        arch.startswith("UMT5"),
    )
    weights = str(folder / "model.safetensors")
    x = _inputs(arch)
    with torch.no_grad():
        _check(specc.build_torch(spec, weights=weights).run(dict(x))["last_hidden_state"], hf, x)
    path = specc.export_onnx(spec, tmp_path / "model.onnx", weights=weights)
    fused = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Attention"]
    g = specc.lower(spec)
    assert len(fused) == sum(1 for op in g.ops() if op.kind == "attention")  # self and cross, one node each
    assert [i.name for i in onnx.load(str(path)).graph.input] == list(x)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    _check(sess.run(["last_hidden_state"], {k: v.numpy() for k, v in x.items()})[0], hf, x)


@pytest.mark.parametrize("arch", CASES)
def test_parameters_and_flops(arch: str, tmp_path: Path) -> None:
    config = _config(arch)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        want = getattr(transformers, arch)(config).num_parameters()
    spec = import_hf(tmp_path).spec
    g = specc.lower(spec)
    report = analyze(g, batch=2, seq=11, crossover=False)
    assert report.params.total == want
    x = {"input_ids": torch.randint(2, 88, (2, 11))}
    if arch in MODELS:  # the analyzer's N_dec defaults to N
        x["decoder_input_ids"] = torch.randint(2, 88, (2, 11))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        specc.build_torch(spec).eval().run(x)
    assert counter.get_total_flops() == report.to_dict()["flops"]["forward"]["matmul"]


@pytest.mark.parametrize("arch", ["T5EncoderModel", "UMT5EncoderModel", "T5Model"])
def test_model_py_loads_the_hf_checkpoint(saved, arch: str, tmp_path: Path) -> None:
    from test_torch_model_py_names import _model_py

    hf, folder, spec = saved(arch)
    model = _model_py(spec, tmp_path / "model.py").build(weights=str(folder / "model.safetensors"))
    x = _inputs(arch)
    with torch.no_grad():
        out = model(**x)
    _check(out["last_hidden_state"] if isinstance(out, dict) else out, hf, x)


@pytest.mark.parametrize("arch", CASES)
def test_export_hf_round_trips(saved, arch: str, tmp_path: Path) -> None:
    from specc.interop.hf_export import export_hf

    hf, folder, spec = saved(arch)
    model = specc.build_torch(spec, weights=str(folder / "model.safetensors"))
    state = model.state_dict()
    done = export_hf(spec, {k: state[k] for k in model.graph.params()}, tmp_path / "out")
    assert done.architecture == arch
    back = getattr(transformers, arch).from_pretrained(done.folder).eval()
    x = _inputs(arch)
    with torch.no_grad():
        torch.testing.assert_close(back(**x).last_hidden_state, hf(**x).last_hidden_state, atol=0, rtol=0)


def test_relative_positions_stay_refused_in_a_vit(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: v\nkind: vit\nimage: {size: 16, patch: 4}\nd_model: 32\nblocks: 1\nattention: {heads: 4}\nhead: none\n"
        "position: {type: relative}\n",
        encoding="utf-8",
    )
    with pytest.raises(specc.SpecError) as e:
        specc.load_spec(str(path))
    d = e.value.diagnostics[0]
    assert "supported in encoder_decoder and encoder models, not in kind vit" in d.message and d.line == 8


def test_a_headless_encoder_decoder_generates_nothing_and_refuses_output_transforms(saved, tmp_path: Path) -> None:
    _, _, spec = saved("T5Model")
    g = specc.lower(spec)
    assert set(g.outputs) == {"last_hidden_state"} and "lm_head" not in g.graph and g.meta["task"] == "seq2seq_hidden"
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: s\nkind: encoder_decoder\nvocab_size: 50\ncontext: 16\nd_model: 32\nblocks: 1\n"
        "attention: {heads: 4}\nhead: none\noutput: {scale: 0.5}\n",
        encoding="utf-8",
    )
    with pytest.raises(specc.SpecError) as e:
        specc.load_spec(str(path))
    d = e.value.diagnostics[0]
    assert "output transforms the head's logits, but head is none" in d.message and d.line == 9
