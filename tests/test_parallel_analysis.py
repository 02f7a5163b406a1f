"""Parallel layouts in the analyzer: per-device weights from the IR's tensors, ZeRO, Korthikanti activations."""

from __future__ import annotations

import math
from dataclasses import replace

import specc
from specc.analysis.layouts import Layout, Training, param_shards, per_device_weight_bytes
from specc.analysis.layouts.device_memory import model_states
from specc.analysis.layouts.profile import profile
from specc.analysis.layouts.run import analyze_layout
from specc.analysis.layouts.shard import weights_per_stage


def _graph(name: str, *sets: str) -> specc.LayerGraph:
    return specc.lower(specc.load_spec(name, list(sets) or None))


def test_tp2_halves_weights_up_to_replicated_norms() -> None:
    g = _graph("llama2-7b")
    norms = sum(p.shape[0] for n, p in g.params().items() if "norm" in n)  # 65 RMSNorm weights of 4096
    assert norms == 65 * 4096
    one = per_device_weight_bytes(g, tp=1)
    assert one == g.num_params() * 2  # bf16, the spec's dtype
    assert per_device_weight_bytes(g, tp=2) == (one - norms * 2) // 2 + norms * 2
    assert per_device_weight_bytes(g, tp=2, dtype="fp32") == 2 * per_device_weight_bytes(g, tp=2)


def test_uneven_vocabulary_splits_as_torch_chunk() -> None:
    """GPT-2: 50,257 rows → 25,129 on rank 0 and 25,128 on rank 1; replicated: norms, positions, row biases."""
    g = _graph("gpt2")
    replicated = 12 * 2 * 2 * 768 + 2 * 768 + 1024 * 768 + 12 * 2 * 768
    split = g.num_params() - replicated - 50257 * 768
    rank0 = per_device_weight_bytes(g, tp=2, dtype="fp32", tp_rank=0) // 4
    rank1 = per_device_weight_bytes(g, tp=2, dtype="fp32", tp_rank=1) // 4
    assert rank0 == replicated + split // 2 + 25129 * 768
    assert rank1 == replicated + split // 2 + 25128 * 768
    assert per_device_weight_bytes(g, tp=2, dtype="fp32") == rank0 * 4


def test_shard_dims_follow_the_graph() -> None:
    g = _graph("mixtral-8x7b", "blocks=1")
    dims = {p.name: (p.tp_dim, p.ep_dim) for p in param_shards(g)}
    assert dims["blocks.0.attn.qkv.weight"] == (0, None)  # column: heads
    assert dims["blocks.0.attn.out.weight"] == (1, None)  # row
    assert dims["blocks.0.mlp.router.weight"] == (None, None)  # replicated
    assert dims["blocks.0.mlp.experts.w_gate"] == (1, 0)  # experts over ep, hidden units over tp
    assert dims["blocks.0.mlp.experts.w_down"] == (2, 0)
    assert dims["embed.weight"] == (0, None) and dims["lm_head.weight"] == (0, None)  # vocabulary-parallel
    assert dims["blocks.0.norm1.weight"] == (None, None)


def test_pipeline_stage_keeps_a_tied_copy() -> None:
    """pp=2 with a tied head: the last stage holds its own copy of the embedding table (Megatron-LM)."""
    g = _graph("gpt2")
    table = 50257 * 768
    first = per_device_weight_bytes(g, pp=2, stage=0, dtype="fp32") // 4
    last = per_device_weight_bytes(g, pp=2, stage=1, dtype="fp32") // 4
    assert first + last == g.num_params() + table
    assert last - table == 6 * (g.num_params() - table - 1024 * 768 - 2 * 768) // 12 + 2 * 768


# ------------------------------------------------------------------------------------------------ ZeRO


def test_zero_model_states_reproduce_the_paper() -> None:
    """Rajbhandari et al. 2020, Fig. 1 / §5: Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam):
    baseline (2 + 2 + K)Ψ = 120 GB; P_os (2 + 2 + K/N_d)Ψ = 31.4 GB; P_os+g (2 + (2 + K)/N_d)Ψ = 16.6 GB;
    P_os+g+p (2 + 2 + K)Ψ/N_d = 1.9 GB per device."""
    psi, nd = 7_500_000_000, 64
    expected = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected.items():
        s = model_states(psi, 0, 2, stage, nd, nd)
        assert round(sum(s.values()) / 1e9, 1) == gb
    s3 = model_states(psi, 0, 2, 3, nd, nd)
    assert s3 == {"weights": 2 * psi // nd, "gradients": 2 * psi // nd, "optimizer_states": 12 * psi // nd}


def test_zero_stages_through_the_analyzer() -> None:
    """With tp=2 and dp=8 the Ψ of the formulas is what one tensor-parallel rank holds."""
    g = _graph("llama2-7b", "blocks=4")
    psi = per_device_weight_bytes(g, tp=2) // 2
    states = {}
    for zero in range(4):
        t = Training(zero=zero, micro_batch=1, global_batch=8)
        m = analyze_layout(g, Layout(tp=2, dp=8), training=t, is_training=True, seq=256).memory
        states[zero] = (m["weights"], m["gradients"], m["optimizer_states"])
    assert states[0] == (2 * psi, 2 * psi, 12 * psi)
    assert states[1] == (2 * psi, 2 * psi, 12 * psi // 8)
    assert states[2] == (2 * psi, 2 * psi // 8, 12 * psi // 8)
    assert states[3] == (2 * psi // 8, 2 * psi // 8, 12 * psi // 8)


# -------------------------------------------------------------------------------------- Korthikanti 2022


def test_korthikanti_activations_per_table() -> None:
    """Korthikanti et al. 2022, Table 2 (bytes per layer, 16-bit, b sequences of s tokens, width h, a heads,
    tp = t): no parallelism sbh(34 + 5as/h); TP sbh(10 + 24/t + 5as/(ht)); TP+SP sbh(34/t + 5as/(ht));
    TP + selective recompute sbh(10 + 24/t); TP+SP + selective sbh·34/t; full recompute 2sbh (2sbh/t with SP).
    Outside the layers (their eq. 5 terms, pp = 1): the embedding-dropout mask sbh, the final LayerNorm and the
    head inputs 2sbh each (÷t with SP), and the fp32 logits of the vocabulary-parallel loss 4sbv/t; beyond the
    paper's floating-point accounting, the sb int64 token ids the embedding's backward keeps, whole on each rank."""
    g = _graph("gpt3-175b", "dropout=0.1", "blocks=4")
    L, s, b, h, a, t, v = 4, 2048, 2, 12288, 96, 8, 50257
    sbh = s * b * h
    rows = {
        (False, "none"): sbh * (10 + 24 // t) + 5 * a * s * s * b // t,
        (True, "none"): sbh * 34 // t + 5 * a * s * s * b // t,
        (False, "selective"): sbh * (10 + 24 // t),
        (True, "selective"): sbh * 34 // t,
        (False, "full"): 2 * sbh,
        (True, "full"): 2 * sbh // t,
    }
    for (sp, recompute), layer in rows.items():
        outside = (sbh + 4 * sbh) // (t if sp else 1) + 4 * s * b * v // t + 8 * s * b
        tr = Training(sequence_parallel=sp, recompute=recompute, micro_batch=b, global_batch=b)
        m = analyze_layout(g, Layout(tp=t), training=tr, is_training=True, seq=s).memory
        assert m["activations"] == L * layer + outside, (sp, recompute)
    one = analyze_layout(g, Layout(), training=Training(micro_batch=b, global_batch=b), is_training=True, seq=s)
    assert one.memory["activations"] == L * sbh * (34 + 5 * a * s // h) + 5 * sbh + 4 * s * b * v + 8 * s * b


def test_first_pipeline_stage_holds_p_microbatches() -> None:
    """Korthikanti eq. 5 (1F1B, no interleaving): the first stage keeps p micro-batches of its L/p layers,
    i.e. L layers' worth, plus p embedding-dropout masks sbh/t (and p micro-batches' int64 token ids, 8sb each)."""
    g = _graph("gpt3-175b", "dropout=0.1", "blocks=8")
    L, s, b, h, t, p = 8, 2048, 1, 12288, 8, 4
    sbh = s * b * h
    tr = Training(sequence_parallel=True, recompute="selective", micro_batch=b, global_batch=16)
    c = analyze_layout(g, Layout(tp=t, pp=p), training=tr, is_training=True, seq=s)
    assert c.stages[0]["activations"] == L * sbh * 34 // t + p * sbh // t + p * 8 * s * b
    assert c.bubble == (p - 1) / (16 + p - 1)


# --------------------------------------------------------------------------------------- communication


def test_tensor_parallel_collectives() -> None:
    """Per layer 4 tensors of s·b·h close a tp region (2 forward, 2 backward), plus the embedding (forward)
    and the LM head input (backward): all-reduce 2(t−1)/t each; with SP a reduce-scatter + all-gather each."""
    g = _graph("llama2-7b", "blocks=4")
    L, s, b, h, t, m = 4, 512, 2, 4096, 4, 3
    size = (4 * L + 2) * s * b * h * 2 * m
    plain = analyze_layout(
        g, Layout(tp=t), training=Training(micro_batch=b, global_batch=b * m), is_training=True, seq=s
    )
    assert plain.comm["all_reduce"] == 2 * (t - 1) * size // t
    sp = analyze_layout(
        g,
        Layout(tp=t),
        training=Training(sequence_parallel=True, micro_batch=b, global_batch=b * m),
        is_training=True,
        seq=s,
    )
    assert sp.comm["reduce_scatter"] == sp.comm["all_gather"] == (t - 1) * size // t
    assert sp.comm["all_reduce"] == 0


def test_data_pipeline_and_expert_collectives() -> None:
    g = _graph("mixtral-8x7b", "blocks=2")
    s, b, m, dp, ep = 256, 1, 4, 8, 8
    tr = Training(zero=0, micro_batch=b, global_batch=b * m * dp)
    c = analyze_layout(g, Layout(pp=2, dp=dp, ep=ep), training=tr, is_training=True, seq=s)
    dense, _ = weights_per_stage(g, pp=2, ep=ep)[1]  # the last stage (the head) sends most
    assert c.comm_by_group["dp"]["all_reduce"] == round(2 * (dp - 1) / dp * dense * 2)  # experts: one per rank
    routed = s * b * 2 * 4096 * 2  # tokens × active × width, bf16
    assert c.comm["all_to_all"] == round(4 * (ep - 1) / ep * routed * m)  # each stage holds 1 MoE layer
    assert c.comm["p2p"] == s * b * 4096 * 2 * m  # an end stage sends one way
    z3 = analyze_layout(
        g, Layout(pp=2, dp=dp, ep=ep), training=Training(zero=3, micro_batch=b, global_batch=b * m * dp),
        is_training=True, seq=s,
    )  # fmt: skip
    assert z3.comm_by_group["dp"]["all_gather"] == round(2 * m * (dp - 1) / dp * dense * 2)


def test_inference_kv_cache_per_device() -> None:
    g = _graph("llama2-7b")
    c = analyze_layout(g, Layout(tp=2, dp=2), training=Training(global_batch=8), seq=4096)
    assert c.memory["kv_cache"] == 2 * 32 * 32 * 128 * 4096 * (8 // 2) * 2 // 2
    assert c.memory["activations"] == c.memory["gradients"] == c.memory["optimizer_states"] == 0
    assert c.memory["total"] == c.memory["weights"] + c.memory["kv_cache"]


def test_a_latent_kv_cache_is_whole_on_every_tp_rank() -> None:
    """MLA caches the latent and the rotary key (kv_rank + rope_head_dim per token, every head reads them): tp
    splits the heads after the latent, so each rank holds the whole cache, while its weights shrink."""
    g = _graph("deepseek-v3", "blocks=4", "layer_pattern=[dense, moe, moe, moe]")
    one, two = (analyze_layout(g, Layout(tp=tp), training=Training(global_batch=2), seq=1024) for tp in (1, 2))
    assert one.memory["kv_cache"] == two.memory["kv_cache"] == 4 * 1024 * (512 + 64) * 2 * 2
    assert two.memory["weights"] < 0.6 * one.memory["weights"]


MLA_DENSE = ["layer_pattern=null", "layer_kinds=null", "mlp={type: swiglu, hidden: 18432, activation: silu}"]


def test_latent_attention_is_an_attention_core_for_layouts() -> None:
    """MLA is costed as the attention core it is: a fused kernel keeps Q, K, V and row statistics where math
    keeps the N² scores, both split by heads over tp, whose backward sums the latent's gradient; context
    parallelism rings the per-head K and V that kv_b expands (Megatron-Core's MLA hands those to its core
    attention); full recompute keeps each block's input."""
    s, b, m, h, qk, v, d = 4096, 1, 2, 128, 128 + 64, 128, 7168
    g = _graph("deepseek-v3", "blocks=2", *MLA_DENSE)

    def act(lay: Layout, **kw: object) -> int:
        tr = Training(micro_batch=b, global_batch=b * m, **kw)  # type: ignore[arg-type]
        return analyze_layout(g, lay, training=tr, is_training=True, seq=s).memory["activations"]

    per_block = h * s * s * 2 - h * s * 4  # bf16 scores the fused kernel does not keep, less its fp32 statistics
    for tp in (1, 2):
        gap = act(Layout(tp=tp), attention="math") - act(Layout(tp=tp), attention="flash")
        assert gap == 2 * per_block // tp
    tr = Training(micro_batch=b, global_batch=b * m)
    two = analyze_layout(g, Layout(cp=2), training=tr, is_training=True, seq=s)
    kv = 2 * s * h * (qk + v) * 2 * b  # the expanded K and V of 2 layers, all tokens, bf16
    assert two.comm_by_group["cp"] == {"all_gather": round(m * kv * 2 / 2), "reduce_scatter": round(m * kv / 2)}
    core = next(p for _, p in profile(g, s, None, "bf16", training=True).ops if p.attention)
    assert core.tp_bwd == s * (512 + 64) * 2  # the latent's gradient, summed over the tp ranks that read it
    deeper = _graph("deepseek-v3", "blocks=4", *MLA_DENSE)
    full = [
        analyze_layout(x, Layout(), training=replace(tr, recompute="full"), is_training=True, seq=s)
        for x in (g, deeper)
    ]
    assert full[1].memory["activations"] - full[0].memory["activations"] == 2 * s * d * 2 * b


def test_weights_match_the_torch_distributed_plan() -> None:
    """The bytes per rank the analyzer sums (param_shards, torch.chunk's sizes) are the shapes the plan that
    specc.parallel applies gives each rank (local_params)."""
    from specc.analysis.layouts import tensor_plan as runtime

    for name in ("gpt2", "llama2-7b", "mixtral-8x7b", "transformer-base", "bert-base", "vit-b16"):
        g = _graph(name)
        heads = next(op.attrs for op in g.ops() if op.kind == "attention")
        for tp in (2, 4):
            if heads.heads % tp or heads.kv_heads % tp:
                continue
            for rank in range(tp):
                shapes = runtime.local_params(g, tp, rank)
                elems = sum(math.prod(s) for s in shapes.values())
                assert per_device_weight_bytes(g, tp=tp, tp_rank=rank, dtype="fp32") == 4 * elems, (name, tp, rank)


def test_context_parallel_halves_activations_and_rings_kv() -> None:
    g = _graph("llama2-7b", "blocks=2")
    s, b, m = 1024, 1, 2
    tr = Training(micro_batch=b, global_batch=b * m)
    one = analyze_layout(g, Layout(), training=tr, is_training=True, seq=s)
    two = analyze_layout(g, Layout(cp=2), training=tr, is_training=True, seq=s)
    assert two.memory["activations"] == one.memory["activations"] // 2
    kv = 2 * 2 * s * 32 * 128 * 2 * b  # K and V of 2 layers, all tokens, bf16
    assert two.comm_by_group["cp"] == {"all_gather": round(m * kv * 2 / 2), "reduce_scatter": round(m * kv / 2)}
    assert two.comm_by_group["dp"]["all_reduce"] == round(g.num_params() * 2)  # gradients sync over dp × cp = 2


def test_attention_dropout_acts_in_training_only() -> None:
    """An inference step runs no dropout (its dropout ops launch nothing): on torch's CPU kernels it is priced
    on the fused kernel with or without the spec's attention dropout, where a training step with dropout takes
    the math path (the flash kernel has none). MLA with V of another width than Q/K has no fused CPU kernel in
    inference either."""

    def step(training: bool, *sets: str) -> float:
        g = _graph("gpt2", "blocks=2", *sets)
        t = Training(kernels="torch-cpu", micro_batch=1, global_batch=1)
        cost = analyze_layout(g, Layout(), training=t, is_training=training, seq=1024, device="h100")
        assert cost.step_time is not None
        return cost.step_time

    assert step(False, "dropout=0.1") == step(False)
    assert step(True, "dropout=0.1") > step(True) * 1.01
    narrow_v = "attention.latent={kv_rank: 32, q_rank: 48, rope_head_dim: 8, nope_head_dim: 16, v_head_dim: 8}"
    for sets, unfused in (([], False), (["dropout=0.1"], False), ([narrow_v, *MLA_DENSE], True)):
        g = _graph("deepseek-v3" if unfused else "gpt2", "blocks=2", *sets)
        core = next(p for _, p in profile(g, 256, None, "fp32", training=False).ops if p.attention)
        assert core.cpu_math_inference is unfused
