"""A distributed checkpoint folder read in one process: its tensors are checked against the spec it carries,
with or without reading them (``weights=False``, as a sharded resume does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specc
from specc.errors import SpecError
from specc.parallel import sharded_checkpoint as distributed
from specc.spec.serialize import SPEC_KEY, spec_json

TINY = ["blocks=1", "d_model=32", "attention.heads=4", "vocab_size=64", "context=16", "dtype=fp32"]


def _folder(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    spec = specc.load_spec("gpt2", TINY)
    model = specc.build_torch(spec)
    return distributed.save(model, tmp_path / "ck", spec, {"step": 3}), model


def test_a_folder_reads_back_whole_or_checked_only(tmp_path: Path) -> None:
    path, model = _folder(tmp_path)
    whole = distributed.load(path)
    assert all(torch.equal(whole.weights[k], v) for k, v in model.state_dict().items())
    checked = distributed.load(path, weights=False)
    assert checked.weights == {} and checked.optimizer is None and checked.spec == whole.spec


def test_tensors_that_do_not_fit_the_carried_spec_are_refused_even_unread(tmp_path: Path) -> None:
    path, _ = _folder(tmp_path)
    meta = json.loads((path / distributed.META_FILE).read_text())
    for sets, message in ((["vocab_size=80"], r"embed\.weight has shape \[64, 32\]; the spec needs \[80, 32\]"),
                          (["blocks=2"], "the checkpoint's tensors do not match its spec")):  # fmt: skip
        meta[SPEC_KEY] = spec_json(specc.load_spec("gpt2", [*TINY, *sets]))
        (path / distributed.META_FILE).write_text(json.dumps(meta))
        for weights in (True, False):
            with pytest.raises(SpecError, match=message):
                distributed.load(path, weights=weights)
