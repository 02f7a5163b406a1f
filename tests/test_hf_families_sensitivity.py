"""The family comparisons are sensitive: each import is within tolerance of HF, and the same spec with one of
the family's feature fields changed is not (so a feature lowered wrongly, or read wrongly off config.json,
fails tests/test_hf_families.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hf_families_zoo import FAMILY_BY_ID
from test_hf_equivalence import _inputs, _pairs
from test_hf_families import RTOL_OF_SCALE, family  # noqa: F401 (the fixture)

import specc
from specc.interop import import_hf

MUTATIONS = [
    ("qwen2-mixed", "layer_kinds.sliding.attention.window", 8),  # the sequences (11) outgrow both windows
    ("qwen2moe-shared", "mlp.router.normalize", True),
    ("qwen2moe-step", "mlp.router.normalize", False),  # norm_topk_prob: true
    ("qwen3-qknorm", "norm.eps", 0.5),  # the QK-norms read norm.eps
    ("gemma-geglu", "norm.unit_offset", False),
    ("gemma-geglu", "embedding_scale", 1.0),
    ("gemma2-sandwich", "attention.softcap", 50.0),
    ("gemma2-sandwich", "output.softcap", 30.0),
    ("gemma2-sandwich", "attention.scale", 32**-0.5),
    ("gemma3-local", "layer_kinds.sliding.position.theta", 1000000.0),
    ("phi3-longrope-long", "position.scaling.original_max_positions", 32),  # the short factors instead
    ("llama3-rope", "position.scaling.high_freq_factor", 2.0),
    ("llama-yarn", "position.scaling.factor", 2.0),
    ("gptj-interleaved", "position.rotation", "half"),
    ("neox-parallel", "position.fraction", 0.5),
    ("olmo2-post", "norm.eps", 0.3),  # read by the post-sublayer and the full-width QK norms
    ("bloom-alibi", "position.max_bias", 4.0),  # the slopes
    ("mpt-alibi", "position.max_bias", 16.0),
    ("falcon-rw-alibi", "position.scaled", False),  # the bias scaled with the scores
    ("gptoss-sinks", "mlp.clamp.limit", 7.0),  # the twin's activations pass its limit 1.5
    ("gptoss-sinks", "mlp.clamp.alpha", 1.0),
    ("llama4-chunked", "layer_kinds.nope.attention.temperature.scale", 0.05),  # the factor at positions 3..10
    ("llama4-chunked", "layer_kinds.rope.attention.qk_norm", "none"),
    ("llama4-chunked", "layer_kinds.rope_dense.attention.chunk", 8),
    ("llama4-chunked", "mlp.router.weighs", "output"),
    ("llama4-chunked", "position.rotation", "half"),
]


@pytest.mark.parametrize(("case_id", "key", "value"), MUTATIONS, ids=lambda v: str(v))
def test_a_mutated_import_fails_the_comparison(family, case_id: str, key: str, value: Any) -> None:  # noqa: F811
    s = family(case_id)
    wrong = specc.load_spec(import_hf(s.folder).document, overrides={key: value})
    assert wrong != s.spec
    x = _inputs(s)

    def worst(spec: Any) -> float:
        with torch.no_grad():
            got = specc.build_torch(spec, weights=s.weights).run(dict(x))
        return max(float((v - r).abs().max()) / max(1.0, float(r.abs().max())) for v, r in _pairs(s, x, got).values())

    assert worst(s.spec) <= RTOL_OF_SCALE
    assert worst(wrong) > 10 * RTOL_OF_SCALE, f"{case_id}: {key}={value} is not caught"


def test_mutations_name_real_cases() -> None:
    assert {c for c, _, _ in MUTATIONS} <= set(FAMILY_BY_ID)


def test_the_sinks_are_felt(family) -> None:  # noqa: F811
    """GPT-OSS's twin is within tolerance with its sinks and not without them (a sink of -inf takes no share)."""
    s = family("gptoss-sinks")
    x = _inputs(s)
    model = specc.build_torch(s.spec, weights=s.weights)

    def worst() -> float:
        with torch.no_grad():
            got = model.run(dict(x))
        return max(float((v - r).abs().max()) / max(1.0, float(r.abs().max())) for v, r in _pairs(s, x, got).values())

    assert worst() <= RTOL_OF_SCALE
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".core.sinks"):
                p.fill_(float("-inf"))
    assert worst() > 10 * RTOL_OF_SCALE


def test_falcon_rw_rounds_its_alibi_bias_to_bf16(family) -> None:  # noqa: F811
    """transformers' Falcon (as Falcon-RW's own code) rounds slope · position to bfloat16: over 48 tokens the
    imported spec (bias_dtype bf16) is within tolerance of HF and the exact bias (fp32) is not."""
    s = family("falcon-rw-alibi")
    ids = torch.randint(3, s.hf.config.vocab_size - 1, (1, 48), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = s.hf(ids).logits
        tol = RTOL_OF_SCALE * max(1.0, float(ref.abs().max()))
        exact = specc.load_spec(import_hf(s.folder).document, overrides={"position.bias_dtype": "fp32"})
        got, wrong = (specc.build_torch(spec, weights=s.weights)(ids) for spec in (s.spec, exact))
    assert float((got - ref).abs().max()) <= tol
    assert float((wrong - ref).abs().max()) > 10 * tol
