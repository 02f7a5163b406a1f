"""Whisper imported from config.json computes the HF function: the audio front-end (input_features through two
Conv1d + GELU, the second of stride 2, plus the sinusoid table), pre-norm blocks, a key projection without bias
(bias.k: false) in self- and cross-attention, learned decoder positions and the tied head. A tiny twin (weights,
norms and biases redrawn at std 0.3) gives logits within 1e-4 of the logit scale in torch and ONNX,
params.total equal to num_parameters(), greedy KV-cache generation from input_features (torch and ONNX) equal to
HF's generate, FLOPs equal to FlopCounterMode; a wrong field fails the comparison; both config dialects give one
spec; bad fields are refused at their line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_hf_equivalence import Saved
from test_hf_zoo import NORM_BIAS_NOISE, STD
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.backends.torch import GenerationError
from specc.interop import import_hf

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

RTOL_OF_SCALE = 1e-4
# 12 encoder frames (24 input frames: transformers wants exactly 2 · max_source_positions), 24 decoder positions;
# generation settings that would steer HF's generate (suppressed and forced tokens) are off, so the comparison is
# of the model
_TINY: dict[str, Any] = dict(
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=48,
    decoder_ffn_dim=48,
    vocab_size=96,
    num_mel_bins=8,
    max_source_positions=12,
    max_target_positions=24,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=3,
    suppress_tokens=None,
    begin_suppress_tokens=None,
)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**_TINY)).eval()
    with torch.no_grad():  # every matrix (the conv kernels and position tables too) redrawn; norms and biases moved
        for p in model.parameters():
            p.normal_(0, STD) if p.dim() > 1 else p.add_(torch.randn_like(p) * NORM_BIAS_NOISE)
    folder = tmp_path_factory.mktemp("whisper") / "whisper"
    model.save_pretrained(folder)
    from test_hf_zoo import Case

    return Saved(Case("whisper-tiny", "WhisperForConditionalGeneration", _TINY), model, folder, import_hf(folder).spec)


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"input_features": torch.randn(3, 8, 24, generator=g), "decoder_input_ids": torch.randint(3, 95, (3, 9))}


def _close(s: Saved, x: dict[str, torch.Tensor], got: Any) -> float:
    with torch.no_grad():
        ref = s.hf(**x).logits
    value = torch.as_tensor(np.asarray(got))
    tol = RTOL_OF_SCALE * max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(value, ref, atol=tol, rtol=0)
    return float((value - ref).abs().max())


def test_import_states_the_audio_front_end_and_the_key_without_bias(whisper: Saved) -> None:
    s = whisper.spec
    assert s.audio is not None and (s.audio.mel_bins, s.audio.positions) == (8, 12)
    assert (s.bias.qkv, s.bias.k, s.bias.head) == (True, False, False) and s.decoder_start_token == 3
    g = specc.lower(s)
    assert g.inputs["input_features"].shape == ("B", 8, "2*N") and "input_ids" not in g.inputs
    assert g.op("encoder.blocks.0.attn.qkv").params["bias"].shape == (64,)  # q and v: 2 · 32, no k
    assert g.op("decoder.blocks.0.cross_attn.kv").params["bias"].shape == (32,)  # v only


def test_torch_and_onnx_match_hf(whisper: Saved, tmp_path: Path) -> None:
    s, x = whisper, _inputs()
    with torch.no_grad():
        _close(s, x, specc.build_torch(s.spec, weights=s.weights).run(dict(x))["logits"])
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights)
    fused = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Attention"]
    assert len(fused) == s.spec.blocks.encoder + 2 * s.spec.blocks.decoder  # self (+ cross) per layer
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["input_features", "decoder_input_ids"]
    _close(s, x, sess.run(["logits"], {k: v.numpy() for k, v in x.items()})[0])


def test_parameter_counts_agree(whisper: Saved) -> None:
    want = whisper.hf.num_parameters()  # the encoder's sinusoid table is a (frozen) parameter there and here
    assert specc.analyze(whisper.spec, crossover=False).to_dict()["params"]["total"] == want
    assert sum(p.numel() for p in specc.build_torch(whisper.spec, device="meta").parameters()) == want


def test_greedy_generation_from_input_features_matches_hf_generate(whisper: Saved, tmp_path: Path) -> None:
    s, n = whisper, 12
    features = _inputs()["input_features"][:2]
    gc = s.hf.generation_config
    gc.update(eos_token_id=None, forced_decoder_ids=None, suppress_tokens=None, begin_suppress_tokens=None)
    gc.update(pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        want = s.hf.generate(features, max_new_tokens=n, min_new_tokens=n)
    want = want[:, -n:]
    assert len(set(want.flatten().tolist())) >= 4, "HF's continuation barely varies: the check would be weak"
    model = specc.build_torch(s.spec, weights=s.weights)
    got = model.generate(features, n, use_cache=True)  # the spec's decoder_start_token (3) starts it
    assert got[:, 0].tolist() == [3, 3] and got[:, 1:].tolist() == want.tolist()
    assert model.generate(features, n, use_cache=False)[:, 1:].tolist() == want.tolist()
    with pytest.raises(GenerationError, match="takes no attention_mask"):  # not ignored: Whisper has no such input
        model.generate(features, n, attention_mask=torch.ones(2, 3000, dtype=torch.long))

    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, kv_cache=True)
    onnx_model = OrtModel.open(path, provider="cpu", threads=2)
    assert greedy(onnx_model, {"input_features": features.numpy()}, n, start_id=3).tolist() == want.tolist()


def test_forward_and_decode_step_flops_equal_flop_counter(whisper: Saved) -> None:
    g, model = specc.lower(whisper.spec), specc.build_torch(whisper.spec).eval()
    b, n, m = 2, 12, 7
    x = {"input_features": torch.randn(b, 8, 2 * n), "decoder_input_ids": torch.randint(3, 95, (b, m))}
    forward = specc.analyze(g, batch=b, seq=n, dec_seq=m, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    step = specc.analyze(g, batch=b, seq=n, dec_seq=m, kv_len=m + 1, crossover=False).to_dict()["flops"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as counter:
            model(**x)
        assert counter.get_total_flops() == forward  # the two convolutions included
        cache = model.start({"input_features": x["input_features"]}, max_len=16)
        model.step(cache, x["decoder_input_ids"])
        with FlopCounterMode(display=False) as counter:
            model.step(cache, x["decoder_input_ids"][:, :1])
    assert counter.get_total_flops() == step["decode_step"]["matmul"]


@pytest.mark.parametrize(("key", "value"), [("mlp.activation", "gelu_tanh"), ("norm.eps", 1e-2)])
def test_a_wrong_field_fails_the_comparison(whisper: Saved, key: str, value: Any) -> None:
    x = _inputs()
    wrong = specc.load_spec(import_hf(whisper.folder).document, overrides={key: value})
    with torch.no_grad(), pytest.raises(AssertionError):
        _close(whisper, x, specc.build_torch(wrong, weights=whisper.weights).run(dict(x))["logits"])


def test_the_table_specc_computes_is_transformers_and_is_not_trained(whisper: Saved) -> None:
    from transformers.models.whisper.modeling_whisper import sinusoids

    model = specc.build_torch(whisper.spec)  # no weights: initialised, the table computed
    table = model.get_parameter("encoder.pos.weight")
    torch.testing.assert_close(table, sinusoids(12, 32), atol=1e-6, rtol=0)
    assert not table.requires_grad and model.get_parameter("encoder.conv1.weight").requires_grad


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path / "config.json"


def test_both_dialects_give_one_spec(tmp_path: Path) -> None:
    """The hub's older files (generic aliases beside the sizes, generation settings in config.json) and what
    transformers 5 saves of them import to the same spec."""
    hub = dict(_TINY, architectures=["WhisperForConditionalGeneration"], model_type="whisper")
    del hub["encoder_layers"], hub["d_model"]  # stated through the aliases only
    hub.update(num_hidden_layers=2, hidden_size=32, max_length=24, forced_decoder_ids=[[1, 5], [2, 6]])
    hub.update(suppress_tokens=[7, 8], begin_suppress_tokens=[9])
    old = _write(tmp_path / "hub", hub)
    transformers.WhisperConfig.from_pretrained(old.parent).save_pretrained(tmp_path / "v5")
    saved = json.loads((tmp_path / "v5" / "config.json").read_text())
    assert saved["encoder_layers"] == 2 and saved["d_model"] == 32 and "num_hidden_layers" not in saved
    a, b = import_hf(old), import_hf(tmp_path / "v5")
    assert not any("do not know" in n for n in a.notes + b.notes)  # every field read or known to be inert
    docs = [i.document for i in (a, b)]
    for doc in docs:
        doc.pop("source"), doc.pop("name")
    assert docs[0] == docs[1]


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        ({"decoder_attention_heads": 2}, "decoder_attention_heads", "differs from encoder_attention_heads 4"),
        ({"num_hidden_layers": 3}, "num_hidden_layers", "differs from encoder_layers 2"),
        ({"use_weighted_layer_sum": True}, "use_weighted_layer_sum", "WhisperForAudioClassification"),
        ({"decoder_start_token_id": -1}, "decoder_start_token_id", "expected a token id"),
        ({"decoder_start_token_id": 96}, "decoder_start_token_id", "below vocab_size 96"),
    ],
)
def test_config_fields_specc_cannot_take_are_refused_at_their_line(
    tmp_path: Path, change: dict[str, Any], key: str, words: str
) -> None:
    path = _write(tmp_path, dict(_TINY, architectures=["WhisperForConditionalGeneration"], **change))
    with pytest.raises(specc.SpecError) as e:
        import_hf(path)
    d = e.value.diagnostics[0]
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if f'"{key}":' in t)
    assert d.line == line and words in d.message and key in d.message


@pytest.mark.parametrize(
    ("preset", "overrides", "key", "words"),
    [
        ("whisper-large-v3", ["attention.mask=padding"], "attention.mask", "audio input has no padding mask"),
        ("whisper-large-v3", ["target_vocab_size=100"], "target_vocab_size", "not used with audio input"),
        ("whisper-large-v3", ["shared_embeddings=true"], "shared_embeddings", "no source embedding to share"),
        ("whisper-large-v3", ["decoder_start_token=51866"], "decoder_start_token", "not below the decoder's"),
        ("whisper-large-v3", ["bias.k=1"], "bias.k", "expected true or false"),
        ("deepseek-v3", ["bias.k=false"], "bias.k", "latent attention has no separate k projection"),
    ],
)
def test_audio_and_bias_rules_are_located(preset: str, overrides: list[str], key: str, words: str) -> None:
    with pytest.raises(specc.SpecError) as e:
        specc.load_spec(preset, overrides)
    assert str(e.value).startswith(f"--set {key}: error:") and words in str(e.value)


def test_relative_positions_with_audio_are_refused_at_the_position_line(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: t\nkind: encoder_decoder\nvocab_size: 64\ncontext: 16\nd_model: 32\nblocks: 1\n"
        "attention: {heads: 4}\nposition: {type: relative}\naudio: {mel_bins: 8, positions: 8}\n",
        encoding="utf-8",
    )
    with pytest.raises(specc.SpecError) as e:
        specc.load_spec(path)
    d = e.value.diagnostics[0]
    assert d.line == 8 and "relative positions are not supported with audio input" in d.message


def test_a_key_bias_flag_lowers_per_projection_in_any_family() -> None:
    """bias.k is a spec field of every Transformer kind: on GPT-2 it drops the key's bias from the packed qkv."""
    spec = specc.load_spec("gpt2", ["blocks=1", "bias.k=false"])
    g = specc.lower(spec)
    assert g.op("blocks.0.attn.qkv").attrs.bias_spans == ((0, 768), (1536, 2304))
    full = specc.analyze("gpt2", crossover=False).params.total
    assert specc.analyze(specc.load_spec("gpt2", ["bias.k=false"]), crossover=False).params.total == full - 12 * 768


def test_standalone_model_py_loads_the_checkpoint_and_generates_as_hf(whisper: Saved, tmp_path: Path) -> None:
    import importlib.util
    import sys

    from specc.backends.torch import write_model_py

    path = write_model_py(whisper.spec, tmp_path / "model.py")
    loaded = importlib.util.spec_from_file_location("_whisper_model_py", path)
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module
    loaded.loader.exec_module(module)
    model = module.build(weights=whisper.weights)  # transformers' names, through the table model.py carries
    x = _inputs()
    with torch.no_grad():
        ours = specc.build_torch(whisper.spec, weights=whisper.weights)(**x)
        torch.testing.assert_close(model(**x), ours, atol=1e-5, rtol=0)
    _close(whisper, x, model(**x).detach())
    with pytest.raises(module.GenerationError, match="takes no attention_mask"):
        model.generate(x["input_features"], 2, attention_mask=torch.ones(2, 3000, dtype=torch.long))
    seeded = module.build()  # no weights: the table computed, as specc computes it
    torch.testing.assert_close(
        seeded.get_parameter("encoder.pos.weight"), specc.build_torch(whisper.spec).get_parameter("encoder.pos.weight")
    )


ROUND_TRIPPED = {"WhisperForConditionalGeneration", "WhisperModel"}  # (test_export_hf's every-family check reads it)


def test_export_hf_round_trips_to_transformers(whisper: Saved, tmp_path: Path) -> None:
    """HF → import-hf → specc → export-hf → transformers loads it: the same logits as the original."""
    from specc.interop.hf_export import export_hf

    model = specc.build_torch(whisper.spec, weights=whisper.weights)
    params = {k: v for k, v in model.state_dict().items() if k in model.graph.params()}
    done = export_hf(whisper.spec, params, tmp_path / "out")
    assert done.architecture == "WhisperForConditionalGeneration"
    back = transformers.WhisperForConditionalGeneration.from_pretrained(done.folder).eval()
    assert back.config.decoder_start_token_id == 3 and back.num_parameters() == whisper.hf.num_parameters()
    x = _inputs()
    with torch.no_grad():
        _close(whisper, x, back(**x).logits)


def test_export_hf_refuses_a_key_bias_flag_other_classes_lack(tmp_path: Path) -> None:
    from specc.interop.hf_export import export_hf

    spec = specc.load_spec("gpt2", ["blocks=1", "d_model=32", "attention.heads=4", "vocab_size=64", "bias.k=false"])
    model = specc.build_torch(spec)
    with pytest.raises(specc.SpecError) as e:
        export_hf(spec, dict(model.state_dict()), tmp_path / "out")
    assert "bias.k" in str(e.value) or "k projection bias" in str(e.value)


def test_whisper_model_is_the_headless_decoder_and_round_trips(tmp_path: Path) -> None:
    """WhisperModel: head none, the decoder's final-normed last_hidden_state equal to HF's in torch and ONNX,
    the same parameters, and export-hf writes a WhisperModel transformers loads with the same states."""
    from specc.interop.hf_export import export_hf

    torch.manual_seed(0)
    hf = transformers.WhisperModel(transformers.WhisperConfig(**_TINY)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, STD) if p.dim() > 1 else p.add_(torch.randn_like(p) * NORM_BIAS_NOISE)
    hf.save_pretrained(tmp_path / "hf")
    spec = import_hf(tmp_path / "hf").spec
    assert spec.head == "none" and spec.audio is not None
    weights = str(tmp_path / "hf" / "model.safetensors")
    x = _inputs()
    with torch.no_grad():
        want = hf(**x).last_hidden_state
        model = specc.build_torch(spec, weights=weights)
        got = model.run(dict(x))["last_hidden_state"]
    tol = RTOL_OF_SCALE * max(1.0, float(want.abs().max()))
    torch.testing.assert_close(torch.as_tensor(np.asarray(got)), want, atol=tol, rtol=0)
    path = specc.export_onnx(spec, tmp_path / "model.onnx", weights=weights)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = sess.run(["last_hidden_state"], {k: v.numpy() for k, v in x.items()})[0]
    torch.testing.assert_close(torch.as_tensor(out), want, atol=tol, rtol=0)
    assert specc.analyze(spec, crossover=False).params.total == hf.num_parameters()
    params = {k: v for k, v in model.state_dict().items() if k in model.graph.params()}
    done = export_hf(spec, params, tmp_path / "out")
    assert done.architecture == "WhisperModel"
    back = transformers.WhisperModel.from_pretrained(done.folder).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(**x).last_hidden_state, want, atol=tol, rtol=0)


def test_whisper_large_v3_is_analysed_at_its_own_lengths() -> None:
    """The analyzer's defaults: the encoder's 1500 audio frames and the decoder's 448-position table; the KV cache
    holds the decoder's self-attention keys/values over 448 tokens and the cross K/V over the 1500 frames."""
    r = specc.analyze("whisper-large-v3", crossover=False)
    settings = r.to_dict()["settings"]
    assert (settings["seq"], settings["dec_seq"]) == (1500, 448)
    assert r.memory["kv_cache"] == 2 * 32 * 1280 * (448 + 1500) * 2  # K and V, 32 layers, d_model, fp16


def test_the_commands_take_audio_models(cli, whisper: Saved, tmp_path: Path) -> None:
    """import-hf writes the spec; specc run feeds random input_features and generates through both ONNX exports
    (HF's tokens for those features); specc generate, which takes token prompts, refuses at exit 2."""
    spec = tmp_path / "whisper.yaml"
    assert cli("import-hf", whisper.folder, "-o", spec)[0] == 0
    code, _, err = cli("generate", spec, "-p", "1 2 3", "-w", whisper.weights)
    assert code == 2 and "Traceback" not in err and "reads input_features" in err
    from specc.runtime.inputs import random_inputs
    from specc.runtime.onnx_model import OrtModel

    for flags in ([], ["--kv-cache"]):
        path = tmp_path / f"model{len(flags)}.onnx"
        assert cli("compile", spec, "-t", "onnx", "-w", whisper.weights, "-o", path, *flags)[0] == 0
        code, out, _ = cli("run", path, "--random", "1,12", "--generate", "5")
        assert code == 0
        features = random_inputs(OrtModel.open(path, provider="cpu", threads=2), 1, 12)["input_features"]
        want = specc.build_torch(whisper.spec, weights=whisper.weights).generate(torch.as_tensor(features), 5)
        assert " ".join(map(str, want[0, 1:].tolist())) in out
