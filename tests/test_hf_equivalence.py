"""Imported HF models compute the HF function: logits within 1e-4 (fp32) in the torch backend and through ONNX,
with padding masks; greedy generation with the KV cache gives HF's tokens; parameter counts agree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_hf_zoo import BY_ID, CASES, STD, Case, save

import specc
from specc.interop import import_hf

ort = pytest.importorskip("onnxruntime")

ATOL = 1e-4
GEN_CASES = [c for c in CASES if c.text and c.family not in ("bert", "cliptext", "modernbert")]


@dataclass
class Saved:
    case: Case
    hf: Any  # the transformers model
    folder: Path
    spec: Any

    @property
    def weights(self) -> str:
        return str(self.folder / "model.safetensors")


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Saved]:
    """Each zoo model saved and imported once per module (per init std)."""
    cache: dict[tuple[str, float], Saved] = {}

    def get(case_id: str, std: float = STD) -> Saved:
        if (case_id, std) not in cache:
            model, folder = save(BY_ID[case_id], tmp_path_factory.mktemp(case_id), std=std)
            cache[case_id, std] = Saved(BY_ID[case_id], model, folder, import_hf(folder).spec)
        return cache[case_id, std]

    return get


# ---------------------------------------------------------------------------------------------- inputs


def _inputs(s: Saved) -> dict[str, torch.Tensor]:
    """A batch with right padding (rows of 11, 8 and 6 real tokens) and, for BERT, mixed token types."""
    g = torch.Generator().manual_seed(1)
    c = s.hf.config
    if s.case.family == "vit":
        return {"pixel_values": torch.randn(2, c.num_channels, c.image_size, c.image_size, generator=g)}
    ids = torch.randint(3, c.vocab_size - 1, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:], mask[2, 6:] = 0, 0
    if s.case.family == "cliptext":  # an EOS id at each row's last real token, and one after it in row 0
        ids[0, 10], ids[0, 4], ids[1, 7], ids[2, 5] = c.vocab_size - 1, c.eos_token_id, c.eos_token_id, c.eos_token_id
    out = {"input_ids": ids, "attention_mask": mask}
    if s.case.family == "bert":
        out["token_type_ids"] = torch.randint(0, c.type_vocab_size, ids.shape, generator=g)
    if s.case.seq2seq:
        target = getattr(c, "decoder_vocab_size", None) or c.vocab_size
        out["decoder_input_ids"] = torch.randint(3, target - 1, (3, 7), generator=g)
    return out


def _reference(s: Saved, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = s.hf(**x)
    towers = ("CLIPVisionModel", "CLIPTextModel", "SiglipVisionModel", "ModernBertModel")
    if s.case.arch in ("BertModel", "ViTModel", *towers):
        pooled = {"pooler_output": out.pooler_output} if getattr(out, "pooler_output", None) is not None else {}
        return {"last_hidden_state": out.last_hidden_state, **pooled}
    return {"logits": out.logits}


def _pairs(s: Saved, x: dict[str, torch.Tensor], got: dict[str, Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(specc's, HF's) value of every output the two share, on the positions that are read."""
    out = {}
    for name, ref in _reference(s, x).items():
        value = torch.as_tensor(np.asarray(got[name]))
        if s.case.text and not s.case.seq2seq and s.case.family != "bert" and ref.dim() == 3:
            keep = x["attention_mask"].bool()  # a decoder's padded positions are never read
            value, ref = value[keep], ref[keep]
        out[name] = value, ref
    return out


def _compare(s: Saved, x: dict[str, torch.Tensor], got: dict[str, Any]) -> None:
    for name, (value, ref) in _pairs(s, x, got).items():
        torch.testing.assert_close(value, ref, atol=ATOL, rtol=0, msg=lambda m, n=name: f"{s.case.id} {n}: {m}")


# ---------------------------------------------------------------------------------------------- logits


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_torch_backend_matches_hf(zoo, case: Case) -> None:
    s = zoo(case.id)
    model = specc.build_torch(s.spec, weights=s.weights)
    x = _inputs(s)
    with torch.no_grad():
        got = model.run(dict(x))
    _compare(s, x, got)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_onnx_matches_hf(zoo, case: Case, tmp_path: Path) -> None:
    s = zoo(case.id)
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = _inputs(s)
    feeds = {i.name: x[i.name].numpy() for i in sess.get_inputs()}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    _compare(s, x, got)


def test_without_the_weights_the_logits_differ(zoo) -> None:
    """The comparisons above are not vacuous: specc's own initialisation is far from the HF model."""
    s = zoo("llama-gqa")
    x = _inputs(s)
    with torch.no_grad():
        got = specc.build_torch(s.spec).run(dict(x))["logits"]
    assert (got - _reference(s, x)["logits"]).abs().max() > 100 * ATOL


# One mistake per family that the comparisons above must catch. At HF's init std 0.02 they moved the outputs by
# the amount in the comment (below ATOL but for Mixtral's), so the tests passed on a wrong model; with the zoo's
# weights (test_hf_zoo.STD) each moves them by more than 10 × ATOL.
MUTATIONS = [
    ("gpt2-tied", "attention.scale", "1/head_dim"),  # instead of 1/sqrt(head_dim): 5.9e-5 at std 0.02
    ("gpt2-tied", "mlp.activation", "gelu"),  # gelu_new read as the exact gelu: 4.9e-7
    ("llama-gqa", "position.theta", 20000.0),  # a wrong RoPE base: 6.1e-5
    ("mistral-window", "position.theta", 20000.0),  # 5.8e-5
    ("mixtral-4x2", "position.theta", 20000.0),  # 1.7e-4
    ("bert-mlm", "mlp.activation", "gelu_tanh"),  # the exact gelu approximated: 1.9e-7
    ("vit-cls", "attention.scale", "1/head_dim"),  # 2.6e-5
    ("vit-clip", "mlp.activation", "gelu"),  # quick_gelu read as gelu
    ("vit-siglip", "norm.eps", 1e-2),  # another eps in every norm, the pooling head's too
    ("modernbert-mlm", "layer_kinds.local.attention.window", 8),  # wider two-sided windows
    ("modernbert-model", "layer_kinds.local.position.theta", 1000.0),  # the global layers' RoPE base
    ("cliptext-eos", "eos_token", 95),  # pooled at another token
    ("cliptext-legacy", "attention.mask", "none"),  # bidirectional instead of causal
    ("bart-tied", "mlp.activation", "gelu_tanh"),  # 1.5e-7
    ("marian-unshared", "attention.scale", "1/head_dim"),  # 1.6e-5
]


@pytest.mark.parametrize(("case_id", "key", "value"), MUTATIONS, ids=lambda v: str(v))
def test_a_mutated_import_fails_the_comparison(zoo, case_id: str, key: str, value: Any) -> None:
    """The logits comparison is sensitive: the import is within ATOL, the same spec with one field wrong is not."""
    s = zoo(case_id)
    doc = import_hf(s.folder).document
    if value == "1/head_dim":
        value = 1.0 / (s.spec.attention.head_dim or s.spec.d_model // s.spec.attention.heads)
    wrong = specc.load_spec(doc, overrides={key: value})
    assert wrong != s.spec
    x = _inputs(s)

    def worst(spec: Any) -> float:
        with torch.no_grad():
            got = specc.build_torch(spec, weights=s.weights).run(dict(x))
        return max(float((v - r).abs().max()) for v, r in _pairs(s, x, got).values())

    assert worst(s.spec) <= ATOL
    assert worst(wrong) > 10 * ATOL, f"{case_id}: {key}={value} is not caught"


# ---------------------------------------------------------------------------------------------- generation


def _hf_greedy(s: Saved, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's greedy tokens and per-step logits, with no EOS stopping or forcing."""
    gc = s.hf.generation_config
    gc.update(eos_token_id=None, forced_eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        out = s.hf.generate(ids, max_new_tokens=n, min_new_tokens=n, output_logits=True, return_dict_in_generate=True)
    start = 1 if s.case.seq2seq else ids.shape[1]
    return out.sequences[:, start:], torch.stack(out.logits, 1)


@pytest.mark.parametrize("case", GEN_CASES, ids=lambda c: c.id)
def test_greedy_generation_with_kv_cache_matches_hf_generate(zoo, case: Case, tmp_path: Path) -> None:
    s = zoo(case.id)  # the zoo's weights (std 0.3) are sharp enough for varied tokens rather than one repeated
    ids = torch.randint(3, s.hf.config.vocab_size - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    n = 10
    want, want_logits = _hf_greedy(s, ids, n)
    start = s.hf.config.decoder_start_token_id if case.seq2seq else 0
    seq2seq = {"decoder_start_token_id": start} if case.seq2seq else {}
    model = specc.build_torch(s.spec, weights=s.weights)
    got = model.generate(ids, n, use_cache=True, **seq2seq)  # a decoder refuses an encoder-decoder's option
    assert got[:, -n:].tolist() == want.tolist()

    # the cached steps themselves, logit by logit (equal tokens alone could hide a cache that drifts)
    prompt = torch.full((1, 1), start) if case.seq2seq else ids
    total = prompt.shape[1] + n
    cache = model.start({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, total)
    seq = torch.cat([prompt, want], 1)
    steps = [model.step(cache, prompt)]
    steps += [model.step(cache, seq[:, i : i + 1]) for i in range(prompt.shape[1], total - 1)]
    torch.testing.assert_close(torch.cat(steps, 1), want_logits, atol=ATOL, rtol=0)

    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, kv_cache=True)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    onnx = greedy(OrtModel.open(path, provider="cpu", threads=2), feeds, n, start_id=start)
    assert onnx.tolist() == want.tolist()


def test_generated_tokens_are_not_degenerate(zoo) -> None:
    """The generation cases exercise the cache: HF's own continuation varies from step to step."""
    ids = torch.randint(3, 90, (1, 6), generator=torch.Generator().manual_seed(2))
    for case_id in ("gpt2-tied", "llama-gqa", "mixtral-4x2", "bart-untied"):
        tokens, _ = _hf_greedy(zoo(case_id), ids, 10)
        assert len(set(tokens[0].tolist())) >= 2, case_id


# ---------------------------------------------------------------------------------------------- counts


def _hf_count_in_specc_terms(s: Saved) -> int:
    """HF num_parameters(), adjusted for the documented differences in what each side counts as a parameter."""
    c, n = s.hf.config, s.hf.num_parameters()
    if s.case.family in ("bart", "marian"):
        target = getattr(c, "decoder_vocab_size", None) or c.vocab_size
        n += target  # final_logits_bias: an HF buffer, specc's lm_head.bias parameter
    # BART's 2 leading position rows are specc's position.offset rows; untied, it keeps a `shared` table
    # neither stack reads
    if s.case.family == "bart" and not c.tie_word_embeddings:
        n -= c.vocab_size * c.d_model
    if s.case.family == "marian":
        n -= 2 * c.max_position_embeddings * c.d_model  # fixed sinusoids: frozen HF parameters, computed by specc
    return n


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_parameter_counts_agree(zoo, case: Case) -> None:
    s = zoo(case.id)
    want = _hf_count_in_specc_terms(s)
    assert specc.lower(s.spec).num_params() == want
    params = specc.analyze(s.spec).to_dict()["params"]
    assert params["stored"] == want  # what specc holds; total is what the reference implementation counts
    assert params["total"] == s.hf.num_parameters()
    assert params["trainable"] == s.hf.num_parameters(only_trainable=True)
    built = specc.build_torch(s.spec, device="meta")
    assert sum(p.numel() for p in built.parameters()) == want
    if case.family not in ("bart", "marian"):
        assert want == s.hf.num_parameters()  # no adjustment at all for the other families
