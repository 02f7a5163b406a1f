"""Cross-checks against the emitted PyTorch model: the analyzer's matmul FLOPs equal FlopCounterMode exactly,
and its parameter count equals the module's, for every family at small sizes.

FlopCounterMode counts linear / conv / bmm at 2·M·K·N and ignores bias and elementwise work, which is the
analyzer's matmul convention. On CPU it does not see the fused SDPA kernels, so attention runs under
``sdpa_kernel(SDPBackend.MATH)``, whose QKᵀ and AV are plain (counted) matmuls. Two more CPU blind spots: an
``nn.LSTM`` runs through oneDNN (``mkldnn_rnn_layer``, not counted), so the LSTM case disables oneDNN.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("specc.backends.torch.build", reason="the torch backend is not there yet")

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import specc  # noqa: E402
from specc.analysis import analyze  # noqa: E402
from specc.ir.graph import LayerGraph, dims  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")

SMALL = ["blocks=2", "d_model=32", "attention.heads=4", "vocab_size=50", "context=64"]
RNN = ["rnn.hidden=16", "rnn.embed=8", "vocab_size=30"]
CASES: dict[str, tuple[str, list[str]]] = {
    "gpt2": ("gpt2", [*SMALL, "mlp.hidden=64"]),
    "llama_gqa_rope_swiglu": ("llama2-7b", [*SMALL, "attention.kv_heads=2", "mlp.hidden=48", "dtype=fp32"]),
    "mixtral_moe": ("mixtral-8x7b", [*SMALL, "attention.kv_heads=2", "mlp.hidden=48", "mlp.experts=4", "dtype=fp32"]),
    "deepseek_v3_mla": ("deepseek-v3", [*SMALL, "attention.latent={kv_rank: 16, q_rank: 24, rope_head_dim: 8, "
                        "nope_head_dim: 12, v_head_dim: 10}", "mlp.hidden=16", "mlp.experts=8", "mlp.active=3",
                        "mlp.router.groups=2", "mlp.router.top_groups=1", "mlp.shared.hidden=16",
                        "layer_kinds.dense.mlp.hidden=48", "layer_pattern=[dense, moe]",
                        "position.scaling.original_max_positions=16", "dtype=fp32"]),
    "bert_mlm": ("bert-base", [*SMALL, "mlp.hidden=64"]),
    "bert_pooled": ("bert-base", [*SMALL, "mlp.hidden=64", "head=pooled"]),
    "transformer_enc_dec": ("transformer-base", [*SMALL, "mlp.hidden=64"]),
    "t5_relative_bias": ("t5-base", [*SMALL, "attention.head_dim=8", "mlp.hidden=64", "position.buckets=8",
                         "position.max_distance=6"]),
    "flan_t5_gated": ("flan-t5-xl", [*SMALL, "attention.head_dim=8", "mlp.hidden=48", "position.per_layer=true"]),
    "whisper_audio": ("whisper-large-v3", [*SMALL, "mlp.hidden=64", "audio.mel_bins=8", "audio.positions=16",
                      "decoder_start_token=1", "dtype=fp32"]),
    "vit": ("vit-b16", ["blocks=2", "d_model=32", "attention.heads=4", "mlp.hidden=64", "image.size=32",
                        "image.patch=8", "classes=10"]),
    "gru_bahdanau": ("gru-bahdanau", RNN),
    "gru_luong_general_2_layers": ("gru-bahdanau", [*RNN, "rnn.attention=luong_general", "rnn.bidirectional=false",
                                                     "rnn.layers=2"]),
    "gru_luong_dot": ("gru-bahdanau", [*RNN, "rnn.attention=luong_dot", "rnn.bidirectional=false"]),
    "lstm_bahdanau": ("gru-bahdanau", [*RNN, "rnn.cell=lstm"]),
    "elman_fixed_context": ("gru-bahdanau", [*RNN, "rnn.cell=rnn", "rnn.attention=none"]),
}  # fmt: skip
GENERATIVE = [
    "gpt2",
    "llama_gqa_rope_swiglu",
    "mixtral_moe",
    "deepseek_v3_mla",
    "transformer_enc_dec",
    "t5_relative_bias",
    "flan_t5_gated",
    "whisper_audio",
    "gru_bahdanau",
    "lstm_bahdanau",
]
B, N, N_DEC = 2, 12, 7


def _setup(case: str) -> tuple[LayerGraph, Any]:
    preset, sets = CASES[case]
    spec = specc.load_spec(preset, sets)
    model = specc.build_torch(spec)
    return specc.lower(spec), model.eval()


def _inputs(g: LayerGraph, env: dict[str, int]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, i in g.inputs.items():
        if i.optional:
            continue
        shape = dims(i.shape, env)
        out[name] = torch.randint(0, 10, shape, generator=gen) if i.dtype == "int64" else torch.randn(shape)
    return out


def _counting(case: str, mode: str = "no_grad") -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(getattr(torch, mode)())  # no_grad | inference_mode: tied heads count under both
    stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    if "lstm" in case:
        stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
    return stack


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
@pytest.mark.parametrize("case", list(CASES))
def test_matmul_flops_equal_flop_counter(case: str, mode: str) -> None:
    g, model = _setup(case)
    env = {"B": B, "N": N, "N_dec": N_DEC}
    expected = analyze(g, batch=B, seq=N, dec_seq=N_DEC, crossover=False).to_dict()["flops"]["forward"]["matmul"]
    with _counting(case, mode), FlopCounterMode(display=False) as counter:
        model(**_inputs(g, env))
    assert counter.get_total_flops() == expected


@pytest.mark.parametrize("case", list(CASES))
def test_params_equal_module(case: str) -> None:
    g, model = _setup(case)
    # stored: what specc holds (DeepSeek's selection-only score bias is a parameter here, a buffer in the reference)
    assert sum(p.numel() for p in model.parameters()) == analyze(g, crossover=False).params.stored


@pytest.mark.parametrize("case", GENERATIVE)
def test_decode_step_flops_equal_flop_counter(case: str) -> None:
    """One cached decode step after an n-token prompt: a one-token query over n + 1 keys, encoder not rerun."""
    g, model = _setup(case)
    n = 9
    x = _inputs(g, {"B": B, "N": n, "N_dec": n})
    prompt = x.pop(model.step_input)
    expected = analyze(g, batch=B, seq=n, dec_seq=n, kv_len=n + 1, crossover=False).to_dict()["flops"]["decode_step"]
    with _counting(case):
        cache = model.start(x, max_len=32)
        model.step(cache, prompt)
        with FlopCounterMode(display=False) as counter:
            model.step(cache, torch.randint(0, 10, (B, 1)))
    assert counter.get_total_flops() == expected["matmul"]
