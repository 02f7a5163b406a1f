"""Left-padded batches in the torch backend: positions follow attention_mask (cumsum - 1, as HF's generate
counts them), so a padded row computes and generates what it would alone, and what HF generates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_onnx_left_padding import DECODERS, LENGTHS, NEW, _batch
from test_onnx_left_padding import hf_zoo as hf_zoo

import specc
from specc.backends.torch import build_torch


def _model(name: str) -> Any:
    return build_torch(specc.load_spec(*DECODERS[name]))


@pytest.mark.parametrize("name", list(DECODERS))
def test_left_padded_forward_equals_each_row_alone(name: str) -> None:
    model = _model(name)
    ids, mask, rows = _batch(61)
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
    with torch.no_grad():
        got = model(ids, mask)
        for i, row in enumerate(rows):
            alone = model(torch.from_numpy(row)[None])
            torch.testing.assert_close(got[i, -len(row) :], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("use_cache", [True, False], ids=["kv_cache", "recompute"])
@pytest.mark.parametrize("name", list(DECODERS))
def test_left_padded_greedy_equals_each_row_alone(name: str, use_cache: bool) -> None:
    model = _model(name)
    ids, mask, rows = _batch(61, seed=1)
    out = model.generate(torch.from_numpy(ids), NEW, attention_mask=torch.from_numpy(mask), use_cache=use_cache)
    for i, row in enumerate(rows):
        alone = model.generate(torch.from_numpy(row)[None], NEW, use_cache=use_cache)
        assert out[i, -NEW:].tolist() == alone[0, -NEW:].tolist()
    assert max(LENGTHS) + NEW == out.shape[1]


@pytest.mark.parametrize("case_id", ["gpt2-tied", "llama-gqa"])
def test_left_padded_generation_equals_hf_generate(hf_zoo: Any, case_id: str, tmp_path: Path) -> None:
    hf, spec, weights = hf_zoo(case_id)
    model = build_torch(spec, weights=weights)
    ids, mask, _ = _batch(hf.config.vocab_size, seed=4, low=3)
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
    hf.generation_config.update(eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        want = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW)[:, ids.shape[1] :]
    got = model.generate(ids, NEW, attention_mask=mask)[:, ids.shape[1] :]
    assert got.tolist() == want.tolist()
