"""Impossible combinations of the block features are located errors; the graph has the nodes and parameter
names the features promise; a cached decode step with them costs what FlopCounterMode counts."""

from __future__ import annotations

from pathlib import Path

import pytest

import specc
from specc.analysis import analyze
from specc.errors import SpecError

SMALL = ["blocks=2", "d_model=32", "attention.heads=4", "vocab_size=50", "context=64"]


@pytest.mark.parametrize(
    "preset,sets,key,message",
    [
        ("gpt2", ["attention.qk_norm=head"], "qk_norm", "qk_norm is an RMSNorm of q and k"),
        ("gpt2", ["norm.unit_offset=true"], "unit_offset", "unit_offset"),
        ("gpt2", ["parallel=shared_norm", "norm.placement=post"], "parallel", "needs norm.placement pre"),
        ("bert-base", ["parallel=separate_norms"], "parallel", "needs norm.placement pre"),
        ("transformer-base", ["parallel=shared_norm", "norm.placement=pre"], "parallel", "encoder_decoder"),
        ("transformer-base", ["attention.softcap=30.0"], "softcap", "cross-attention would stay uncapped"),
        ("gpt2", ["output.softcap=0"], "softcap", "must be > 0"),
        ("gpt2", ["output.scale=-1.0"], "scale", "must be > 0"),
        ("gpt2", ["attention.softcap=-2.0"], "softcap", "must be > 0"),
        ("gpt2", ["norm.placement=middle"], "placement", "sandwich"),
    ],
)
def test_impossible_combinations_are_located_errors(preset: str, sets: list[str], key: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        specc.load_spec(preset, sets)
    text = str(e.value)
    assert message in text and key in text.split("error:")[0], text  # blamed on the key


def test_errors_point_at_the_file_position(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("extends: gpt2\nname: m\nattention:\n  heads: 12\n  qk_norm: head\n")
    with pytest.raises(SpecError) as e:
        specc.load_spec(str(f))
    assert f"{f}:5:3: error: qk_norm is an RMSNorm" in str(e.value)


def _names(sets: list[str]) -> set[str]:
    g = specc.lower(specc.load_spec("llama2-7b", [*SMALL, "attention.kv_heads=2", "mlp.hidden=48", *sets]))
    return {op.name for op in g.ops()} | set(g.params())


def test_graph_nodes_and_parameter_names() -> None:
    sandwich = _names(["norm.placement=sandwich", "attention.qk_norm=head", "norm.unit_offset=true"])
    assert {"blocks.1.norm1_post.weight", "blocks.1.norm2_post.weight", "blocks.1.norm1.weight"} <= sandwich
    assert {"blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight"} <= sandwich
    output = _names(["norm.placement=output"])
    assert "blocks.0.norm1_post.weight" in output and "blocks.0.norm1.weight" not in output
    assert "norm_f.weight" in output  # a final norm by default, as for pre
    shared = _names(["mlp={type: moe, experts: 4, active: 2, hidden: 16, shared: {hidden: 40, gate: sigmoid}}"])
    assert {f"blocks.0.mlp.shared.{p}.weight" for p in ("gate", "up", "down")} | {
        "blocks.0.mlp.shared_gate.weight",
        "blocks.0.mlp.experts.w_gate",
    } <= shared
    parallel = _names(["parallel=shared_norm"])
    assert "blocks.0.norm1.weight" in parallel and "blocks.0.norm2.weight" not in parallel


def test_qk_norm_widths_and_offset_init() -> None:
    g = specc.lower(specc.load_spec("llama2-7b", [*SMALL, "attention.kv_heads=2", "attention.qk_norm=full"]))
    assert g.params()["blocks.0.attn.q_norm.weight"].shape == (32,)  # heads · head_dim
    assert g.params()["blocks.0.attn.k_norm.weight"].shape == (16,)  # kv_heads · head_dim
    sets = [*SMALL, "attention.kv_heads=2", "attention.qk_norm=head", "norm.unit_offset=true"]
    g = specc.lower(specc.load_spec("llama2-7b", sets))
    assert g.params()["blocks.0.attn.q_norm.weight"].shape == (8,)
    assert {g.params()[n].init for n in ("blocks.0.attn.q_norm.weight", "blocks.0.norm1.weight")} == {"zeros"}


def test_moe_hidden_is_independent_of_the_shared_and_dense_sizes() -> None:
    spec = specc.load_spec(
        "mixtral-8x7b", [*SMALL, "attention.kv_heads=2", "mlp.hidden=16", "mlp.shared={hidden: 56}", "dtype=fp32"]
    )
    r = analyze(specc.lower(spec), crossover=False)
    experts, shared = 8 * 3 * 32 * 16, 3 * 32 * 56
    router = 32 * 8
    assert r.params.total - r.params.active == 2 * (experts - 2 * 3 * 32 * 16)  # 6 of 8 experts idle per layer
    assert r.params.active > 2 * (shared + router)  # the shared expert is always active


@pytest.mark.parametrize(
    "sets",
    [
        ["norm.placement=sandwich", "attention.softcap=2.0", "output.softcap=3.0", "attention.qk_norm=head"],
        ["parallel=separate_norms", "mlp={type: moe, experts: 4, active: 2, hidden: 16, shared: {hidden: 24}}"],
    ],
)
def test_decode_step_flops_equal_flop_counter(sets: list[str]) -> None:
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    spec = specc.load_spec("llama2-7b", [*SMALL, "attention.kv_heads=2", "mlp.hidden=48", "dtype=fp32", *sets])
    model, g = specc.build_torch(spec), specc.lower(spec)
    n, b = 9, 2
    want = analyze(g, batch=b, seq=n, kv_len=n + 1, crossover=False).to_dict()["flops"]["decode_step"]["matmul"]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        cache = model.start({}, max_len=32)
        model.step(cache, torch.randint(0, 50, (b, n)))
        with FlopCounterMode(display=False) as counter:
            model.step(cache, torch.randint(0, 50, (b, 1)))
    assert counter.get_total_flops() == want


ECOSYSTEM = {
    "sandwich_caps_qk_offset": ["norm.placement=sandwich", "norm.unit_offset=true", "attention.qk_norm=head",
                                "attention.softcap=2.0", "output={softcap: 3.0, scale: 0.5}",
                                "embedding_scale=sqrt_d_model"],
    "parallel_moe_shared": ["parallel=shared_norm", "attention.qk_norm=full",
                            "mlp={type: moe, experts: 4, active: 2, hidden: 16, shared: {hidden: 24, gate: sigmoid}}"],
}  # fmt: skip


@pytest.mark.parametrize("case", list(ECOSYSTEM))
def test_compile_export_and_trace(case: str) -> None:
    torch = pytest.importorskip("torch")
    spec = specc.load_spec(
        "llama2-7b", [*SMALL, "attention.kv_heads=2", "mlp.hidden=48", "dtype=fp32", *ECOSYSTEM[case]]
    )
    model = specc.build_torch(spec)
    ids = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        want = model(ids)
        torch.testing.assert_close(torch.compile(model, fullgraph=True, backend="eager")(ids), want)
        torch.testing.assert_close(torch.export.export(model, (ids,)).module()(ids), want)
        torch.testing.assert_close(torch.jit.trace(model, (ids,), check_trace=False)(ids), want)


def test_soft_capped_scores_are_materialised_in_the_memory_model() -> None:
    def scores(sets: list[str]) -> tuple[int, int]:
        g = specc.lower(specc.load_spec("llama2-7b", [*SMALL, "attention.kv_heads=2", *sets]))
        mem = analyze(g, batch=1, seq=16, crossover=False).to_dict()["memory"]
        return mem["attention_scores_materialized"], mem["attention_scores_fused"]

    plain, capped = scores([]), scores(["attention.softcap=20.0"])
    assert plain[1] < plain[0] and capped[1] == capped[0] == plain[0]


def test_tensor_parallel_roles_look_through_qk_norm_and_shared_experts() -> None:
    from specc.analysis.layouts.shard import tp_roles

    sets = [
        "attention.qk_norm=head",
        "mlp={type: moe, experts: 4, active: 2, hidden: 16, shared: {hidden: 24, gate: sigmoid}}",
    ]
    g = specc.lower(specc.load_spec("llama2-7b", [*SMALL, "attention.kv_heads=2", *sets]))
    every = tp_roles(g)
    roles = {n: every[f"blocks.0.{n}"] for n in ("attn.qkv", "attn.out", "mlp.shared.up", "mlp.shared.down")}
    assert roles == {"attn.qkv": "column", "attn.out": "row", "mlp.shared.up": "column", "mlp.shared.down": "row"}
    assert every["blocks.0.mlp.shared_gate"] == "replicated"


def test_attention_impl_names_the_path_soft_capped_layers_take() -> None:
    """A soft-capped layer has no SDPA path (it always runs the explicit softmax): the model says so."""
    sets = [*SMALL, "attention.kv_heads=2", "mlp.hidden=48"]
    plain = specc.build_torch(specc.load_spec("llama2-7b", sets))
    capped = specc.build_torch(specc.load_spec("llama2-7b", [*sets, "attention.softcap=20.0"]))
    assert plain.attention_impl == "sdpa" and capped.attention_impl == "math"
    plain.attention_impl = "math"
    assert plain.attention_impl == "math"
