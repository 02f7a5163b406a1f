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

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import specc  # noqa: E402
from specc.analysis import analyze  # noqa: E402
from specc.spec.schema import SPEC_ADAPTER  # noqa: E402

V, D, L = 64, 32, 2
STD = 0.2
BASE = dict(hidden_size=D, intermediate_size=48, num_hidden_layers=L, vocab_size=V, max_position_embeddings=64)
ROTARY = {"type": "rotary", "theta": 10000.0}


def _spec(**fields: Any) -> Any:
    doc = {"name": "t", "kind": "decoder", "vocab_size": V, "context": 64, "d_model": D, "blocks": L, **fields}
    return SPEC_ADAPTER.validate_python(doc)


def _hf(arch: str, **config: Any) -> Any:
    cfg = getattr(transformers, f"{arch}Config")(**config)
    model = getattr(transformers, f"{arch}ForCausalLM")._from_config(cfg, attn_implementation="eager")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * STD)
    return model.eval()


def _llama_like(sd: dict[str, Any], norms: dict[str, str], tied: bool = False) -> dict[str, Any]:
    """HF LLaMA-style names → specc names (q/k/v packed into qkv)."""
    out = {"embed.weight": sd["model.embed_tokens.weight"], "norm_f.weight": sd["model.norm.weight"]}
    if not tied:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(L):
        p, q = f"model.layers.{i}.", f"blocks.{i}."
        a = p + "self_attn."
        for kind in ("weight", "bias"):
            if f"{a}q_proj.{kind}" in sd:
                out[f"{q}attn.qkv.{kind}"] = torch.cat([sd[f"{a}{n}_proj.{kind}"] for n in "qkv"])
        out[q + "attn.out.weight"] = sd[a + "o_proj.weight"]
        for n in ("q_norm", "k_norm"):
            if f"{a}{n}.weight" in sd:
                out[f"{q}attn.{n}.weight"] = sd[f"{a}{n}.weight"]
        for hf, ours in norms.items():
            out[f"{q}{ours}.weight"] = sd[f"{p}{hf}.weight"]
        for hf, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            if f"{p}mlp.{hf}.weight" in sd:
                out[f"{q}mlp.{ours}.weight"] = sd[f"{p}mlp.{hf}.weight"]
    return out


def _neox(sd: dict[str, Any]) -> dict[str, Any]:
    """GPT-NeoX packs q/k/v per head ([H, 3, D_H] rows); specc packs [q heads | k heads | v heads]."""
    out = {"embed.weight": sd["gpt_neox.embed_in.weight"], "lm_head.weight": sd["lm_head.weight"]}
    for k in ("weight", "bias"):
        out[f"norm_f.{k}"] = sd[f"gpt_neox.final_layer_norm.{k}"]
    for i in range(L):
        p, q = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        for k in ("weight", "bias"):
            w = sd[f"{p}attention.query_key_value.{k}"]
            out[f"{q}attn.qkv.{k}"] = w.reshape(4, 3, -1, *w.shape[1:]).transpose(0, 1).reshape(w.shape)
            out[f"{q}attn.out.{k}"] = sd[f"{p}attention.dense.{k}"]
            out[f"{q}norm1.{k}"] = sd[f"{p}input_layernorm.{k}"]
            out[f"{q}norm2.{k}"] = sd[f"{p}post_attention_layernorm.{k}"]
            out[f"{q}mlp.fc1.{k}"] = sd[f"{p}mlp.dense_h_to_4h.{k}"]
            out[f"{q}mlp.fc2.{k}"] = sd[f"{p}mlp.dense_4h_to_h.{k}"]
    return out


def _phi(sd: dict[str, Any]) -> dict[str, Any]:
    out = {"embed.weight": sd["model.embed_tokens.weight"]}
    for k in ("weight", "bias"):
        out[f"norm_f.{k}"] = sd[f"model.final_layernorm.{k}"]
        out[f"lm_head.{k}"] = sd[f"lm_head.{k}"]
        for i in range(L):
            p, q = f"model.layers.{i}.", f"blocks.{i}."
            out[f"{q}attn.qkv.{k}"] = torch.cat([sd[f"{p}self_attn.{n}_proj.{k}"] for n in "qkv"])
            out[f"{q}attn.out.{k}"] = sd[f"{p}self_attn.dense.{k}"]
            out[f"{q}norm1.{k}"] = sd[f"{p}input_layernorm.{k}"]
            out[f"{q}mlp.fc1.{k}"] = sd[f"{p}mlp.fc1.{k}"]
            out[f"{q}mlp.fc2.{k}"] = sd[f"{p}mlp.fc2.{k}"]
    return out


def _qwen2_moe(sd: dict[str, Any]) -> dict[str, Any]:
    out = _llama_like(sd, {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"})
    for i in range(L):
        p, q = f"model.layers.{i}.mlp.", f"blocks.{i}.mlp."
        gate, up = sd[p + "experts.gate_up_proj"].chunk(2, dim=1)  # [E, 2·I, D]: gate rows, then up rows
        out.update({q + "router.weight": sd[p + "gate.weight"], q + "experts.w_gate": gate, q + "experts.w_up": up})
        out[q + "experts.w_down"] = sd[p + "experts.down_proj"]
        for hf, ours in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            out[f"{q}shared.{ours}.weight"] = sd[f"{p}shared_expert.{hf}.weight"]
        out[q + "shared_gate.weight"] = sd[p + "shared_expert_gate.weight"]
    return out


GEMMA_SPEC = dict(
    attention={"heads": 4, "kv_heads": 2, "head_dim": 16},
    norm={"type": "rmsnorm", "eps": 1e-6, "unit_offset": True},
    mlp={"type": "swiglu", "hidden": 48, "activation": "gelu_tanh"},
    position=ROTARY,
    bias=False,
    embedding_scale="sqrt_d_model",
)
GEMMA2 = dict(head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=1.5, final_logit_softcapping=2.0)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], Any]] = {
    "gemma_offset_norm_geglu_embed_scale": (
        "Gemma",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2, head_dim=16),
        GEMMA_SPEC,
        lambda sd: _llama_like(sd, {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}, tied=True),
    ),
    "gemma2_sandwich_softcaps_scale": (
        "Gemma2",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2, sliding_window=64, **GEMMA2),
        dict(
            GEMMA_SPEC,
            attention={"heads": 4, "kv_heads": 2, "head_dim": 16, "scale": 24**-0.5, "softcap": 1.5},
            norm={"type": "rmsnorm", "eps": 1e-6, "unit_offset": True, "placement": "sandwich"},
            output={"softcap": 2.0},
        ),
        lambda sd: _llama_like(
            sd,
            {
                "input_layernorm": "norm1",
                "post_attention_layernorm": "norm1_post",
                "pre_feedforward_layernorm": "norm2",
                "post_feedforward_layernorm": "norm2_post",
            },
            tied=True,
        ),
    ),
    "qwen3_head_qk_norm": (
        "Qwen3",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2, head_dim=8),
        dict(
            attention={"heads": 4, "kv_heads": 2, "qk_norm": "head"},
            norm={"type": "rmsnorm", "eps": 1e-6},
            mlp={"type": "swiglu", "hidden": 48},
            position=ROTARY,
            bias=False,
            tie_embeddings=False,
        ),
        lambda sd: _llama_like(sd, {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}),
    ),
    "olmo2_output_norms_full_qk_norm": (
        "Olmo2",
        dict(BASE, num_attention_heads=4, num_key_value_heads=2),
        dict(
            attention={"heads": 4, "kv_heads": 2, "qk_norm": "full"},
            norm={"type": "rmsnorm", "eps": 1e-5, "placement": "output"},
            mlp={"type": "swiglu", "hidden": 48},
            position=ROTARY,
            bias=False,
            tie_embeddings=False,
        ),
        lambda sd: _llama_like(
            sd, {"post_attention_layernorm": "norm1_post", "post_feedforward_layernorm": "norm2_post"}
        ),
    ),
    "neox_parallel_separate_norms": (
        "GPTNeoX",
        dict(
            BASE,
            num_attention_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        ),
        dict(
            attention={"heads": 4},
            mlp={"type": "classic", "hidden": 48, "activation": "gelu"},
            position={**ROTARY, "fraction": 0.5},
            parallel="separate_norms",
            tie_embeddings=False,
        ),
        _neox,
    ),
    "phi_parallel_shared_norm_head_bias": (
        "Phi",
        dict(BASE, num_attention_heads=4),
        dict(
            attention={"heads": 4},
            mlp={"type": "classic", "hidden": 48, "activation": "gelu_tanh"},
            position={**ROTARY, "fraction": 0.5},
            parallel="shared_norm",
            bias={"qkv": True, "out": True, "mlp": True, "norm": True, "head": True},
            tie_embeddings=False,
        ),
        _phi,
    ),
    "qwen2_moe_sigmoid_shared_expert": (
        "Qwen2Moe",
        dict(
            BASE,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
        ),
        dict(
            attention={"heads": 4, "kv_heads": 2},
            norm={"type": "rmsnorm", "eps": 1e-6},
            mlp={
                "type": "moe",
                "experts": 4,
                "active": 2,
                "hidden": 24,
                "router": {"normalize": False},
                "shared": {"hidden": 40, "gate": "sigmoid"},
            },
            position=ROTARY,
            bias={"qkv": True, "out": False, "mlp": False, "norm": False, "head": False},
            tie_embeddings=False,
        ),
        _qwen2_moe,
    ),
}


def _pair(case: str) -> tuple[Any, Any, Any]:
    arch, config, fields, mapping = CASES[case]
    hf = _hf(arch, **config)
    spec = _spec(**fields)
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


def test_greedy_generation_equals_hf_with_softcaps() -> None:
    hf, ours, _ = _pair("gemma2_sandwich_softcaps_scale")
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
    spec = _spec(**FEATURES[name])
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
        d = analyze(specc.lower(_spec(**fields)), batch=1, seq=8, crossover=False).to_dict()["flops"]["forward"]
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
