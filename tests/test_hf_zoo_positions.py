"""The families whose positions are numbered other than by index: RoBERTa and DistilBERT imported from config.json
compute the HF function (one test per family: torch and ONNX with one fused attention node per layer within 1e-4
of the logit scale on a padded batch, the analyzer's ``params.total`` against ``num_parameters()``, export-hf back
to the same class; for RoBERTa, that its numbering after the padding id, skipping padding, is what makes the
left-padded row equal), and OPT's offset table on a left-padded batch, where padded slots read row 1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hf_families_zoo import FAMILY_BY_ID
from test_hf_families import ATTENTION_OPS, RTOL_OF_SCALE
from test_hf_zoo import STD, Case, save

import specc
from specc.interop import import_hf
from specc.interop.hf_export import export_hf

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

_ROBERTA = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=96,
    max_position_embeddings=40,
    type_vocab_size=1,
    pad_token_id=1,
)
_DISTIL = dict(dim=64, hidden_dim=96, n_layers=2, n_heads=4, vocab_size=96, max_position_embeddings=40)


def _batch(vocab: int, pad: int) -> dict[str, torch.Tensor]:
    """Rows of 11 real tokens, 8 then right padding, 6 after left padding; padded slots hold the pad id."""
    ids = torch.randint(3, vocab - 1, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 8:], mask[2, :5] = 0, 0
    return {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}


def _hf(model: Any, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**x)
    if getattr(out, "logits", None) is not None:
        return {"logits": out.logits}
    refs = {"last_hidden_state": out.last_hidden_state}
    if getattr(out, "pooler_output", None) is not None:
        refs["pooler_output"] = out.pooler_output
    return refs


def _close(got: dict[str, Any], want: dict[str, torch.Tensor], keep: torch.Tensor, what: str) -> None:
    for name, ref in want.items():
        value = torch.as_tensor(np.asarray(got[name]))
        if name != "pooler_output":  # every real token (padded slots carry no meaning)
            value, ref = value[keep], ref[keep]
        tol = RTOL_OF_SCALE * max(1.0, float(ref.abs().max()))
        torch.testing.assert_close(value, ref, atol=tol, rtol=0, msg=lambda m, n=name: f"{what} {n}: {m}")


def _onnx(spec: Any, weights: str, x: dict[str, torch.Tensor], path: Path) -> dict[str, Any]:
    specc.export_onnx(spec, path, weights=weights)
    fused = [n for n in onnx.load(str(path)).graph.node if n.op_type in ATTENTION_OPS]
    assert len(fused) == spec.blocks
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    zeros = torch.zeros_like(x["input_ids"])  # token_type_ids: HF's default, all type 0
    feeds = {i.name: x.get(i.name, zeros).numpy() for i in sess.get_inputs()}
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def _check_family(case: Case, tmp_path: Path, pad: int) -> tuple[Any, Any, str, dict[str, torch.Tensor]]:
    hf, folder = save(case, tmp_path / "hf", std=STD)
    imported = import_hf(folder)
    spec, weights = imported.spec, str(folder / "model.safetensors")
    x = _batch(hf.config.vocab_size, pad)
    want, keep = _hf(hf, x), x["attention_mask"].bool()
    with torch.no_grad():
        _close(specc.build_torch(spec, weights=weights).run(dict(x)), want, keep, f"{case.id} torch")
    _close(_onnx(spec, weights, x, tmp_path / "model.onnx"), want, keep, f"{case.id} onnx")
    assert specc.analyze(spec).to_dict()["params"]["total"] == hf.num_parameters()
    assert specc.lower(spec).num_params() == hf.num_parameters()
    _exported_equal(hf, spec, weights, x, keep, tmp_path)
    return hf, imported, weights, x


def _exported_equal(hf: Any, spec: Any, weights: str, x: dict[str, torch.Tensor], keep: Any, tmp: Path) -> None:
    """export-hf writes the class back: transformers loads it and computes the same outputs."""
    model = specc.build_torch(spec, weights=weights)
    state = model.state_dict()
    done = export_hf(spec, {k: state[k] for k in model.graph.params()}, tmp / "out")
    assert done.architecture == type(hf).__name__
    back = type(hf).from_pretrained(done.folder).eval()
    _close({k: v.numpy() for k, v in _hf(back, x).items()}, _hf(hf, x), keep, f"{done.architecture} export-hf")


ROBERTA_CLASSES = [("RobertaForMaskedLM", "mlm"), ("RobertaModel", "pooled")]
DISTILBERT_CLASSES = [("DistilBertForMaskedLM", "mlm"), ("DistilBertModel", "none")]
ROUND_TRIPPED = {arch for arch, _ in ROBERTA_CLASSES + DISTILBERT_CLASSES}  # export-hf checked here


@pytest.mark.parametrize(("arch", "head"), ROBERTA_CLASSES)
def test_roberta_matches_hf(tmp_path: Path, arch: str, head: str) -> None:
    case = Case(f"roberta-{head}", arch, _ROBERTA)
    hf, imported, weights, x = _check_family(case, tmp_path, pad=1)
    s = imported.spec
    # positions start after the padding id: 40 rows, 2 before position 0
    assert (s.position.offset, s.position.skip_padding, s.context) == (2, True, 38)
    # numbered by index instead, the left-padded row is no longer HF's (so the numbering is what the test checks)
    by_index = specc.load_spec({**imported.document, "position": {"type": "learned", "offset": 2}})
    with torch.no_grad():
        got = specc.build_torch(by_index, weights=weights).run(dict(x))
    name = "logits" if head == "mlm" else "last_hidden_state"
    row = x["attention_mask"][2].bool()
    assert (torch.as_tensor(got[name])[2][row] - _hf(hf, x)[name][2][row]).abs().max() > 1e-2


@pytest.mark.parametrize(("arch", "head"), DISTILBERT_CLASSES)
def test_distilbert_matches_hf(tmp_path: Path, arch: str, head: str) -> None:
    # DistilBERT numbers positions by index, as specc's encoders do: only the right-padded rows are compared
    case = Case(f"distilbert-{head}", arch, dict(_DISTIL, activation="gelu" if head == "mlm" else "relu"))
    hf, folder = save(case, tmp_path / "hf", std=STD)
    spec, weights = import_hf(folder).spec, str(folder / "model.safetensors")
    x = _batch(hf.config.vocab_size, 0)
    x = {k: v[:2] for k, v in x.items()}  # rows 0 and 1: full and right-padded
    want, keep = _hf(hf, x), x["attention_mask"].bool()
    with torch.no_grad():
        _close(specc.build_torch(spec, weights=weights).run(dict(x)), want, keep, f"{case.id} torch")
    _close(_onnx(spec, weights, x, tmp_path / "model.onnx"), want, keep, f"{case.id} onnx")
    assert specc.analyze(spec).to_dict()["params"]["total"] == hf.num_parameters()
    assert spec.head == head and spec.type_vocab_size == 0
    _exported_equal(hf, spec, weights, x, keep, tmp_path)


def test_opt_left_padded_batch_matches_hf(tmp_path: Path) -> None:
    """Left padding moves every real token's position (cumsum of the mask): OPT's rows follow it in torch and ONNX."""
    case = FAMILY_BY_ID["opt-pre"]
    hf, folder = save(case, tmp_path / "hf", std=STD)
    spec, weights = import_hf(folder).spec, str(folder / "model.safetensors")
    x = _batch(hf.config.vocab_size, hf.config.pad_token_id)
    want, keep = _hf(hf, x), x["attention_mask"].bool()
    with torch.no_grad():
        _close(specc.build_torch(spec, weights=weights).run(dict(x)), want, keep, "opt torch")
    _close(_onnx(spec, weights, x, tmp_path / "model.onnx"), want, keep, "opt onnx")
