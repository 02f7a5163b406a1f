"""For every imported family, the analyzer's matmul FLOPs equal FlopCounterMode on the generated module, for the
forward pass and for one cached decode step (attention through SDPA's math path, which FlopCounterMode sees)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hf_families_zoo import FAMILY_BY_ID, missing_features
from test_hf_zoo import Case, transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import specc
from specc.analysis import analyze
from specc.interop import import_hf

B, N = 2, 11
# The decode step follows a 9-token prompt, longer than the sliding windows of the cases: a windowed layer's step
# attends over its window only (WindowedAttention), which is what the analyzer counts.
PROMPT = 9
# one case per family, with its features on (the other cases only vary sizes and flags)
CASES = [
    FAMILY_BY_ID[c]
    for c in (
        "qwen2-mixed",
        "qwen2moe-shared",
        "qwen3moe-topk",
        "phi3-longrope-long",
        "llama3-rope",
        "gemma-geglu",
        "gemma2-sandwich",
        "gemma3-local",
        "olmo2-post",
        "phi-parallel",
        "neox-parallel",
        "gptj-interleaved",
        "falcon-7b-style",
        "falcon-40b-style",
        "bloom-alibi",
        "gptoss-sinks",
        "llama4-chunked",
    )
]


def _spec(case: Case, folder: Path) -> Any:
    need = missing_features(case)
    if need:
        pytest.skip(f"{case.id} needs spec fields specc does not have yet: {', '.join(need)}")
    config_cls = getattr(transformers, getattr(transformers, case.arch).config_class.__name__)
    config = config_cls(**case.config)
    config.architectures = [case.arch]
    config.save_pretrained(folder)  # config.json only: the FLOPs need no weights
    return import_hf(folder).spec


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_forward_and_decode_step_flops_equal_flop_counter(case: Case, tmp_path: Path) -> None:
    spec = _spec(case, tmp_path)
    g, model = specc.lower(spec), specc.build_torch(spec).eval()
    ids = torch.randint(0, 50, (B, N), generator=torch.Generator().manual_seed(0))
    forward = analyze(g, batch=B, seq=N, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    step = analyze(g, batch=B, seq=PROMPT, kv_len=PROMPT + 1, crossover=False).to_dict()["flops"]["decode_step"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as counter:
            model(ids)
        assert counter.get_total_flops() == forward
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:  # tied families included
            model(ids)
        assert counter.get_total_flops() == forward
        cache = model.start({"input_ids": ids[:, :PROMPT]}, max_len=32)
        model.step(cache, ids[:, :PROMPT])
        with FlopCounterMode(display=False) as counter:
            model.step(cache, ids[:, :1])
    assert counter.get_total_flops() == step["matmul"]
