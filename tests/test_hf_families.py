"""Today's decoder families imported from config.json compute the HF function: logits within 1e-4 of the logit
scale in torch and through ONNX (right-padded batch), parameter counts equal to ``num_parameters()``, and greedy
KV-cache generation (torch and ONNX) equal to HF ``generate``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hf_families_zoo import FAMILY_BY_ID, FAMILY_CASES, missing_features
from test_hf_equivalence import Saved, _hf_greedy, _inputs, _pairs
from test_hf_zoo import STD, Case, save

import specc
from specc.interop import import_hf

ort = pytest.importorskip("onnxruntime")

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention")
RTOL_OF_SCALE = 1e-4  # tolerance = 1e-4 × the largest |logit| of the reference (at least 1e-4)


def _skip_missing(case: Case) -> None:
    need = missing_features(case)
    if need:
        pytest.skip(f"{case.id} needs spec fields specc does not have yet: {', '.join(need)}")


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Saved]:
    """Each family case saved and imported once per module."""
    cache: dict[str, Saved] = {}

    def get(case_id: str) -> Saved:
        case = FAMILY_BY_ID[case_id]
        _skip_missing(case)
        if case_id not in cache:
            model, folder = save(case, tmp_path_factory.mktemp(case_id), std=STD)
            cache[case_id] = Saved(case, model, folder, import_hf(folder).spec)
        return cache[case_id]

    return get


def assert_close_to_hf(s: Saved, x: dict[str, torch.Tensor], got: dict[str, Any]) -> None:
    for name, (value, ref) in _pairs(s, x, got).items():
        tol = RTOL_OF_SCALE * max(1.0, float(ref.abs().max()))
        torch.testing.assert_close(value, ref, atol=tol, rtol=0, msg=lambda m, n=name: f"{s.case.id} {n}: {m}")


@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.id)
def test_torch_backend_matches_hf(family, case: Case) -> None:
    s = family(case.id)
    x = _inputs(s)
    with torch.no_grad():
        got = specc.build_torch(s.spec, weights=s.weights).run(dict(x))
    assert_close_to_hf(s, x, got)


@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.id)
def test_onnx_matches_hf(family, case: Case, tmp_path: Path) -> None:
    s = family(case.id)
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights)
    import onnx

    fused = [n for n in onnx.load(str(path)).graph.node if n.op_type in ATTENTION_OPS]
    assert len(fused) == s.spec.blocks  # one fused attention node per layer, whatever its kind
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = _inputs(s)
    feeds = {i.name: x[i.name].numpy() for i in sess.get_inputs()}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    assert_close_to_hf(s, x, got)


@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.id)
def test_parameter_counts_agree(family, case: Case) -> None:
    s = family(case.id)
    want = s.hf.num_parameters()
    assert specc.lower(s.spec).num_params() == want
    assert specc.analyze(s.spec).to_dict()["params"]["total"] == want
    assert sum(p.numel() for p in specc.build_torch(s.spec, device="meta").parameters()) == want


@pytest.mark.parametrize("case", FAMILY_CASES, ids=lambda c: c.id)
def test_greedy_generation_matches_hf_generate(family, case: Case, tmp_path: Path) -> None:
    s = family(case.id)
    ids = torch.randint(3, s.hf.config.vocab_size - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    n = 10
    want, _ = _hf_greedy(s, ids, n)
    assert len(set(want[0].tolist())) >= 2, "HF's continuation repeats one token: the check would be weak"
    model = specc.build_torch(s.spec, weights=s.weights)
    got = model.generate(ids, n, use_cache=True)
    assert got[:, -n:].tolist() == want.tolist()

    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, kv_cache=True)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    assert greedy(OrtModel.open(path, provider="cpu", threads=2), feeds, n).tolist() == want.tolist()


@pytest.mark.parametrize("case_id", ["gptoss-sinks", "bloom-alibi", "llama4-chunked"])
def test_onnx_contrib_attention_matches_hf(family, case_id: str, tmp_path: Path) -> None:
    """--attention contrib: GPT-OSS's sinks as GroupQueryAttention's head_sink, ALiBi as its attention_bias,
    Llama 4's temperature tuning as a pre-op on q (GroupQueryAttention then takes q, k and v apart)."""
    s = family(case_id)
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, attention="contrib")
    import onnx

    fused = [n for n in onnx.load(str(path)).graph.node if n.op_type in ATTENTION_OPS]
    assert len(fused) == s.spec.blocks and {n.op_type for n in fused} == {"GroupQueryAttention"}
    if case_id.startswith("gptoss"):
        assert all(len(n.input) > 11 and n.input[11].endswith(".core.sinks") for n in fused)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    x = _inputs(s)
    feeds = {i.name: x[i.name].numpy() for i in sess.get_inputs()}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    assert_close_to_hf(s, x, got)


def test_llama4_dense_moe_onnx_matches_hf(family, tmp_path: Path) -> None:
    """--moe dense: every expert on every token, Llama 4's gates on their inputs and the chosen experts kept."""
    s = family("llama4-chunked")
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, moe="dense")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = _inputs(s)
    feeds = {i.name: x[i.name].numpy() for i in sess.get_inputs()}
    assert_close_to_hf(s, x, dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True)))


def test_llama4_chunks_start_at_each_left_padded_rows_first_token(family, tmp_path: Path) -> None:
    """Left padding of 3 and 5 (not multiples of the chunk of 4): HF starts a row's chunks at its first real
    token, so do torch, ONNX, the KV-cache steps of both and model.py."""
    s = family("llama4-chunked")
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, s.hf.config.vocab_size - 1, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3], mask[2, :5] = 0, 0
    x = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        ref = s.hf(**x).logits
        model = specc.build_torch(s.spec, weights=s.weights)
        got = model.run(dict(x))["logits"]
    real = mask.bool()
    tol = RTOL_OF_SCALE * max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(got[real], ref[real], atol=tol, rtol=0)

    sess = ort.InferenceSession(str(specc.export_onnx(s.spec, tmp_path / "m.onnx", weights=s.weights)))
    out = torch.from_numpy(sess.run(["logits"], {k: v.numpy() for k, v in x.items()})[0])
    torch.testing.assert_close(out[real], ref[real], atol=tol, rtol=0)

    n = 8
    gc = s.hf.generation_config
    gc.update(eos_token_id=None, forced_eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        want = s.hf.generate(**x, max_new_tokens=n, min_new_tokens=n)[:, -n:]
        assert model.generate(ids, n, attention_mask=mask, use_cache=True)[:, -n:].tolist() == want.tolist()

    from specc.backends.torch import write_model_py
    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    path = specc.export_onnx(s.spec, tmp_path / "kv.onnx", weights=s.weights, kv_cache=True)
    feeds = {k: v.numpy() for k, v in x.items()}
    assert greedy(OrtModel.open(path, provider="cpu", threads=2), feeds, n).tolist() == want.tolist()

    import importlib.util

    loaded = importlib.util.spec_from_file_location("llama4_chunkpad", write_model_py(s.spec, tmp_path / "l4.py"))
    assert loaded and loaded.loader
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    standalone = module.build()
    standalone.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(standalone(**x), got, atol=1e-5, rtol=1e-5)
