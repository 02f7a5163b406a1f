"""Block features (QK-norm, softcapping, score scale, unit-offset RMSNorm, sandwich / output norms, parallel
sublayers, GeGLU-tanh, shared experts, logit transforms, embedding scale) compute HF's function: small random
HF models (weights redrawn at std 0.2 so that norm weights, offsets and caps matter) against the generated
torch module with the same weights copied by name. The analyzer's matmul FLOPs equal FlopCounterMode and its
parameter count the module's for every feature. The import of config.json files is tested elsewhere; here
the specs are written by hand."""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_block_cases import CASES, D, L, V, hf_model, spec_of  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import specc  # noqa: E402
from specc.analysis import analyze  # noqa: E402


def _pair(case: str) -> tuple[Any, Any, Any]:
    arch, config, fields, mapping = CASES[case]
    hf = hf_model(arch, **config)
    spec = spec_of(**fields)
    ours = specc.build_torch(spec, weights=mapping(hf.state_dict()))
    return hf, ours, spec


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_hf(case: str) -> None:
    hf, ours, _ = _pair(case)
    ids = torch.randint(0, V, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = hf(ids).logits, ours(ids)
    scale = max(1.0, want.abs().max().item())
    assert (got - want).abs().max().item() <= 1e-4 * scale
    assert sum(p.numel() for p in ours.parameters()) == hf.num_parameters()


@pytest.mark.parametrize("case", ["gemma2_sandwich_softcaps_scale", "gemma3_offset_qk_norm_local_global_kinds"])
def test_greedy_generation_equals_hf(case: str) -> None:
    """KV-cache decoding with softcaps, QK-norm and (Gemma 3) a sliding window shorter than the sequence."""
    hf, ours, _ = _pair(case)
    ids = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(2))
    want = hf.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, 6), want)


# ---------------------------------------------------------------------------------------------- costs

FEATURES = {
    "sandwich_offset_softcaps": dict(CASES["gemma2_sandwich_softcaps_scale"][2], output={"softcap": 2.0, "scale": 0.5}),
    "output_norms_full_qk": CASES["olmo2_output_norms_full_qk_norm"][2],
    "head_qk_norm": CASES["qwen3_head_qk_norm"][2],
    "parallel_shared": CASES["phi_parallel_shared_norm_head_bias"][2],
    "parallel_separate": CASES["neox_parallel_separate_norms"][2],
    "moe_shared_sigmoid": CASES["qwen2_moe_sigmoid_shared_expert"][2],
    "moe_classic_shared_ungated": dict(
        attention={"heads": 4},
        mlp={"type": "moe", "experts": 3, "active": 1, "expert": "classic", "hidden": 20, "shared": {"hidden": 36}},
    ),
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_matmul_flops_and_params_equal_module(name: str) -> None:
    spec = spec_of(**FEATURES[name])
    model, g = specc.build_torch(spec), specc.lower(spec)
    b, n = 2, 9
    report = analyze(g, batch=b, seq=n, crossover=False)
    ids = torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids)
    assert counter.get_total_flops() == report.to_dict()["flops"]["forward"]["matmul"]
    assert sum(p.numel() for p in model.parameters()) == report.params.total


def test_non_matmul_rows_count_the_new_elementwise_work() -> None:
    """QK-norm adds norm FLOPs over the q and k widths; the logit scale and softcap are lm_head rows."""

    def other(fields: dict[str, Any]) -> dict[str, int]:
        d = analyze(specc.lower(spec_of(**fields)), batch=1, seq=8, crossover=False).to_dict()["flops"]["forward"]
        return d["nonmatmul_by_category"]

    qk = FEATURES["head_qk_norm"]
    plain = dict(qk, attention={"heads": 4, "kv_heads": 2})
    h, kv, hd = 4, 2, 8
    assert other(qk)["norm"] - other(plain)["norm"] == 4 * 8 * (h + kv) * hd * L  # rmsnorm: 4 per element
    caps = FEATURES["sandwich_offset_softcaps"]
    uncapped = dict(caps, output={})
    assert other(caps)["lm_head"] - other(uncapped)["lm_head"] == (1 + 3) * 8 * V  # scale 1, softcap 3
    scores = dict(caps, attention={**caps["attention"], "softcap": None})
    assert other(caps)["softmax"] - other(scores)["softmax"] == 3 * 4 * 8 * 8 * L  # 3 per capped score


def test_geglu_tanh_is_gemma_mlp() -> None:
    """swiglu + activation gelu_tanh is HF's GemmaMLP (gelu_pytorch_tanh), and not the exact-erf GeGLU."""
    from transformers.models.gemma.modeling_gemma import GemmaMLP

    hf, ours, _ = _pair("gemma_offset_norm_geglu_embed_scale")
    mlp, ref = ours.blocks[0].mlp, hf.model.layers[0].mlp
    assert isinstance(ref, GemmaMLP)
    x = 3.0 * torch.randn(2, 5, D, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, got = ref(x), mlp(x)
        exact = mlp.down(torch.nn.functional.gelu(mlp.gate(x)) * mlp.up(x))
    err, other = (got - want).abs().max().item(), (exact - want).abs().max().item()
    assert err <= 1e-6 * want.abs().max().item()
    assert other > 100 * err  # the test tells the two GELUs apart


def test_embedding_scale_is_rounded_to_the_model_dtype() -> None:
    """bf16: the first block's input is HF Gemma's embeddings × torch.tensor(√d, dtype=bf16), bit for bit."""
    hf, ours, _ = _pair("gemma_offset_norm_geglu_embed_scale")
    hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
    seen: dict[str, Any] = {}
    hf.model.layers[0].register_forward_pre_hook(
        lambda m, a, kw: seen.__setitem__("hf", kw.get("hidden_states", a and a[0])), with_kwargs=True
    )
    ours.blocks[0].register_forward_pre_hook(lambda m, a: seen.__setitem__("ours", a[0]))
    ids = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        hf(ids), ours(ids)
    assert seen["ours"].dtype == torch.bfloat16 and torch.equal(seen["ours"], seen["hf"])
    unrounded = (ours.embed(ids).float() * D**0.5).to(torch.bfloat16)
    assert not torch.equal(unrounded, seen["ours"])  # rounding the scale first is what makes them equal


@pytest.mark.parametrize(
    "sets",
    [
        ["norm.placement=sandwich", "norm.unit_offset=true", "attention.qk_norm=head", "attention.softcap=2.0",
         "output={softcap: 3.0, scale: 0.5}", "embedding_scale=sqrt_d_model",
         "mlp={type: moe, experts: 4, active: 2, hidden: 16, shared: {hidden: 24, gate: sigmoid}}"],
        ["parallel=separate_norms", "attention.qk_norm=full", "norm.placement=pre"],
    ],
)  # fmt: skip
def test_standalone_model_py_computes_the_same_logits(tmp_path: Any, sets: list[str]) -> None:
    import subprocess
    import sys

    from specc.backends.torch import write_model_py

    small = ["blocks=2", "d_model=32", "attention.heads=4", "attention.kv_heads=2", "vocab_size=50", "context=64"]
    spec = specc.load_spec("llama2-7b", [*small, "mlp.hidden=48", "dtype=fp32", *sets])
    gen = torch.Generator().manual_seed(6)
    weights = {k: torch.randn(v.shape, generator=gen) * 0.3 for k, v in specc.build_torch(spec).state_dict().items()}
    ids = torch.randint(0, 50, (2, 7), generator=gen)
    with torch.no_grad():
        torch.save((ids, specc.build_torch(spec, weights=weights)(ids)), tmp_path / "want.pt")
    write_model_py(spec, tmp_path / "model.py", weights=weights)
    code = (
        "import model, torch; m = model.build(); ids, want = torch.load('want.pt')\n"
        "with torch.no_grad(): torch.testing.assert_close(m(ids), want, atol=1e-5, rtol=1e-5)\n"
        "print(m.generate(ids, 3).shape)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch.Size([2, 10])"
