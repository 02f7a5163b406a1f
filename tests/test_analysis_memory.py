"""Memory items: Korthikanti activations, the seed's TB-scale score matrix, KV cache, training states."""

from __future__ import annotations

import specc
from specc.analysis import analyze
from specc.analysis.costs import Ctx
from specc.analysis.op_costs import evaluate


def test_graph_activations_equal_korthikanti_per_layer() -> None:
    """With dropout, 16-bit and a 4h MLP, the per-op accounting reproduces s·b·h·(34 + 5·a·s/h) per layer."""
    spec = specc.load_spec("gpt2", ["dropout=0.1", "dtype=fp16", "blocks=3"])
    g = specc.lower(spec)
    b, s, h, a = 2, 256, 768, 12
    costs = evaluate(g, {"B": b, "N": s}, Ctx(bytes=2))
    for layer in range(3):
        saved = sum(c.mem.saved for c in costs if c.op.layer == layer)
        assert saved == s * b * h * 34 + 5 * a * s * s * b
    r = analyze(g, batch=b, seq=s)
    assert r.memory["activations_korthikanti"] == 3 * (s * b * h * 34 + 5 * a * s * s * b)


def test_seed_attention_matrix_is_terabytes() -> None:
    """Seed §4.4: N = 100000, H = 64 → the materialised attention matrix of one layer is TB-scale."""
    spec = specc.load_spec("gpt2", ["attention.heads=64", "blocks=1", "dtype=fp16", "context=100000"])
    m = analyze(spec, seq=100_000, crossover=False).memory
    assert m["attention_scores_materialized"] == 64 * 100_000**2 * 2  # 1.28 TB in fp16
    assert m["attention_scores_materialized"] > 10**12
    assert m["attention_scores_fused"] == 64 * 100_000 * 4  # fused: fp32 log-sum-exp per row, 25.6 MB


def test_kv_cache_formula() -> None:
    n, b = 4096, 3
    llama = analyze("llama2-7b", batch=b, seq=n, crossover=False).memory["kv_cache"]
    assert llama == 2 * 32 * 32 * 128 * n * b * 2
    mixtral = analyze("mixtral-8x7b", batch=b, seq=n, crossover=False).memory["kv_cache"]
    assert mixtral == 2 * 32 * 8 * 128 * n * b * 2  # GQA: 8 KV heads
    window = specc.load_spec("llama2-7b", ["attention.mask=sliding_window", "attention.window=1024"])
    assert analyze(window, batch=b, seq=n, crossover=False).memory["kv_cache"] == llama // 4
    assert analyze("bert-base", crossover=False).memory["kv_cache"] == 0  # encoders do not generate


def test_encoder_decoder_cache_holds_self_and_cross_keys() -> None:
    n, n_dec, d, layers = 100, 30, 512, 6
    kv = analyze("transformer-base", seq=n, dec_seq=n_dec, dtype="fp32", crossover=False).memory["kv_cache"]
    assert kv == layers * 2 * d * (n_dec + n) * 4


def test_training_states_are_16_bytes_per_param() -> None:
    for dtype in ("fp16", "fp32"):
        r = analyze("gpt2", dtype=dtype, training=True, crossover=False)
        m, p = r.memory, r.params.total
        assert m["weights"] + m["gradients"] + m["optimizer_states"] == 16 * p
        assert m["training_total"] == 16 * p + m["activations_training"]
    assert "gradients" not in analyze("gpt2", crossover=False).memory


def test_fused_attention_drops_quadratic_terms() -> None:
    small, big = (analyze("gpt2", seq=n, crossover=False).memory for n in (512, 1024))
    assert big["activations_fused"] == 2 * small["activations_fused"]  # linear in N
    assert big["activations"] > 2 * small["activations"]  # N² softmax output
    full = analyze("gpt2", seq=1024, training=True, recompute="full", crossover=False).memory
    assert full["activations_training"] < big["activations_fused"] < big["activations"]


def test_sinks_and_alibi_costs() -> None:
    """Sinks: one parameter per head and layer, scores materialised (the explicit softmax), one more softmax column
    per row; ALiBi: no parameters, its [1, H, N, N] bias held beside the fused kernel, one add per score."""
    base = {"name": "t", "kind": "decoder", "vocab_size": 96, "context": 64, "d_model": 64, "blocks": 2}
    plain = specc.analyze({**base, "attention": {"heads": 4}}, seq=32, crossover=False).to_dict()
    sinks = specc.analyze({**base, "attention": {"heads": 4, "sinks": True}}, seq=32, crossover=False).to_dict()
    alibi = specc.analyze({**base, "attention": {"heads": 4}, "position": "alibi"}, seq=32, crossover=False).to_dict()
    learned = 64 * 64  # alibi drops the learned position table
    assert sinks["params"]["total"] - plain["params"]["total"] == 2 * 4
    assert alibi["params"]["total"] == plain["params"]["total"] - learned
    scores = 4 * 32 * 32 * 4  # B·H·N·N fp32 bytes of one layer
    assert sinks["memory"]["attention_scores_fused"] == scores
    assert alibi["memory"]["attention_scores_fused"] == plain["memory"]["attention_scores_fused"] + scores
    softmax = lambda r: r["flops"]["forward"]["nonmatmul_by_category"]["softmax"]
    assert softmax(sinks) - softmax(plain) == 2 * 5 * 4 * 32  # layers · SOFTMAX · heads · rows
    assert softmax(alibi) - softmax(plain) == 2 * 4 * 32 * 32  # layers · one add per score
    assert sinks["flops"]["forward"]["matmul"] == plain["flops"]["forward"]["matmul"]


def test_full_recompute_keeps_block_inputs_and_the_encoder_output_once() -> None:
    """Full recompute keeps what lives outside the blocks, each block's residual input and, once, a tensor several
    blocks read: the encoder output each decoder layer's cross-attention K/V takes (a checkpoint input of each)."""
    b, n, n_dec, d = 4, 32, 24, 64
    for blocks in (2, 4):
        sets = [f"blocks={blocks}", f"d_model={d}", "attention.heads=4", "mlp.hidden=128", "dtype=fp32"]
        g = specc.lower(specc.load_spec("transformer-base", sets))
        costs = evaluate(g, {"B": b, "N": n, "N_dec": n_dec}, Ctx(bytes=4))
        outside = sum(c.mem.saved for c in costs if c.op.layer is None)
        block_inputs = blocks * (b * n + b * n_dec) * d * 4
        full = analyze(g, batch=b, seq=n, dec_seq=n_dec, training=True, recompute="full", crossover=False).memory
        assert full["activations_training"] == outside + block_inputs + b * n * d * 4, blocks
    gpt2 = specc.lower(specc.load_spec("gpt2", ["blocks=2", f"d_model={d}", "attention.heads=4", "dtype=fp32"]))
    costs = evaluate(gpt2, {"B": b, "N": n}, Ctx(bytes=4))
    outside = sum(c.mem.saved for c in costs if c.op.layer is None)
    full = analyze(gpt2, batch=b, seq=n, training=True, recompute="full", crossover=False).memory
    assert full["activations_training"] == outside + 2 * b * n * d * 4  # a decoder alone: no tensor read twice
