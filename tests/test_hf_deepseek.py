"""DeepSeek-V3 and DeepSeek-V2 (multi-head latent attention, DeepSeek MoE routing, shared experts, dense-first
layers) imported from tiny random transformers twins: torch and ONNX logits within 1e-4 of the logit scale,
``params.total`` equal to ``num_parameters()``, greedy KV-cache generation equal to HF's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from test_hf_equivalence import Saved, _hf_greedy, _inputs
from test_hf_families import ATTENTION_OPS, assert_close_to_hf
from test_hf_zoo import Case, save

import specc
from specc.interop import import_hf

ort = pytest.importorskip("onnxruntime")

_BASE = dict(
    hidden_size=64, intermediate_size=96, moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
    vocab_size=96, max_position_embeddings=64, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=12,
    v_head_dim=10, n_routed_experts=8, num_experts_per_tok=3, n_group=2, topk_group=1, first_k_dense_replace=1,
    n_shared_experts=1,
)  # fmt: skip
_YARN = {
    "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
    "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
}  # fmt: skip
CASES = [
    Case("deepseekv3-qlora", "DeepseekV3ForCausalLM", dict(_BASE, q_lora_rank=24, routed_scaling_factor=2.5)),
    Case(
        "deepseekv3-yarn",
        "DeepseekV3ForCausalLM",
        dict(_BASE, q_lora_rank=None, rope_interleave=False, rope_parameters=_YARN, norm_topk_prob=False),
    ),
    Case(
        "deepseekv2-lite",
        "DeepseekV2ForCausalLM",
        dict(
            _BASE, q_lora_rank=None, topk_method="group_limited_greedy", routed_scaling_factor=1.5, n_shared_experts=2
        ),
    ),
]
BY_ID = {c.id: c for c in CASES}


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Saved] = {}

    def get(case_id: str) -> Saved:
        if case_id not in cache:
            case = BY_ID[case_id]
            model, folder = save(case, tmp_path_factory.mktemp(case_id))
            with torch.no_grad():  # a selection bias that changes which experts are chosen
                for name, b in model.named_buffers():
                    if name.endswith("e_score_correction_bias"):
                        b.normal_(0, 0.5)
            model.save_pretrained(folder)
            cache[case_id] = Saved(case, model, folder, import_hf(folder).spec)
        return cache[case_id]

    return get


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_torch_matches_hf(twin, case: Case) -> None:
    s = twin(case.id)
    x = _inputs(s)
    with torch.no_grad():
        got = specc.build_torch(s.spec, weights=s.weights).run(dict(x))
    assert_close_to_hf(s, x, got)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_parameter_count_is_hf(twin, case: Case) -> None:
    s = twin(case.id)
    assert specc.analyze(s.spec).to_dict()["params"]["total"] == s.hf.num_parameters()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_greedy_kv_cache_generation_matches_hf(twin, case: Case, tmp_path: Path) -> None:
    s = twin(case.id)
    ids = torch.randint(3, s.hf.config.vocab_size - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    n = 10
    want, _ = _hf_greedy(s, ids, n)
    assert len(set(want[0].tolist())) >= 2, "HF's continuation repeats one token: the check would be weak"
    model = specc.build_torch(s.spec, weights=s.weights)
    assert model.generate(ids, n, use_cache=True)[:, -n:].tolist() == want.tolist()


def _session(path: Path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_onnx_matches_hf_with_one_attention_node_per_layer(twin, case: Case, tmp_path: Path) -> None:
    import onnx

    s = twin(case.id)
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights)
    nodes = [n for n in onnx.load(str(path)).graph.node if n.op_type in ATTENTION_OPS]
    assert len(nodes) == s.spec.blocks
    sess = _session(path)
    x = _inputs(s)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {k: x[k].numpy() for k in x}), strict=True))
    assert_close_to_hf(s, x, got)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_onnx_kv_cache_caches_the_latent_and_generates_as_hf(twin, case: Case, tmp_path: Path) -> None:
    from specc.runtime.generate import greedy
    from specc.runtime.onnx_model import OrtModel

    s = twin(case.id)
    path = specc.export_onnx(s.spec, tmp_path / "model.onnx", weights=s.weights, kv_cache=True)
    past = {i.name: i.shape for i in _session(path).get_inputs() if i.name.startswith("past_key_values.")}
    lat = s.spec.attention.latent
    assert past["past_key_values.0.key"][1:] == [1, "past_sequence", lat.kv_rank]  # the latent, not per-head K/V
    assert past["past_key_values.0.value"][1:] == [1, "past_sequence", lat.rope_head_dim]
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    assert "latent [batch, 1, past_sequence, kv_rank]" in meta["specc.kv_layout"]
    ids = torch.randint(3, s.hf.config.vocab_size - 1, (1, 6), generator=torch.Generator().manual_seed(2))
    want, _ = _hf_greedy(s, ids, 10)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    assert greedy(OrtModel.open(path, provider="cpu", threads=2), feeds, 10).tolist() == want.tolist()


def test_the_example_spec_runs_alike_in_torch_and_the_absorbed_onnx_graph(tmp_path: Path) -> None:
    """examples/mla/mla-moe.yaml (written from scratch): its KV cache is the latent + rotary key, and the ONNX
    KV-cache graph (weight-absorbed form) computes the torch model's logits."""
    example = Path(__file__).resolve().parents[1] / "examples" / "mla" / "mla-moe.yaml"
    r = specc.analyze(specc.load_spec(example), seq=100, crossover=False)
    assert r.memory["kv_cache"] == 6 * 100 * (128 + 16) * 4
    quick = ["vocab_size=512", "d_model=96", "blocks=2", "layer_pattern=[dense, moe]", "mlp.hidden=32"]
    spec = specc.load_spec(example, [*quick, "mlp.shared.hidden=32", "layer_kinds.dense.mlp.hidden=128"])
    model = specc.build_torch(spec)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).numpy()
    path = specc.export_onnx(spec, tmp_path / "m.onnx", weights=weights, kv_cache=True)
    sess = _session(path)
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            feeds[i.name] = np.zeros((1, 1, 0, i.shape[3]), np.float32)
    got = sess.run(["logits"], {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})[0]
    np.testing.assert_allclose(got, want, atol=1e-4 * max(1.0, float(np.abs(want).max())), rtol=0)


def test_left_padded_batch_generation_matches_hf(twin) -> None:
    """A left-padded batch decodes (weight-absorbed steps under the padding mask) as HF's generate does."""
    s = twin("deepseekv3-qlora")
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 11, 12, 13]])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    s.hf.generation_config.update(eos_token_id=None, pad_token_id=0, do_sample=False)
    with torch.no_grad():
        want = s.hf.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6)[:, -6:]
    got = specc.build_torch(s.spec, weights=s.weights).generate(ids, 6, attention_mask=mask)[:, -6:]
    assert got.tolist() == want.tolist() and want[0].tolist() != want[1].tolist()
