"""export-hf: specc → a Hugging Face folder that transformers loads with the same function, for every HF class
specc imports (round trips through the zoo's tiny random models, no network), specs written by hand, checkpoints,
and the command's refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_families_zoo import FAMILY_CASES, missing_features
from test_hf_deepseek import CASES as DEEPSEEK_CASES
from test_hf_zoo import CASES, Case, save, transformers

import specc
from specc.interop import import_hf
from specc.interop import tensor_ops as ops
from specc.interop.hf_export import export_hf
from specc.interop.registry import FAMILIES

RTOL = 1e-5  # of the logits' scale

# one case per HF class, plus the variants whose weights or config take another path (fused q/k/v of a group
# layout, LongRoPE's top-level field, untied and unshared embeddings, per-layer kinds)
_EXTRA = {
    "gpt2-untied-relu",
    "phi3-longrope-switch",
    "falcon-40b-style",
    "falcon-rw-alibi",
    "marian-unshared",
    "qwen2-mixed",
    "deepseekv3-yarn",
}


# T5, mT5, UMT5: 8 buckets up to distance 6 (the 9-token source reaches the logarithmic buckets); v1.0 (relu, tied,
# the decoder output scaled), v1.1 / flan (gated-gelu, a head of its own, unscaled), mT5, UMT5 (per-layer tables)
_T5 = dict(vocab_size=90, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1, num_heads=4,
           relative_attention_num_buckets=8, relative_attention_max_distance=6, dropout_rate=0.0)  # fmt: skip
T5_CASES = [
    Case("t5-relu-tied", "T5ForConditionalGeneration", dict(_T5)),
    Case(
        "t5-gated-untied",
        "T5ForConditionalGeneration",
        dict(_T5, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
    ),
    Case("mt5-gated", "MT5ForConditionalGeneration", dict(_T5, feed_forward_proj="gated-gelu")),
    Case("umt5-perlayer", "UMT5ForConditionalGeneration", dict(_T5, feed_forward_proj="gated-silu")),
]
_SEQ2SEQ = {"t5", "mt5", "umt5"}  # besides Case.seq2seq's BART and Marian
_OWN_HEAD = {"t5-gated-untied"}


def _give_own_head(hf: Any, folder: Path) -> None:
    """A flan-T5 checkpoint: an lm_head of its own and ``tie_word_embeddings: false`` (transformers 5 ties T5's
    head on building and saves true, so both are written here, as the published checkpoints have them)."""
    with torch.no_grad():
        hf.lm_head.weight = torch.nn.Parameter(torch.randn_like(hf.shared.weight) * hf.shared.weight.std())
    hf.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["tie_word_embeddings"] = False
    del config["scale_decoder_outputs"]
    (folder / "config.json").write_text(json.dumps(config))
    assert not torch.equal(hf.lm_head.weight, hf.shared.weight)


def _cases() -> list[Case]:
    seen: set[str] = set()
    out = []
    for c in [*CASES, *FAMILY_CASES, *DEEPSEEK_CASES]:
        if c.arch not in seen or c.id in _EXTRA:
            seen.add(c.arch)
            out.append(c)
    return [*out, *T5_CASES]


def _inputs(case: Case, config: Any) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    if case.family == "vit":
        return {"pixel_values": torch.randn(2, config.num_channels, config.image_size, config.image_size, generator=g)}
    x = {"input_ids": torch.randint(3, config.vocab_size - 1, (2, 9), generator=g)}
    if case.seq2seq or case.family in _SEQ2SEQ:
        target = getattr(config, "decoder_vocab_size", None) or config.vocab_size
        x["decoder_input_ids"] = torch.randint(3, target - 1, (2, 5), generator=g)
    return x


def _hf_out(model: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        out = model(**x)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= RTOL * scale, f"{what}: differs by more than {RTOL} × {scale:.3g}"


def _params(model: Any) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    return {k: state[k] for k in model.graph.params()}


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c.id)
def test_hf_model_round_trips_through_specc(case: Case, tmp_path: Path) -> None:
    """HF model → import-hf → specc model → export-hf → transformers loads it: the same outputs as the original
    and as specc's model."""
    if missing_features(case):
        pytest.skip(f"needs {missing_features(case)}")
    hf, folder = save(case, tmp_path / "hf")
    if case.id in _OWN_HEAD:
        _give_own_head(hf, folder)
    spec = import_hf(folder).spec
    model = specc.build_torch(spec, weights=str(folder / "model.safetensors"))
    done = export_hf(spec, _params(model), tmp_path / "out")
    assert done.architecture == case.arch
    assert sorted(p.name for p in done.folder.iterdir()) == ["config.json", "model.safetensors"]
    back = type(hf).from_pretrained(done.folder).eval()
    assert type(back).__name__ == case.arch
    x = _inputs(case, hf.config)
    want = _hf_out(hf, x)
    _close(_hf_out(back, x), want, f"{case.id}: exported vs original")
    if case.text and not case.seq2seq and case.arch != "BertModel":
        with torch.no_grad():
            out = model.run(dict(x))
        got = out["logits"] if "logits" in out else out["last_hidden_state"]  # a tower (CLIP text) has no logits
        _close(torch.as_tensor(got), want, f"{case.id}: specc vs exported")


def test_every_import_family_has_a_round_trip_case() -> None:
    from test_hf_dual_encoders import ROUND_TRIPPED as DUAL  # CLIP / SigLIP dual encoders, CLIP's projected towers
    from test_hf_llama4 import ROUND_TRIPPED as LLAMA4  # Llama 4's multimodal checkpoint: its text model
    from test_hf_t5_headless import ROUND_TRIPPED as T5_HEADLESS  # T5's encoder alone, T5Model
    from test_hf_zoo_positions import ROUND_TRIPPED  # RoBERTa and DistilBERT: round-tripped in their family tests
    from test_hf_zoo_whisper import ROUND_TRIPPED as WHISPER  # Whisper: from input_features, in its own file

    tested = {c.arch for c in _cases()} | ROUND_TRIPPED | DUAL | T5_HEADLESS | LLAMA4 | WHISPER
    assert {a for f in FAMILIES for a in f.architectures} <= tested


_SPECS: dict[str, dict[str, Any]] = {
    "decoder-llama": {
        "kind": "decoder",
        "vocab_size": 64,
        "context": 32,
        "d_model": 32,
        "blocks": 2,
        "attention": {"heads": 4, "kv_heads": 2},
        "norm": {"type": "rmsnorm", "eps": 1e-6},
        "mlp": {"type": "swiglu", "hidden": 48, "activation": "silu"},
        "position": {"type": "rotary", "theta": 10000.0},
        "bias": False,
        "tie_embeddings": False,
        "init": {"std": 0.3, "seed": 7},
    },
    "decoder-deepseek": {  # written from scratch: MLA + DeepSeek routing → DeepseekV3ForCausalLM
        "kind": "decoder",
        "vocab_size": 64,
        "context": 32,
        "d_model": 32,
        "blocks": 2,
        "attention": {
            "heads": 4,
            "latent": {"kv_rank": 16, "q_rank": 24, "rope_head_dim": 8, "nope_head_dim": 12, "v_head_dim": 10},
        },
        "norm": {"type": "rmsnorm", "eps": 1e-6},
        "mlp": {
            "type": "moe",
            "experts": 8,
            "active": 2,
            "hidden": 16,
            "router": {
                "score": "sigmoid",
                "score_bias": True,
                "groups": 2,
                "top_groups": 1,
                "group_score": "top2_sum",
                "aux_loss_coef": 0.0,
            },
            "shared": {"hidden": 16},
        },
        "layer_kinds": {"dense": {"mlp": {"type": "swiglu", "hidden": 48}}, "moe": {}},
        "layer_pattern": ["dense", "moe"],
        "position": {"type": "rotary", "rotation": "interleaved"},
        "bias": False,
        "tie_embeddings": False,
        "init": {"std": 0.3, "seed": 7},
    },
    "decoder-gpt2": {
        "kind": "decoder",
        "vocab_size": 64,
        "context": 32,
        "d_model": 32,
        "blocks": 2,
        "attention": {"heads": 4},
        "mlp": {"type": "classic", "hidden": 64, "activation": "gelu_tanh"},
        "position": "learned",
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": False},
        "init": {"std": 0.3},
    },
    "encoder-bert": {
        "kind": "encoder",
        "vocab_size": 64,
        "context": 32,
        "type_vocab_size": 2,
        "d_model": 32,
        "blocks": 2,
        "attention": {"heads": 4, "mask": "padding"},
        "norm": {"type": "layernorm", "placement": "post", "eps": 1e-12, "embedding": True},
        "mlp": {"type": "classic", "hidden": 48, "activation": "gelu"},
        "position": "learned",
        "head": "mlm",
        "bias": {"qkv": True, "out": True, "mlp": True, "norm": True, "head": True},
        "init": {"std": 0.3},
    },
    "vit": {
        "kind": "vit",
        "image": {"size": 16, "patch": 4, "channels": 3},
        "head": "classifier",
        "classes": 5,
        "d_model": 32,
        "blocks": 2,
        "attention": {"heads": 4, "mask": "none"},
        "norm": {"type": "layernorm", "placement": "pre", "eps": 1e-12},
        "mlp": {"type": "classic", "hidden": 48, "activation": "gelu"},
        "position": "learned",
        "bias": True,
        "init": {"std": 0.3},
    },
    "seq2seq-marian": {
        "kind": "encoder_decoder",
        "vocab_size": 64,
        "context": 32,
        "d_model": 32,
        "blocks": {"encoder": 1, "decoder": 2},
        "attention": {"heads": 4, "mask": "padding"},
        "norm": {"type": "layernorm", "placement": "post", "eps": 1e-5},
        "mlp": {"type": "classic", "hidden": 48, "activation": "silu"},
        "position": "sinusoidal",
        "bias": True,
        "embedding_scale": "sqrt_d_model",
        "init": {"std": 0.3},
    },
    "seq2seq-t5": {  # written by hand: relative positions, unscaled scores, a gated MLP → T5ForConditionalGeneration
        "kind": "encoder_decoder",
        "vocab_size": 64,
        "context": 32,
        "d_model": 32,
        "blocks": {"encoder": 2, "decoder": 1},
        "attention": {"heads": 4, "head_dim": 6, "scale": 1.0, "mask": "padding"},
        "norm": {"type": "rmsnorm", "placement": "pre", "eps": 1e-6},
        "mlp": {"type": "swiglu", "hidden": 40, "activation": "gelu_tanh"},
        "position": {"type": "relative", "buckets": 8, "max_distance": 6},
        "shared_embeddings": True,
        "tie_embeddings": False,
        "bias": False,
        "init": {"std": 0.3},
    },
}


def _spec_inputs(kind: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if kind == "vit":
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    x = {"input_ids": torch.randint(0, 63, (2, 9), generator=g)}
    if kind == "encoder_decoder":
        x["decoder_input_ids"] = torch.randint(0, 63, (2, 5), generator=g)
    return x


@pytest.mark.parametrize("name", list(_SPECS))
def test_spec_exports_to_what_build_torch_computes(cli, name: str, tmp_path: Path) -> None:
    """A spec (random weights, seeded) → export-hf → transformers: the logits of build_torch."""
    spec_file = tmp_path / f"{name}.yaml"
    spec_file.write_text(json.dumps({"name": name, **_SPECS[name]}), encoding="utf-8")
    code, stdout, stderr = cli("export-hf", spec_file, "-o", tmp_path / "out")
    assert code == 0, stderr
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    back = getattr(transformers, config["architectures"][0]).from_pretrained(tmp_path / "out").eval()
    model = specc.build_torch(specc.load_spec(spec_file))
    x = _spec_inputs(_SPECS[name]["kind"])
    with torch.no_grad():
        want = torch.as_tensor(model.run(dict(x))["logits"])
    _close(_hf_out(back, x), want, name)
    assert f"wrote {tmp_path / 'out'}" in stdout


def test_checkpoint_exports_and_replaces_the_folder_whole(cli, tmp_path: Path) -> None:
    spec_file = tmp_path / "llama.yaml"
    spec_file.write_text(json.dumps({"name": "llama", **_SPECS["decoder-llama"]}), encoding="utf-8")
    ck = tmp_path / "llama.safetensors"
    code, _, stderr = cli("compile", spec_file, "--target", "torch", "-o", ck)
    assert code == 0, stderr
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.bin").write_bytes(b"old")  # nothing of the old folder survives
    code, _, stderr = cli("export-hf", ck, "-o", out)
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    back = transformers.LlamaForCausalLM.from_pretrained(out).eval()
    model = specc.backends.torch.load_checkpoint(str(ck))
    ids = torch.arange(9).reshape(1, 9)
    with torch.no_grad():
        want = torch.as_tensor(model.run({"input_ids": ids})["logits"])
    _close(_hf_out(back, {"input_ids": ids}), want, "checkpoint")


def test_tied_head_is_written_once(tmp_path: Path) -> None:
    from safetensors import safe_open

    spec = specc.load_spec({"name": "t", **_SPECS["decoder-gpt2"]})
    done = export_hf(spec, _params(specc.build_torch(spec)), tmp_path / "out")
    with safe_open(str(done.folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    assert json.loads((done.folder / "config.json").read_text())["tie_word_embeddings"] is True


def _spec_file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_refuses_what_no_hf_class_expresses_at_its_line(cli, tmp_path: Path) -> None:
    spec = _spec_file(
        tmp_path,
        "name: odd\nkind: decoder\nvocab_size: 64\ncontext: 32\nd_model: 32\nblocks: 1\nattention: {heads: 4}\n"
        "norm:\n  type: rmsnorm\n  placement: post\nmlp: {type: swiglu, hidden: 48}\nposition: rotary\n",
    )
    code, _, stderr = cli("export-hf", spec, "-o", tmp_path / "out")
    assert code == 2
    first = stderr.strip().splitlines()[0]
    assert first.startswith(f"{spec}:10:") and "LlamaForCausalLM cannot express post norms" in first
    assert "Traceback" not in stderr and not (tmp_path / "out").exists()


def test_refuses_what_t5_cannot_express_at_its_line(cli, tmp_path: Path) -> None:
    spec = _spec_file(
        tmp_path,
        "name: tiny-t5\nkind: encoder_decoder\nvocab_size: 64\ncontext: 32\nd_model: 32\n"
        "blocks: {encoder: 1, decoder: 1}\nattention:\n  heads: 4\n  scale: 0.5\nnorm: {type: rmsnorm}\n"
        "mlp: {type: classic, hidden: 48, activation: relu}\nposition: relative\nbias: false\n",
    )
    code, _, stderr = cli("export-hf", spec, "-o", tmp_path / "out")
    assert code == 2
    first = stderr.strip().splitlines()[0]
    assert first.startswith(f"{spec}:9:") and "T5ForConditionalGeneration cannot express scaled scores" in first
    assert "Traceback" not in stderr and not (tmp_path / "out").exists()


def test_refuses_a_kind_hf_has_no_class_for(cli, tmp_path: Path) -> None:
    code, _, stderr = cli("export-hf", "gru-bahdanau", "-o", tmp_path / "out")
    assert code == 2 and "Hugging Face has no class for a rnn_seq2seq model" in stderr


def test_refuses_options_a_checkpoint_does_not_take_and_an_input_as_output(cli, tmp_path: Path) -> None:
    spec_file = tmp_path / "g.yaml"
    spec_file.write_text(json.dumps({"name": "g", **_SPECS["decoder-gpt2"]}), encoding="utf-8")
    ck = tmp_path / "g.safetensors"
    assert cli("compile", spec_file, "--target", "torch", "-o", ck)[0] == 0
    code, _, stderr = cli("export-hf", ck, "-o", tmp_path / "out", "--set", "blocks=1")
    assert code == 2 and "--set does not apply to a checkpoint" in stderr
    code, _, stderr = cli("export-hf", spec_file, "-o", tmp_path)
    assert code == 2 and "holds an input" in stderr
    code, _, stderr = cli("export-hf", spec_file, "-o", spec_file)
    assert code == 2 and "not a folder" in stderr


# ---------------------------------------------------------------------------------------------- the engine


@pytest.mark.parametrize(
    ("op", "expect"),
    [
        (("copy",), ((4, 3),)),
        (("t",), ((3, 4),)),
        (("cat", 0), ((2, 3), (1, 3), (1, 3))),
        (("stack",), ((4, 3),) * 2),
        (("reshape", (4, 3)), ((1, 4, 3),)),
        (("rows", 2), ((6, 3),)),
        (("interleave", 1), ((4, 6),)),
        (("regroup", 2, (1, 1, 1)), ((12, 3),)),
        (("regroup", 2, (2, 1, 1)), ((16, 3),)),
    ],
)
def test_every_weight_op_runs_backwards(op: tuple[Any, ...], expect: tuple[tuple[int, ...], ...]) -> None:
    """apply(op, unapply(op, y)) == y for every operation a weight rule may hold, torch and numpy alike."""
    sources = [torch.randn(s) for s in expect]
    y = ops.apply(op, sources)
    back = ops.unapply(op, y, expect)
    assert torch.equal(ops.apply(op, back), y)
    if op[0] not in ("rows",):  # the dropped rows come back as zeros
        assert all(torch.equal(a, b) for a, b in zip(back, sources, strict=True))
    assert (ops.apply(op, [s.numpy() for s in back]) == y.numpy()).all()


def test_slices_assemble_into_their_fused_tensor() -> None:
    fused = torch.randn(6, 4)
    parts = [ops.unapply(("narrow", 0, a, b), fused[a:b], ((6, 4),))[0] for a, b in ((3, 6), (0, 3))]
    assert torch.equal(ops.assemble(parts), fused)
    assert ops.assemble(parts[:1]) is None  # a gap is not filled with anything
