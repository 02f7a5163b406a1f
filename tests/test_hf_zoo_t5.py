"""T5, mT5 and UMT5 imported from config.json compute the HF function: relative position bias (bucketed,
bidirectional in the encoder, causal in the decoder; one table per stack or, UMT5, per layer), T5's RMSNorm,
unscaled scores, d_kv heads, relu and gated-gelu MLPs, the d_model^-½ output scale. Logits within 1e-4 of the
logit scale in torch and ONNX (right-padded batch, sequences longer than max_distance), params.total equal to
num_parameters(), greedy KV-cache generation (torch and ONNX) equal to HF generate, FLOPs equal to
FlopCounterMode, and the bias is felt (a wrong max_distance fails the comparison)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_hf_equivalence import Saved
from test_hf_zoo import STD, Case, build
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.interop import import_hf

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

RTOL_OF_SCALE = 1e-4
# 8 buckets up to distance 10: the 23-token source and 17-token target reach the logarithmic and the last buckets
_T5 = dict(vocab_size=90, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1, num_heads=4,
           relative_attention_num_buckets=8, relative_attention_max_distance=10, dropout_rate=0.0,
           decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)  # fmt: skip
CASES = [
    Case("t5-relu", "T5ForConditionalGeneration", dict(_T5)),  # v1.0: relu, tied head scaled by d^-½
    Case("t5-gated", "T5ForConditionalGeneration", dict(_T5, feed_forward_proj="gated-gelu", num_decoder_layers=2)),
    Case("mt5-gated", "MT5ForConditionalGeneration", dict(_T5, feed_forward_proj="gated-gelu")),
    Case("umt5-perlayer", "UMT5ForConditionalGeneration", dict(_T5, feed_forward_proj="gated-silu")),
]
# transformers 5 saves tie_word_embeddings: true and scale_decoder_outputs: false for this one (it ties T5 always)
UNSCALED = Case("t5-unscaled", "T5ForConditionalGeneration", dict(_T5, tie_word_embeddings=False))
BY_ID = {c.id: c for c in [*CASES, UNSCALED]}


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Saved] = {}

    def get(case_id: str) -> Saved:
        if case_id not in cache:
            model = build(BY_ID[case_id], std=STD)  # norms randomised; T5 reads no init std from the config:
            torch.manual_seed(0)  # every matrix (bias tables too) redrawn at STD
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() > 1:
                        p.normal_(0, STD)
            folder = tmp_path_factory.mktemp(case_id) / case_id
            model.save_pretrained(folder)
            cache[case_id] = Saved(BY_ID[case_id], model, folder, import_hf(folder).spec)
        return cache[case_id]

    return get


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 89, (3, 23), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:], mask[2, 9:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": torch.randint(3, 89, (3, 17), generator=g)}


def _close(s: Saved, x: dict[str, torch.Tensor], got) -> float:
    with torch.no_grad():
        ref = s.hf(**x).logits
    value = torch.as_tensor(np.asarray(got))
    tol = RTOL_OF_SCALE * max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(value, ref, atol=tol, rtol=0, msg=lambda m: f"{s.case.id}: {m}")
    return float((value - ref).abs().max())


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_torch_and_onnx_match_hf(family, case: Case, tmp_path: Path) -> None:
    s = family(case.id)
    assert s.spec.position.type == "relative" and s.spec.position.per_layer == case.id.startswith("umt5")
    x = _inputs()
    with torch.no_grad():
        _close(s, x, specc.build_torch(s.spec, weights=s.weights).run(dict(x))["logits"])
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights)
    fused = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Attention"]
    assert len(fused) == s.spec.blocks.encoder + 2 * s.spec.blocks.decoder  # self (+ cross) per layer
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    _close(s, x, sess.run(["logits"], {k: v.numpy() for k, v in x.items()})[0])


def test_saved_scale_decoder_outputs_decides_the_output_scale(family) -> None:
    s = family(UNSCALED.id)
    saved = json.loads((s.folder / "config.json").read_text())
    assert saved["tie_word_embeddings"] is True and saved["scale_decoder_outputs"] is False
    assert s.spec.tie_embeddings and s.spec.output.scale == 1.0
    x = _inputs()
    with torch.no_grad():
        _close(s, x, specc.build_torch(s.spec, weights=s.weights).run(dict(x))["logits"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_parameter_counts_agree(family, case: Case) -> None:
    s = family(case.id)
    want = s.hf.num_parameters()
    assert specc.analyze(s.spec, crossover=False).to_dict()["params"]["total"] == want
    assert sum(p.numel() for p in specc.build_torch(s.spec, device="meta").parameters()) == want
    tables = [n for n in specc.lower(s.spec).params() if n.endswith("rel_bias.weight")]
    layers = s.spec.blocks.encoder + s.spec.blocks.decoder
    assert len(tables) == (layers if case.id.startswith("umt5") else 2)


@pytest.mark.parametrize("case_id", ["t5-gated", "umt5-perlayer"])
def test_greedy_generation_matches_hf_generate(family, case_id: str, tmp_path: Path) -> None:
    s = family(case_id)
    ids = torch.randint(3, 89, (1, 14), generator=torch.Generator().manual_seed(0))
    n = 14  # decoder positions past max_distance: the cached steps read the last buckets
    gc = s.hf.generation_config
    gc.update(eos_token_id=None, forced_eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        want = s.hf.generate(ids, max_new_tokens=n, min_new_tokens=n)[:, 1:]
    assert len(set(want[0].tolist())) >= 3, "HF's continuation barely varies: the check would be weak"
    model = specc.build_torch(s.spec, weights=s.weights)
    assert model.generate(ids, n, decoder_start_token_id=0, use_cache=True)[:, -n:].tolist() == want.tolist()

    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, kv_cache=True)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    assert greedy(OrtModel.open(path, provider="cpu", threads=2), feeds, n, start_id=0).tolist() == want.tolist()


@pytest.mark.parametrize(
    ("case_id", "key", "value"),
    [("t5-relu", "position.max_distance", 20), ("umt5-perlayer", "position.max_distance", 7)],
)
def test_a_wrong_bucketing_fails_the_comparison(family, case_id: str, key: str, value: int) -> None:
    s = family(case_id)
    x = _inputs()
    wrong = specc.load_spec(import_hf(s.folder).document, overrides={key: value})
    with torch.no_grad(), pytest.raises(AssertionError):
        _close(s, x, specc.build_torch(wrong, weights=s.weights).run(dict(x))["logits"])


def test_forward_and_decode_step_flops_equal_flop_counter(family) -> None:
    s = family("umt5-perlayer")
    g, model = specc.lower(s.spec), specc.build_torch(s.spec).eval()
    b, n = 2, 13
    x = {"input_ids": torch.randint(3, 89, (b, n)), "decoder_input_ids": torch.randint(3, 89, (b, n))}
    forward = specc.analyze(g, batch=b, seq=n, dec_seq=n, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    step = specc.analyze(g, batch=b, seq=n, dec_seq=n, kv_len=n + 1, crossover=False).to_dict()["flops"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as counter:
            model(**x)
        assert counter.get_total_flops() == forward
        cache = model.start({"input_ids": x["input_ids"]}, max_len=32)
        model.step(cache, x["decoder_input_ids"])
        with FlopCounterMode(display=False) as counter:
            model.step(cache, x["decoder_input_ids"][:, :1])
    assert counter.get_total_flops() == step["decode_step"]["matmul"]


@pytest.mark.parametrize(
    ("preset", "overrides", "key", "words"),
    [
        ("gpt2", ["position.type=relative"], "position.type", "and encoder models, not in kind decoder"),
        ("t5-base", ["position.type=learned", "position.buckets=16"], "position.buckets", "only used by relative"),
        ("t5-base", ["position.max_distance=16"], "position.max_distance", "16 must exceed half the buckets (16)"),
    ],
)
def test_relative_position_rules_are_located(preset: str, overrides: list[str], key: str, words: str) -> None:
    with pytest.raises(specc.SpecError) as e:
        specc.load_spec(preset, overrides)
    assert str(e.value).startswith(f"--set {key}: error:") and words in str(e.value)  # located at the key


@pytest.mark.parametrize("case_id", ["t5-relu", "umt5-perlayer"])
def test_onnx_contrib_attention_matches_hf(family, case_id: str, tmp_path: Path) -> None:
    """--attention contrib: the bias (with every mask) as MultiHeadAttention's additive attention_bias."""
    s = family(case_id)
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, attention="contrib")
    fused = [n for n in onnx.load(str(path)).graph.node if n.op_type.endswith("Attention")]
    assert len(fused) == s.spec.blocks.encoder + 2 * s.spec.blocks.decoder
    assert all(n.domain == "com.microsoft" for n in fused)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = _inputs()
    _close(s, x, sess.run(["logits"], {k: v.numpy() for k, v in x.items()})[0])
