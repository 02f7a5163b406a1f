"""DeepSeek MoE routing (sigmoid or softmax scores, the selection-only score bias, group-limited top-k, the routed
scale, shared experts) against transformers' DeepseekV3MoE / DeepseekV2Moe blocks, in torch and through ONNX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import specc
from specc.errors import SpecError
from specc.spec.loader import load_spec

transformers = pytest.importorskip("transformers")

D, E, H = 32, 8, 16


def _spec(router: dict, shared: int | None = 16) -> dict:
    mlp = {"type": "moe", "experts": E, "active": 3, "hidden": H, "router": router}
    if shared:
        mlp["shared"] = {"hidden": shared}
    return {
        "name": "moe", "kind": "decoder", "vocab_size": 64, "context": 32, "d_model": D, "blocks": 1,
        "attention": {"heads": 4}, "norm": {"type": "rmsnorm"}, "position": "rotary", "mlp": mlp,
        "bias": False, "tie_embeddings": False,
    }  # fmt: skip


V3 = {"score": "sigmoid", "score_bias": True, "groups": 4, "top_groups": 2, "group_score": "top2_sum", "scale": 2.5}
V2 = {"groups": 4, "top_groups": 2, "group_score": "max", "scale": 1.5, "normalize": False}


def _hf_block(version: int) -> torch.nn.Module:
    kw = dict(
        hidden_size=D, moe_intermediate_size=H, n_routed_experts=E, num_experts_per_tok=3, n_group=4, topk_group=2,
        n_shared_experts=1, num_hidden_layers=1, num_attention_heads=4, vocab_size=64,
    )  # fmt: skip
    torch.manual_seed(0)
    if version == 3:
        cfg = transformers.DeepseekV3Config(**kw, routed_scaling_factor=2.5, norm_topk_prob=True)
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as Block
    else:
        cfg = transformers.DeepseekV2Config(**kw, routed_scaling_factor=1.5, topk_method="group_limited_greedy")
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe as Block
    block = Block(cfg).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
        if version == 3:  # a bias big enough to change which experts are picked
            block.gate.e_score_correction_bias.normal_(0, 0.5)
    return block


def _load(mlp: torch.nn.Module, block: torch.nn.Module, version: int) -> None:
    experts = block.experts
    with torch.no_grad():
        mlp.router.weight.copy_(block.gate.weight)
        gate, up = experts.gate_up_proj.chunk(2, dim=1)
        mlp.experts.w_gate.copy_(gate)
        mlp.experts.w_up.copy_(up)
        mlp.experts.w_down.copy_(experts.down_proj)
        if version == 3:
            mlp.experts.score_bias.copy_(block.gate.e_score_correction_bias)
        for x in ("gate", "up", "down"):
            getattr(mlp.shared, x).weight.copy_(getattr(block.shared_experts, f"{x}_proj").weight)


@pytest.mark.parametrize("version", [3, 2])
def test_routing_matches_hf_deepseek_moe(version: int) -> None:
    block = _hf_block(version)
    model = specc.build_torch(_spec(V3 if version == 3 else V2), accelerate=False)
    mlp = model.blocks[0].mlp if hasattr(model.blocks[0], "mlp") else None
    assert mlp is not None
    _load(mlp, block, version)
    x = torch.randn(2, 9, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = block(x)
        router = mlp.router(x)
        got = mlp.experts(x, router) + mlp.shared.down(torch.nn.functional.silu(mlp.shared.gate(x)) * mlp.shared.up(x))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if version == 3:  # the selection bias matters: without it other experts are chosen for some token
        plain = mlp.experts.select(router)[1]
        with torch.no_grad():
            mlp.experts.score_bias.zero_()
        assert not torch.equal(plain.sort(-1).values, mlp.experts.select(router)[1].sort(-1).values)


def test_deepseek_routing_onnx_matches_torch(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = specc.build_torch(_spec(V3), accelerate=False)
    with torch.no_grad():
        model.blocks[0].mlp.experts.score_bias.normal_(0, 0.5)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids)
    for form in ("sparse", "dense"):
        path = specc.export_onnx(_spec(V3), tmp_path / f"{form}.onnx", weights=weights, moe=form)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones_like(ids.numpy())}
        feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
        got = torch.from_numpy(sess.run(["logits"], feeds)[0])
        torch.testing.assert_close(got, want, atol=1e-4 * float(want.abs().max()), rtol=0)


def test_score_bias_is_counted_as_the_buffer_it_is() -> None:
    r = specc.analyze(_spec(V3)).to_dict()["params"]
    assert r["buffers"] == E and r["total"] == r["stored"] - E


_YAML = """\
name: moe
kind: decoder
vocab_size: 64
context: 32
d_model: 32
blocks: 1
attention: {heads: 4}
mlp:
  type: moe
  experts: 8
  active: 3
  router:
    ROUTER
"""


@pytest.mark.parametrize(
    ("router", "line", "message"),
    [
        ("groups: 3", 13, "experts 8 are not divisible into 3 groups"),
        ("groups: 4\n    top_groups: 5", 14, "top_groups 5 > groups 4"),
        ("groups: 4\n    top_groups: 1", 14, "1 groups of 2 experts hold fewer than active 3"),
        ("groups: 8\n    top_groups: 4\n    group_score: top2_sum", 15, "group_score top2_sum needs 2 experts"),
    ],
)
def test_routing_rules_are_located(tmp_path: Path, router: str, line: int, message: str) -> None:
    path = tmp_path / "moe.yaml"
    path.write_text(_YAML.replace("ROUTER", router))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    (d,) = e.value.diagnostics
    assert (d.line, d.col) == (line, 5) and d.message.startswith(message)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_mla_and_deepseek_routing_trace_and_export() -> None:
    """jit.trace and torch.export take a latent-attention model with group-limited routing (static shapes)."""
    spec = _spec(V3)
    spec["attention"] = {
        "heads": 4,
        "latent": {"kv_rank": 16, "q_rank": 24, "rope_head_dim": 8, "nope_head_dim": 12, "v_head_dim": 10},
    }
    model = specc.build_torch(spec, accelerate=False)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids)
        traced = torch.jit.trace(model, (ids,), check_trace=False)
    torch.testing.assert_close(traced(ids), want)
    torch.testing.assert_close(torch.export.export(model, (ids,)).module()(ids), want)


@pytest.mark.parametrize(
    ("options", "words"),
    [({"attention": "contrib"}, "standard Attention op only"), ({"kv_cache": True, "genai": True}, "latent")],
)
def test_onnx_options_mla_cannot_take_are_refused(tmp_path: Path, options: dict, words: str) -> None:
    spec = _spec(V3)
    spec["attention"] = {"heads": 4, "latent": {"kv_rank": 16, "rope_head_dim": 8, "nope_head_dim": 8}}
    with pytest.raises(SpecError, match=words):
        specc.export_onnx(spec, tmp_path / "m.onnx", **options)
    assert not list(tmp_path.iterdir())  # refused before anything is written
