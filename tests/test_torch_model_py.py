"""The standalone model.py is specialised to its model: every family's file gives build_torch's outputs (same
seeded initialisation), is ruff-clean without format escapes, and holds none of the paths its model does not
take (mask kinds, RoPE scaling, seq2seq generation, recurrent init)."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from test_torch_cases import CASES, SMALL, one_thread, tiny  # noqa: F401  (autouse fixture)

import specc
from specc.backends.torch import build_torch, example_inputs, write_model_py
from specc.backends.torch.codegen.facts import model_facts
from specc.backends.torch.codegen.specialise import specialise
from specc.spec.presets import preset_names

ROOT = Path(__file__).resolve().parents[1]
GQA = [*SMALL, "attention.kv_heads=2", "dtype=fp32"]
_TOWER = ["d_model=32", "blocks=1", "mlp.hidden=48", "attention.heads=4"]
DUAL = [f"{t}.{k}" for t in ("vision", "text") for k in _TOWER] + ["vision.image.size=28", "text.context=8"]
LONGROPE = "original_max_positions: 4, short_factor: [1, 1.5, 2, 3], long_factor: [2, 3, 4, 5]"
YARN = "factor: 4.0, original_max_positions: 4, truncate: false, attention_factor: 1.2"
EXTRA = {  # kinds CASES does not hold: scaled RoPE, soft-capped and per-layer sliding attention, QK-norm, chunks
    "llama3_scaled_rope": ("llama3.1-8b", [*GQA, "position.scaling.original_max_positions=8"]),
    # each other frequency scaling: its own branch only (past original_max_positions where length matters)
    "linear_rope": ("llama2-7b", [*GQA, "position.scaling={type: linear, factor: 2.0}"]),
    "dynamic_rope": ("llama2-7b", [*GQA, "position.scaling={type: dynamic, factor: 2.0, original_max_positions: 4}"]),
    "longrope_rope": ("llama2-7b", [*GQA, f"position.scaling={{type: longrope, {LONGROPE}}}"]),
    "yarn_stated_factor": ("llama2-7b", [*GQA, f"position.scaling={{type: yarn, {YARN}}}"]),
    "gemma2_softcap_layer_kinds": ("gemma2-9b", [*GQA, "context=8192"]),
    "qwen3_qk_norm": ("qwen3-8b", GQA),
    "mistral_sliding_gqa": ("mistral-7b", [*GQA, "attention.window=4"]),
    "chunked_rope": ("gpt2", [*SMALL, "attention.mask=chunked", "attention.chunk=4", "position=rotary"]),
    "bloom_alibi": ("bloom-176b", [*SMALL, "dtype=fp32"]),
    "sinks": ("gpt2", [*SMALL, "attention.sinks=true"]),
    "clip_dual": ("clip-vit-large-patch14-dual", [*DUAL, "text.vocab_size=64"]),
    "siglip_dual": ("siglip-so400m-dual", [*DUAL, "text.projection.dim=32"]),
    "mistral_sinks_gqa": ("mistral-7b", [*GQA, "attention.window=4", "attention.sinks=true"]),
    "llama4_nope_moe": (  # weightless QK-norm, chunks of 4, temperature tuning, input-weighted top-1 sigmoid experts
        "llama4-scout",
        [
            *GQA,
            "blocks=4",
            "mlp.hidden=16",
            "mlp.shared.hidden=16",
            "mlp.experts=4",
            "layer_kinds.rope.attention.chunk=4",
            "layer_kinds.nope.attention.temperature.floor=2",
            "position.scaling.original_max_positions=8",
            "layer_pattern=[rope, nope]",
        ],
    ),
    "deepseek_mla_moe": (
        "deepseek-v3",
        [
            *SMALL,
            "attention.latent={kv_rank: 16, q_rank: 24, rope_head_dim: 8, nope_head_dim: 12, v_head_dim: 10}",
            "mlp.hidden=16",
            "mlp.experts=8",
            "mlp.active=3",
            "mlp.router.groups=2",
            "mlp.router.top_groups=1",
            "mlp.shared.hidden=16",
            "layer_kinds.dense.mlp.hidden=48",
            "layer_pattern=[dense, moe]",
            "position.scaling.original_max_positions=16",
            "dtype=fp32",
        ],
    ),
}


def _spec(case: str):
    if case in EXTRA:
        preset, sets = EXTRA[case]
        return specc.load_spec(preset, sets)
    return tiny(case)


def _import(path: Path) -> ModuleType:
    loaded = importlib.util.spec_from_file_location(f"model_py_{path.stem}", path)
    assert loaded and loaded.loader
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module
    loaded.loader.exec_module(module)
    return module


def _outputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs, **({"return_all": True} if "return_all" in model.forward.__code__.co_varnames else {}))
    return out if isinstance(out, dict) else {"logits": out}


# what a standalone model.py may import: the standard library's small helpers, torch, safetensors for weights
ALLOWED_IMPORTS = {"__future__", "collections", "contextlib", "dataclasses", "functools", "math", "pathlib", "re"}
ALLOWED_IMPORTS |= {"typing", "torch", "safetensors"}


def _imports(tree: ast.AST) -> set[str]:
    """Every module a file imports, and the names it takes from them."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names |= {node.module or "", *(a.name for a in node.names)}
    return names


def _acceleration_in(tree: ast.AST) -> set[str]:
    """Names of the acceleration pass in a file: kernel slots, overrides, imports of specc's ``accel``."""
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | _imports(tree)
    names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return {n for n in names if "kernel" in n or "accel" in n or n in ("Override", "plain")}


def _ruff(path: Path) -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        return
    config = ["--config", str(ROOT / "pyproject.toml")]
    check = subprocess.run([ruff, "check", *config, str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    fmt = subprocess.run([ruff, "format", "--check", *config, str(path)], capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout


@pytest.mark.parametrize("case", [*CASES, *EXTRA])
def test_every_family_gives_build_torch_outputs(case: str, tmp_path: Path) -> None:
    spec = _spec(case)
    path = write_model_py(spec, tmp_path / "model.py")
    text = path.read_text()
    assert "fmt:" not in text
    _ruff(path)
    tree = ast.parse(text)
    assert not _acceleration_in(tree), case  # the acceleration pass stays outside the file
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):  # a one-line docstring per class
        doc = ast.get_docstring(cls, clean=False)
        assert doc and "\n" not in doc, (case, cls.name)
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m.split(".")[0] for m in modules} <= ALLOWED_IMPORTS, modules  # torch, not specc
    module = build_torch(spec)
    ops = list(module.graph.ops())  # init_rule's branches: the (1 + w) norms' zero start, the experts' biases
    assert ('getattr(module, "unit_offset", False)' in text) == any(getattr(o.attrs, "unit_offset", 0) for o in ops)
    assert ('local in getattr(module, "zeros", ())' in text) == any(o.kind == "moe" for o in ops), case
    standalone = _import(path).build()
    assert list(standalone.state_dict()) == list(module.state_dict())
    inputs = example_inputs(module.graph, batch=2, length=6)
    got: dict[str, dict[str, torch.Tensor]] = {}
    seen = _traced_shapes(path, lambda: got.setdefault("out", _outputs(standalone, inputs)))
    _same(_outputs(module, inputs), got["out"])  # the same seeded initialisation
    config = getattr(_import(path), "Config", None)  # none: the recurrent models' sizes stay literals
    names = _sizes(config() if config else None, B=2, N=6, N_dec=6)
    for line, (_, dims) in _commented_shapes(path).items():  # each shape comment that ran is the tensor's shape
        want = _dims(dims, names)
        if want is not None and line in seen:
            assert all(_fits(shape, want) for shape in seen[line]), (case, line, dims, seen[line])
    _run_usage(text, standalone, inputs)
    gen = torch.Generator().manual_seed(7)  # weights unlike the seeded init: a loader that re-initialises shows
    weights = {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in module.state_dict().items()}
    standalone.load_state_dict(weights)
    _same(_outputs(build_torch(spec, weights=weights), inputs), _outputs(standalone, inputs))


def _run_usage(text: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    """The header's example line runs as written (2 new tokens for 20) and returns what its comment says."""
    usage = text.split("\n")[2]
    assert usage.startswith("model = build(); ")
    scope: dict[str, Any] = {"build": lambda: model, **inputs}
    exec(usage.split("  #")[0].replace(", 20)", ", 2)"), scope)
    if "out" in scope:
        assert isinstance(scope["out"], dict) and list(scope["out"]) == list(type(model).OUTPUTS), usage
    else:
        assert isinstance(scope["logits"], torch.Tensor), usage
        assert ("return_all=True" in usage) == ("return_all" in model.forward.__code__.co_varnames), usage
    assert ("tokens" in scope) == callable(getattr(model, "generate", None)), usage  # shown where it generates
    if "tokens" in scope:
        prompt = 1 if "decoder_input_ids" in inputs else inputs["input_ids"].shape[1]  # the start token or the ids
        assert scope["tokens"].shape[1] == prompt + 2, usage


def _same(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert want.keys() == got.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=1e-5)


# Line budgets reached so far (issue 25 asks GPT-2 ≤ 250 and a Llama without RoPE scaling ≤ 300): a change that
# lets model.py grow fails here; one that shrinks it lowers the number.
BUDGETS = {"gpt2": 339, "llama2-7b": 347}


@pytest.mark.parametrize("preset", sorted(BUDGETS))
def test_model_py_stays_within_its_line_budget(preset: str, tmp_path: Path) -> None:
    path = write_model_py(specc.load_spec(preset), tmp_path / "model.py")
    text = path.read_text()
    assert len(text.splitlines()) <= BUDGETS[preset]
    assert "fmt: skip" not in text and "fmt: off" not in text and max(map(len, text.splitlines())) <= 120
    assert "State() if state is None" not in text  # the root passes its State to every layer
    _ruff(path)


def test_gpt2_holds_none_of_the_paths_it_does_not_take(tmp_path: Path) -> None:
    text = write_model_py(specc.load_spec("gpt2"), tmp_path / "model.py").read_text()
    unused = ["sliding", "chunk", "window", "self.prefix", '"prefix"', "yarn", "longrope", "Rotary", "rnn", "RNN"]
    unused += ["cell", "seq2seq", "decoder_input_ids", "rebuild_cache_after", "softcap", "MoE", "extra_repr"]
    for absent in unused:
        assert absent not in text, absent
    assert "if self.mask" not in text and "isinstance(module, nn.RNNBase)" not in text


def test_a_llama_without_rope_scaling_carries_plain_rope_only(tmp_path: Path) -> None:
    text = write_model_py(specc.load_spec("llama2-7b"), tmp_path / "model.py").read_text()
    assert "class Rotary" in text and "ScaledRotary" not in text
    for absent in ("yarn", "llama3", "longrope", "dynamic", "scaling", "sliding", "interleaved ", "self.prefix"):
        assert absent not in text, absent


SCALED = {"llama3": "llama3_scaled_rope", "linear": "linear_rope", "dynamic": "dynamic_rope"}
SCALED |= {"longrope": "longrope_rope", "yarn": "yarn_stated_factor"}
SCALING_CODE = {  # what only one frequency scaling needs (patterns)
    "llama3": ["_llama3_inv_freq", "low_freq_factor"],
    "linear": [r'\) / (self\.)?scaling\["factor"\]'],
    "dynamic": ["dynamic_base"],
    "longrope": ["short_factor", "long_factor"],
    "yarn": ["_yarn_inv_freq", "beta_fast"],
}


@pytest.mark.parametrize("kind", sorted(SCALED))
def test_a_scaled_rope_file_carries_its_own_scaling_only(kind: str, tmp_path: Path) -> None:
    """One frequency scaling's code, not the other four's (the files still equal build_torch: every family)."""
    text = write_model_py(_spec(SCALED[kind]), tmp_path / "model.py").read_text()
    assert "class ScaledRotary" in text
    for other, needles in SCALING_CODE.items():
        for needle in needles:
            assert bool(re.search(needle, text)) == (other == kind), (kind, needle)
    assert ("pos.max() + 1" in text) == (kind in ("dynamic", "longrope"))  # frequencies by the call's length


def test_generation_runs_from_the_specialised_file(tmp_path: Path) -> None:
    """Greedy tokens with the KV cache and left padding equal build_torch's (the cache and mask paths kept)."""
    spec = tiny("llama_gqa_rope")
    standalone = _import(write_model_py(spec, tmp_path / "llama.py")).build()
    module = build_torch(spec)
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert torch.equal(standalone.generate(ids, 4, mask), module.generate(ids, 4, mask))
    assert torch.equal(standalone.generate(ids, 4, use_cache=False), module.generate(ids, 4))


def test_facts_name_expressions_the_library_holds() -> None:
    """A fact whose expression the library no longer contains decides nothing: the two must move together."""
    import ast

    from specc.backends.torch.codegen.specialise import normalise

    library = ROOT / "specc" / "backends" / "torch" / "layers"
    written = {ast.unparse(n) for f in library.glob("*.py") for n in ast.walk(ast.parse(f.read_text()))}
    facts = {**model_facts(specc.lower(tiny("gpt2"))), **model_facts(specc.lower(tiny("transformer")))}
    for key in normalise(facts):
        negations = {key.replace(" not in ", " in "), key.replace(" in ", " not in ")}
        assert key in written or negations & written, key  # a membership test or its negation


def test_the_specialiser_keeps_what_is_undecided_and_cuts_what_is_decided() -> None:
    source = """
class A:
    def __init__(self, kind="a", size=None):
        self.kind, self.size = kind, size

    def f(self, x):
        if self.kind == "b":
            return x + 1
        elif self.kind == "c" and x:
            return x + 2
        y = 3 if self.size is None else self.size
        return x * y

    def unused(self):
        return 0


def helper():
    return A().f(2)
"""
    out = specialise(source, {"self.kind": ["a"], "self.size": [None]}, keep={"helper"})
    assert "self.kind" not in out and '"b"' not in out and "unused" not in out and "size" not in out
    assert "y = 3" not in out and "return x * 3" in out  # a local the facts decide reads as its value
    passed = source.replace("def helper():\n    return A()", "def helper(kind, size):\n    return A(kind, size)")
    undecided = specialise(passed, {"self.kind": ["a", "b"]}, keep={"helper"})  # kind and size: the caller's
    assert 'if self.kind == "b"' in undecided and '"c"' not in undecided
    assert "self.size is None" in undecided


def test_a_fold_that_returns_early_takes_the_code_after_it_along() -> None:
    source = """
class A:
    def __init__(self, first=0):
        self.first = first

    def cut(self, x, mask):
        if not self.first or mask is None:
            return x
        y = x[self.first :]  # what a fold of the test leaves behind never runs
        return y


def helper(x, mask):
    return A().cut(x, mask)
"""
    out = specialise(source, {"self.first": [0]}, keep={"helper"})
    assert "return x\n" in out and "x[" not in out and "never runs" not in out, out
    passed = source.replace("def helper(x, mask):\n    return A()", "def helper(x, mask, first):\n    return A(first)")
    undecided = specialise(passed, {"self.first": [0, 2]}, keep={"helper"})  # first: the caller's
    assert "mask is None" in undecided and "x[self.first :]" in undecided, undecided


# a small value for every size a Config may hold; the positions tables (context) keep their length
SMALL_SIZES = {"d_model": 32, "heads": 4, "hidden": 48, "blocks": 2, "vocab_size": 50, "target_vocab_size": 50}
SMALL_SIZES |= {"kv_heads": 2, "experts": 4, "active": 2, "head_dim": 8, "groups": 2, "top_groups": 1}
SMALL_SIZES |= {"q_rank": 16, "kv_rank": 8, "nope_head_dim": 8, "rope_head_dim": 4, "v_head_dim": 8}
SMALL_SIZES |= {"dense_hidden": 64, "shared_hidden": 40, "text_d_model": 24, "text_heads": 3, "text_hidden": 40}
SMALL_SIZES |= {"projection_dim": 16}
VARIANTS = [p for p in preset_names() if specc.load_spec(p).kind != "rnn_seq2seq"]  # recurrent: literals stay


@pytest.mark.parametrize("preset", VARIANTS)
def test_build_with_a_smaller_config_makes_a_variant_that_runs(preset: str, tmp_path: Path) -> None:
    """Full-size presets: model.py's Config holds every size (partial RoPE's share, Whisper's audio front-end,
    latent attention's ranks, DeepSeek's dense and grouped-routing sizes, a second tower's widths); build(config=
    ...) with all of them small builds and runs a small variant."""
    from specc.ir.lower import lower

    spec = specc.load_spec(preset)
    module = _import(write_model_py(spec, tmp_path / "model.py"))
    full = module.Config()
    assert not hasattr(full, "blocks") or full.blocks == spec.blocks  # the full sizes by default
    fields = set(module.Config.__dataclass_fields__)
    unsized = {f for f in fields if f not in SMALL_SIZES and not f.endswith("blocks")}
    assert unsized <= {"context", "text_context"}, unsized  # a size this test does not shrink
    config = module.Config(**{f: 1 if f.endswith("_blocks") else SMALL_SIZES[f] for f in fields - unsized})
    model = module.build(config=config, dtype="fp32")
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    inputs = example_inputs(lower(spec), batch=1, length=5)
    inputs = {k: v % 50 if v.dtype == torch.int64 else v for k, v in inputs.items()}
    out = _outputs(model, inputs)
    assert all(torch.isfinite(v).all() for v in out.values())
    if "logits" in out and "input_ids" in inputs and len(inputs) <= 2 and spec.kind == "decoder":
        assert out["logits"].shape[-1] == 50
        assert model.generate(inputs["input_ids"], 3).shape == (1, 8)


# Config fields → the spec keys that set them (where a spec's key differs from the field's name)
SPEC_KEYS = {"heads": "attention.heads", "kv_heads": "attention.kv_heads", "head_dim": "attention.head_dim"}
SPEC_KEYS |= {"hidden": "mlp.hidden", "experts": "mlp.experts", "active": "mlp.active"}
SPEC_KEYS |= {"encoder_blocks": "blocks.encoder", "decoder_blocks": "blocks.decoder"}
SPEC_KEYS |= {f"{k}": f"attention.latent.{k}" for k in ("q_rank", "kv_rank", "nope_head_dim", "rope_head_dim")}
SPEC_KEYS |= {"v_head_dim": "attention.latent.v_head_dim", "groups": "mlp.router.groups"}
SPEC_KEYS |= {"top_groups": "mlp.router.top_groups", "dense_hidden": "layer_kinds.dense.mlp.hidden"}
VARIANT_OF = {  # preset → (Config fields, further spec settings the variant's spec needs)
    "gpt2": ({"context": 16}, []),
    "llama2-7b": ({}, ["attention.kv_heads=4"]),  # its Config's kv_heads is heads
    "gemma-7b": ({"head_dim": 8}, ["attention.kv_heads=4"]),  # embeddings × sqrt(d_model)
    "mixtral-8x7b": ({"kv_heads": 2, "experts": 4, "active": 2}, []),
    "gpt-oss-20b": ({"kv_heads": 2, "head_dim": 8, "experts": 4, "active": 2}, []),
    "pythia-1.4b": ({}, []),  # partial RoPE: a quarter of each head
    "t5-base": ({"encoder_blocks": 2, "decoder_blocks": 1}, ["attention.head_dim=8"]),
    "transformer-base": ({"encoder_blocks": 2, "decoder_blocks": 2}, []),  # × sqrt(d_model), sinusoids
    "bert-base": ({"context": 16}, []),
    "whisper-large-v3": ({"context": 16, "encoder_blocks": 2, "decoder_blocks": 1, "vocab_size": 51866}, []),
    "flan-t5-xl": ({"encoder_blocks": 1, "decoder_blocks": 2}, ["attention.head_dim=8"]),
    # Gemma states its score scale (query_pre_attn_scalar ** -0.5): a variant of head_dim 8 keeps 1/16, as HF does
    "gemma2-9b": ({"kv_heads": 2, "head_dim": 8, "blocks": 3}, []),  # sliding / full
    "gemma3-1b": ({"kv_heads": 1, "head_dim": 8, "blocks": 7}, []),  # 5 sliding, 1 full
    "modernbert-base": ({"blocks": 4}, []),  # the first block apart, then global / local / local
    "llama4-scout": ({"kv_heads": 2, "experts": 4, "active": 1, "blocks": 5}, ["mlp.shared.hidden=48"]),  # NoPE
    "qwen3-30b-a3b": ({"kv_heads": 2, "head_dim": 8, "experts": 4, "active": 2}, []),
    "phi3-mini-4k": ({}, ["attention.kv_heads=4"]),
    "olmo2-7b": ({}, ["attention.kv_heads=4"]),
    "bloom-176b": ({}, []),  # ALiBi slopes follow the heads
    "deepseek-v3": (  # latent attention's scale (YaRN's mscale) and grouped routing at the variant's sizes
        {"q_rank": 16, "kv_rank": 8, "nope_head_dim": 8, "rope_head_dim": 4, "v_head_dim": 8, "dense_hidden": 64}
        | {"experts": 4, "active": 2, "groups": 2, "top_groups": 1, "blocks": 4},
        ["layer_pattern=[dense, dense, dense, moe]", "mlp.shared.hidden=48"],
    ),
    "clip-vit-large-patch14-dual": (  # two towers of their own widths, one projection width
        {"vision_blocks": 2, "text_blocks": 1, "text_d_model": 24, "text_heads": 3, "text_hidden": 40}
        | {"text_context": 8, "projection_dim": 16},
        ["text.projection=16"],
    ),
}
TOWER_KEYS = {"d_model": "vision.d_model", "heads": "vision.attention.heads", "hidden": "vision.mlp.hidden"}
TOWER_KEYS |= {"vision_blocks": "vision.blocks", "text_blocks": "text.blocks", "vocab_size": "text.vocab_size"}
TOWER_KEYS |= {"text_d_model": "text.d_model", "text_heads": "text.attention.heads", "text_hidden": "text.mlp.hidden"}
TOWER_KEYS |= {"text_context": "text.context", "projection_dim": "vision.projection"}


@pytest.mark.parametrize("preset", sorted(VARIANT_OF))
def test_a_variant_is_the_model_specc_compiles_at_its_sizes(preset: str, tmp_path: Path) -> None:
    """build(config=...) is the model specc compiles from the spec at those sizes: the same seeded weights (the
    residual std follows the variant's blocks), the same outputs (scales that follow d_model or the head dims
    follow the variant's), and it generates up to its own position table, not the full model's."""
    from specc.ir.lower import lower

    fields, more = VARIANT_OF[preset]
    fields = {"d_model": 32, "heads": 4, "hidden": 48, "vocab_size": 50, "blocks": 2} | fields
    module = _import(write_model_py(specc.load_spec(preset), tmp_path / "model.py"))
    fields = {k: v for k, v in fields.items() if k in module.Config.__dataclass_fields__}
    keys = TOWER_KEYS if "text_blocks" in fields else SPEC_KEYS
    sets = [f"{keys.get(k, k)}={v}" for k, v in fields.items()] + more
    if "encoder_blocks" in fields:
        sets = [x for x in sets if not x.startswith("blocks=")]
    small_spec = specc.load_spec(preset, sets)
    variant = module.build(config=module.Config(**fields), dtype="fp32")
    small = build_torch(small_spec, dtype=torch.float32)
    want = small.state_dict()
    assert variant.state_dict().keys() == want.keys()
    for name, value in variant.state_dict().items():
        torch.testing.assert_close(value, want[name], atol=1e-7, rtol=1e-6, msg=name)
    inputs = example_inputs(lower(small_spec), batch=2, length=6)
    _same(_outputs(small, inputs), _outputs(variant, inputs))
    if preset == "gpt2":  # 10 + 7 > 16 learned positions: refused, as specc refuses it
        ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(0))
        with pytest.raises(ValueError, match="16 learned positions"):
            variant.generate(ids, 7)
        assert variant.generate(ids, 6).shape == (1, 16)


def test_a_base_default_every_subclass_sets_again_is_dropped_unless_the_base_is_used_by_name() -> None:
    source = """
class Base:
    FACTS = {}
    KEPT = ()

    def read(self):
        return self.FACTS, self.KEPT


class Root(Base):
    FACTS = {"a": 1}


def helper():
    return Root().read()
"""
    out = specialise(source, {}, keep={"helper"})
    assert 'FACTS = {"a": 1}' in out and "    FACTS = {}" not in out and "KEPT = ()" in out  # Root lacks KEPT
    used = specialise(source + "\n\ndef other():\n    return Base().read()\n", {}, keep={"helper", "other"})
    assert "    FACTS = {}" in used


def test_compile_python_writes_a_spec_no_name_table_fits(cli, tmp_path: Path) -> None:
    """Sinks on a GQA Mistral: no Hugging Face family stores such a model (GPT-NeoX's per-head q/k/v does not
    split for kv_heads 2), so model.py keeps specc names and is written, not a traceback."""
    out = tmp_path / "model.py"
    sets = [a for s in [*GQA, "attention.window=4", "attention.sinks=true"] for a in ("--set", s)]
    code, _, stderr = cli("compile", "mistral-7b", *sets, "--target", "python", "-o", out)
    assert code == 0, stderr
    text = out.read_text()
    assert "class SinkAttention" in text and "HF_NAMES" not in text


def test_a_fused_qkv_layout_that_does_not_split_is_a_spec_error() -> None:
    from specc.errors import SpecError
    from specc.interop.weight_map import regrouped

    assert regrouped("qkv.weight", (96, 8), 4, (1, 1, 1), "per head").op == ("regroup", 4, (1, 1, 1))
    with pytest.raises(SpecError, match=r"128 rows of qkv\.weight do not split into 4 groups of 3 blocks"):
        regrouped("qkv.weight", (128, 8), 4, (1, 1, 1), "per head")


def test_a_docstring_cut_to_one_line_ends_its_clause() -> None:
    """Every library class docstring that model.py cuts ends on a closed clause: brackets and backquotes closed,
    no dangling "or." / "of."; the cut prefers ``;`` / ``:`` over ``,`` / ``(`` over a bare word boundary."""
    import ast

    from specc.backends.torch.standalone import DANGLING, one_line

    rotary = "RoPE on the first ``dims`` dims of each q/k head: the two halves rotated together (GPT-NeoX, Llama)"
    rotary += " or, ``interleaved``, adjacent pairs (GPT-J); cos/sin built once per call."
    assert one_line(rotary, 110) == "RoPE on the first ``dims`` dims of each q/k head."
    assert one_line("A short one. Then more.", 110) == "A short one."
    assert one_line("x" * 200, 50) == "x" * 49 + "."  # no boundary at all: cut at the width
    library = ROOT / "specc" / "backends" / "torch" / "layers"
    trees = [ast.parse(f.read_text()) for f in library.glob("*.py")]
    docs = [ast.get_docstring(n) for t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
    cut = [d for d in docs if d and len(" ".join(d.split()).split(". ")[0]) >= 110]
    assert len(cut) >= 5
    for doc in cut:
        line = one_line(doc, 110)
        assert len(line) <= 110 and line.endswith(".") and line.count("`") % 2 == 0, line
        assert line.count("(") + line.count("[") == line.count(")") + line.count("]"), line
        assert line[:-1].rsplit(" ", 1)[-1].lower() not in DANGLING, line


def test_a_default_no_call_passes_and_an_attribute_set_once_to_a_literal_are_read_as_their_values() -> None:
    source = """
from functools import partial


class Core:
    def __init__(self, heads, scale=None, dropout=0.0):
        self.heads, self.scale, self.dropout = heads, scale or 1.0 / heads, dropout

    def f(self, x):
        return x * self.scale + (self.dropout if self.training else 0.0)


def pick(x, top_k=0):
    return x if not top_k else x[:top_k]


def helper():
    return Core(4).f(2), partial(pick, top_k=3)
"""
    out = specialise(source, {}, keep={"helper"})
    assert "def __init__(self, heads):" in out and "self.scale = 1.0 / heads" in out
    assert "dropout" not in out and "return x * self.scale + 0.0" in out  # the same either way: 0.0
    assert "def pick(x, top_k=0):" in out  # named as a value (partial): its callers are not all in sight


def test_inline_merges_a_base_into_its_only_subclass_and_writes_a_one_expression_method_at_its_call() -> None:
    from specc.backends.torch.codegen.inline import inline

    source = """
from torch import nn


class Core(nn.Module):
    \"\"\"The base.\"\"\"

    KIND = "core"

    def __init__(self, heads, kv=1):
        super().__init__()
        self.heads, self.kv = heads, kv

    def allows(self, k, q):
        return k <= q

    def mask(self, k, q):
        return self.allows(k, q).float()

    def hook(self, *_):
        return self.heads, self.KIND


class Self(Core):
    \"\"\"The one subclass.\"\"\"

    KIND = "self"

    def __init__(self, heads, rope=None):
        super().__init__(heads)
        self.rope = rope
        self.register_forward_hook(Core.hook)

    def forward(self, x):
        return self.mask(x, x) if self.rope is None else self.rope(x)


def twice(x):
    return x + 1


def helper(rope):
    return Self(twice(1) + twice(2), rope)
"""
    out = inline(source, keep={"helper"})
    compile(out, "<inline>", "exec")
    assert "class Core" not in out and "class Self(nn.Module):" in out and '"""The one subclass."""' in out
    assert 'KIND = "self"' in out and 'KIND = "core"' not in out  # the subclass's value wins
    assert "def __init__(self, heads, rope=None):" in out and "super().__init__()\n" in out  # kv: 1, unread
    assert "self.register_forward_hook(Self.hook)" in out
    assert "return (x <= x).float() if" in out and "allows" not in out and "mask" not in out  # one call each
    assert "def twice(x):" in out  # two calls stay a function
    namespace: dict = {}
    exec(out, namespace)
    import torch

    model = namespace["helper"](None)
    assert model.heads == 5 and model.hook() == (5, "self")
    assert torch.equal(model.forward(torch.tensor(2.0)), torch.tensor(1.0))  # (the hook replaces __call__'s)


def test_aliases_empty_dicts_and_a_value_returned_once_are_read_in_place() -> None:
    source = """
def run(ids, extra):
    return ids.shape, len(extra)


def pick(x):
    return x, x + 1, x + 2


def total(x):
    z = x.clamp(min=0)
    return z.sum()


def generate(input_ids, n):
    prompt = input_ids
    fixed = {}
    y = prompt.sum(n)
    first, second, third = pick(y)
    out, seen = run(prompt, fixed)
    return total(first), {"ids": prompt, **fixed}, second, seen
"""
    out = specialise(source, {}, keep={"generate"})
    assert "prompt" not in out and "y = input_ids.sum(n)" in out and "fixed" not in out
    assert "run(input_ids, {})" in out and '{"ids": input_ids}' in out  # nothing spread
    assert "first, second, _ = pick(y)" in out  # third: never read
    assert "return x.clamp(min=0).sum()" in out  # z read once, first in the chain
    namespace: dict = {}
    exec(out, namespace)
    import torch

    got = namespace["generate"](torch.tensor([[-1.0, 2.0]]), 1)
    assert torch.equal(got[0], torch.tensor(1.0)) and torch.equal(got[2], torch.tensor([2.0])) and got[3] == 0


@pytest.mark.parametrize(
    ("preset", "family"),
    [
        ("llama2-7b", "Llama-style"),
        ("mistral-7b", "Llama-style"),
        ("qwen2.5-7b", "Llama-style"),
        ("llama4-scout", "Llama 4"),
    ],
)
def test_the_name_table_is_the_family_the_spec_names(preset: str, family: str) -> None:
    """Llama 4's plan fills a Llama-2 graph too (and comes first in the registry, for telling checkpoints apart):
    the family a spec's name mentions wins, so Llama-2's model.py reads mlp.gate_proj, not feed_forward.gate_proj."""
    from specc.backends.torch.build import as_graph
    from specc.backends.torch.standalone_names import hf_plan

    plan = hf_plan(as_graph(specc.load_spec(preset)))
    assert plan is not None and plan.family == family
    sources = {s for rules in plan.rules.values() for r in rules for s in r.sources}
    assert any(".feed_forward." in s for s in sources) == (family == "Llama 4")


def test_an_inlined_receiver_too_wide_for_its_return_line_is_named_first() -> None:
    """``return self.product(..).transpose(..)`` where product's expression would overflow the line: the inliner
    binds it to ``y`` first and returns the chain on ``y``; the result computes what the two functions did."""
    from specc.backends.torch.codegen.inline import inline

    source = """
import torch


class Core:
    scale = 0.5

    def forward(self, q, k):
        return self.product(q, k).transpose(0, 1).flatten()

    def product(self, a, b):
        return torch.matmul(a * self.scale, b.transpose(0, 1)) + torch.matmul(b * self.scale, a.transpose(0, 1))


def helper():
    return Core()
"""
    out = inline(source, keep={"helper"})
    assert "def product" not in out
    assert "        y = torch.matmul(q * self.scale, k.transpose(0, 1)) + torch.matmul(" in out
    assert "        return y.transpose(0, 1).flatten()" in out
    namespace: dict = {}
    exec(out, namespace)
    a, b = torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)
    want = (torch.matmul(a * 0.5, b.T) + torch.matmul(b * 0.5, a.T)).T.flatten()
    assert torch.equal(namespace["helper"]().forward(a, b), want)


def test_a_method_that_only_returns_its_bases_call_goes_and_a_spread_tuple_becomes_arguments() -> None:
    """``def attend(..): return super().attend(..)`` with the signature of the nearest class up that has it is that
    class's method; ``f(q, *g(k, v))`` with ``g`` returning ``(k, v)`` is ``f(q, k, v)``; a subclass left with
    nothing of its own takes its base's docstring when the two merge."""
    from specc.backends.torch.codegen.inline import inline

    source = """
from torch import nn


class Core(nn.Module):
    \"\"\"The core.\"\"\"

    def attend(self, q, k, v, causal=False):
        return q * k + v if causal else q + k + v


class Mid(Core):
    \"\"\"Core that adds a step.\"\"\"

    def forward(self, q, k, v):
        return self.attend(q, *self.visible(k, v))

    def visible(self, k, v):
        return k, v


class Leaf(Mid):
    \"\"\"Mid that would cut keys.\"\"\"

    def attend(self, q, k, v, causal=False):
        return super().attend(q, k, v, causal)


def helper():
    return Leaf()
"""
    out = inline(source, keep={"helper"})
    assert "super().attend" not in out and "visible" not in out and "return q + k + v" in out, out
    assert out.count("class ") == 1 and '"""Core that adds a step."""' in out and "would cut" not in out, out
    namespace: dict = {}
    exec(out, namespace)
    assert namespace["helper"]()(2, 3, 4) == 9


def test_a_value_stored_right_where_it_was_computed_is_stored_directly() -> None:
    """``y = f(x)`` then ``memo[k] = y``, ``y`` named nowhere else, reads ``memo[k] = f(x)``; a name read twice, or
    a line with a comment, stays."""
    source = """
def fill(memo, k, x):
    y = abs(x)
    memo[k] = y
    z = -x
    memo[k + 1] = z
    return z


def noted(memo, k, x):
    y = abs(x)  # why
    memo[k] = y
"""
    out = specialise(source, {}, keep={"fill", "noted"})
    assert "    memo[k] = abs(x)\n" in out and "    z = -x\n    memo[k + 1] = z\n" in out, out
    assert "    y = abs(x)  # why\n    memo[k] = y\n" in out, out
    namespace: dict = {}
    exec(out, namespace)
    memo: dict = {}
    assert namespace["fill"](memo, 0, -3) == 3 and memo == {0: 3, 1: 3}


def test_the_pruner_takes_apart_edits_in_one_round_and_never_empties_a_block() -> None:
    """Removals found in one parse go in together where their lines lie apart; two that would leave a block
    empty go one at a time (the second leaves ``pass``); parameters no call passes go in one signature edit."""
    from specc.backends.torch.codegen import specialise as sp

    source = """
class Box:
    def used(self, a, b=1, c=2, *, d=3):
        return a

    def unused_one(self):
        return 1

    def unused_two(self):
        return 2


class Pair:
    def only_a(self):
        return 1

    def only_b(self):
        return 2


def helper():
    return Box().used(0)
"""
    rounds: list[int] = []
    real = sp.merged

    def counting(source: str, edits: list[str]) -> str:
        rounds.append(len(edits))
        return real(source, edits)

    sp.merged = counting
    try:
        out = specialise(source, {}, keep={"helper", "Pair"})
    finally:
        sp.merged = real
    assert "def used(self, a):" in out, out  # b, c and d in one edit
    assert "unused_one" not in out and "unused_two" not in out and "only_a" not in out and "only_b" not in out
    assert re.search(r"class Pair:\s+pass\n", out), out  # blank lines: ruff's to drop
    assert max(rounds) >= 3, rounds  # both of Box's and one of Pair's members in one round
    namespace: dict = {}
    exec(out, namespace)
    assert namespace["helper"]() == 0
    # two removals that empty one block: the first alone
    two = "class P:\n    def a(self):\n        return 1\n\n    def b(self):\n        return 2\n"
    tree = sp._Pruner(two, set())
    edits = list(tree._classes())
    assert len(edits) == 2 and sp.merged(two, edits) == edits[0]


def _commented_shapes(path: Path) -> dict[int, tuple[str | None, str]]:
    """Lines of model.py's forward methods that end in a shape comment: line → (the name assigned, or None for a
    return; the comment's dims)."""
    tree, lines = ast.parse(path.read_text()), path.read_text().split("\n")
    out: dict[int, tuple[str | None, str]] = {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "forward"):
        for stmt in ast.walk(fn):
            m = re.search(r"  # \((.*)\)$", lines[getattr(stmt, "lineno", 1) - 1])
            if m and isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                out[stmt.lineno] = (stmt.targets[0].id, m.group(1))
            elif m and isinstance(stmt, ast.Return):
                out[stmt.lineno] = (None, m.group(1))
    return out


def _traced_shapes(path: Path, run: Any) -> dict[int, set[tuple[int, ...]]]:
    """The shapes the tensor of each shape-commented line of model.py has while ``run()`` runs (sys.settrace)."""
    commented = _commented_shapes(path)
    seen: dict[int, set[tuple[int, ...]]] = {}
    last: dict[object, int] = {}

    def trace(frame, event: str, arg):  # sys.settrace calls it so
        if frame.f_code.co_filename != str(path):
            return None
        line = last.get(frame)
        if line in commented and event in ("line", "return"):
            name, _ = commented[line]
            value = arg if name is None and event == "return" else frame.f_locals.get(name) if name else None
            if isinstance(value, torch.Tensor):
                seen.setdefault(line, set()).add(tuple(value.shape))
        last[frame] = frame.f_lineno
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    return seen


def _dims(dims: str, names: dict[str, int]) -> list[set[int]] | None:
    """A shape comment's dims as the sizes each may be (``N | N_dec``: a class both stacks use), or None where it
    names a size ``names`` lacks (N_q, H)."""
    try:
        return [
            {eval(a.replace("·", "*"), {"__builtins__": {}}, names) for a in d.split(" | ")} for d in dims.split(", ")
        ]
    except NameError:
        return None


def _fits(shape: tuple[int, ...], dims: list[set[int]] | None) -> bool:
    return dims is not None and len(shape) == len(dims) and all(n in d for n, d in zip(shape, dims, strict=True))


def _sizes(config: Any, **extra: int) -> dict[str, int]:
    fields = [f for f in dir(config) if not f.startswith("_")] if config is not None else []
    return {f: getattr(config, f) for f in fields} | extra


@pytest.mark.parametrize("case", ["gpt2", "llama_gqa_rope", "mixtral_moe", "qwen3_qk_norm"])
def test_shape_comments_are_the_shapes_the_tensors_have(case: str, tmp_path: Path) -> None:
    """Each ``# (B, N, hidden)`` of a forward is the shape the line's tensor has when the model runs (its dims
    evaluated with the file's Config), and a line whose tensor changes width carries one: the MLP's first
    projection and its return, the token embedding."""
    path = write_model_py(_spec(case), tmp_path / "model.py")
    module = _import(path)
    model, config = module.build(), module.Config()
    commented = _commented_shapes(path)
    text = path.read_text()
    if re.search(r"self\.(fc1|gate) = nn\.Linear", text):  # a dense MLP (Mixtral's blocks hold experts only)
        assert re.search(r"self\.(fc1|gate)\(x\).*  # \(B, N, hidden\)", text), "the MLP's widening line"
        assert re.search(r"return self\.(fc2|down)\(x\)  # \(B, N, d_model\)", text), "the MLP's return"
    assert re.search(r"self\.embed\(input_ids\).*  # \(B, N, d_model\)", text), "the token embedding"
    b, n = 2, 5
    ids = torch.randint(0, config.vocab_size, (b, n), generator=torch.Generator().manual_seed(0))
    seen = _traced_shapes(path, lambda: _outputs(model, {"input_ids": ids}))
    assert set(seen) == set(commented), sorted(set(commented) - set(seen))  # every commented line ran
    names = _sizes(config, B=b, N=n)
    for line, (_, dims) in commented.items():
        assert " | " not in dims and all(_fits(shape, _dims(dims, names)) for shape in seen[line]), (line, dims)
