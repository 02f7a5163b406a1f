"""``--provider cuda`` where CUDA cannot run says why in one line (exit 2), from what the session really loaded."""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest

import specc
from specc.errors import SpecError
from specc.runtime.ort_session import CPU, CUDA, open_session

TINY = ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=23", "context=8", "mlp.hidden=32"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return specc.export_onnx(specc.load_spec("gpt2", TINY), tmp_path_factory.mktemp("m") / "m.onnx")


def test_cuda_provider_that_cannot_run_names_the_reason(model: Path) -> None:
    if CUDA not in ort.get_available_providers():
        with pytest.raises(SpecError, match="no CUDA execution provider"):
            open_session(model, "cuda")
        return
    try:
        _, active = open_session(model, "auto")
    except SpecError as e:  # pragma: no cover - a broken GPU stack
        pytest.skip(str(e))
    if active == CUDA:
        pytest.skip("CUDA runs here")
    assert active == CPU  # auto falls back
    with pytest.raises(SpecError) as info:
        open_session(model, "cuda")
    msg = str(info.value)
    assert "the CUDA execution provider did not load: " in msg
    reason = msg.split("did not load: ", 1)[1].splitlines()[0]
    assert "no NVIDIA GPU is visible" in reason or "cannot be loaded" in reason, reason
