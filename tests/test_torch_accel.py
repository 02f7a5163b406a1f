"""The acceleration pass (specc.backends.torch.accel) from outside: build_torch applies it unless told not to
(``accelerate=False``, ``SPECC_ACCEL=0``); off, the model is the plain generated module tree with the same
logits and tokens; ``model.plain()`` and ``accel.restore`` undo it; nothing below the pass imports it (the standalone
model.py holds none of it: tests/test_torch_model_py.py, for every family)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_torch_cases import tiny

from specc.backends.torch import build_torch, example_inputs
from specc.backends.torch.accel import accelerate, restore
from specc.backends.torch.layers import overrides
from specc.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["gpt2", "llama_gqa_rope", "mixtral_moe", "sliding_rope", "transformer", "vit_cls", "gru_bahdanau"]


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pair(case: str) -> tuple[Any, Any]:
    spec = tiny(case)
    return build_torch(spec, accelerate=True), build_torch(spec, accelerate=False)


@pytest.mark.parametrize("case", FAMILIES)
def test_logits_equal_with_the_pass_on_and_off(case: str) -> None:
    fast, plain = _pair(case)
    assert overrides(fast) and not overrides(plain)
    assert all("forward" not in m.__dict__ for m in plain.modules()), "the plain tree has no instance forwards"
    inputs = example_inputs(plain.graph, batch=2, length=6)
    with torch.inference_mode():
        want = plain.run(inputs)
        for _ in range(2):  # the first call measures the kernels, the second runs the chosen ones
            got = fast.run(inputs)
    assert want.keys() == got.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["gpt2", "llama_gqa_rope"])
def test_generation_equal_with_the_pass_on_and_off_and_after_plain(case: str) -> None:
    fast, plain = _pair(case)
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    want = plain.generate(ids, 8)
    assert torch.equal(fast.generate(ids, 8), want)
    assert fast.plain() is fast and not overrides(fast)
    assert torch.equal(fast.generate(ids, 8), want)
    with pytest.raises(Exception, match="compiled decoding comes with the acceleration pass"):
        plain.generate(ids, 2, compile=True)


def test_restore_undoes_accelerate_and_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tiny("gpt2")
    model = build_torch(spec)
    kinds = {(type(v).__name__, name) for m, name in overrides(model) for v in [m.__dict__[name]]}
    assert {("FastForward", "forward"), ("Step", "step"), ("Generate", "generate")} == kinds  # the tied head: a Linear
    assert restore(model) is model and not overrides(model)
    assert accelerate(accelerate(model)) is model and {type(m.__dict__[k]).__name__ for m, k in overrides(model)} == {
        "FastForward",
        "Step",
        "Generate",
    }
    assert len(overrides(model)) == len(overrides(build_torch(spec))), "idempotent"
    monkeypatch.setenv("SPECC_ACCEL", "0")
    assert not overrides(build_torch(spec))
    assert overrides(build_torch(spec, accelerate=True)), "the argument wins over the switch"
    with pytest.raises(SpecError, match="accelerate must be True, False or None"):
        build_torch(spec, accelerate="yes")


def test_meta_models_get_no_kernels_and_pickle_with_the_pass(tmp_path: Path) -> None:
    meta = build_torch(tiny("gpt2"), device="meta")
    assert {k for _, k in overrides(meta)} == {"step", "generate"}  # linears are routed on the CPU only
    model = build_torch(tiny("gpt2"))
    torch.save(model, tmp_path / "m.pt")
    back = torch.load(tmp_path / "m.pt", weights_only=False)
    assert len(overrides(back)) == len(overrides(model))
    assert all(m.__dict__[k].module is m for m, k in overrides(back))


def test_a_plain_build_imports_nothing_of_the_pass() -> None:
    code = (
        "import sys, torch; from specc.backends.torch import build_torch; "
        "m = build_torch('gpt2', device='meta', accelerate=False); m.plain(); "
        "print(sorted(n for n in sys.modules if n.startswith('specc.backends.torch.accel')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def _imports(path: Path) -> set[str]:
    """The modules a file imports, absolute (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return out


@pytest.mark.parametrize(
    "folder",
    ["specc/backends/torch/layers", "specc/backends/torch/codegen", "specc/train", "specc/parallel"],
)
def test_nothing_below_the_pass_imports_it(folder: str) -> None:
    for path in sorted((ROOT / folder).rglob("*.py")):
        hits = sorted(m for m in _imports(path) if m.startswith("specc.backends.torch.accel"))
        assert not hits, f"{path.relative_to(ROOT)} imports {hits}"
