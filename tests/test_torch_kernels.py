"""specc.backends.torch.accel.kernels: the measured choice of CPU linear kernel equals F.linear, stays out of the way
of autograd, tracing, compiling and FlopCounterMode, and survives the ecosystem's module transformations."""

from __future__ import annotations

import copy
import importlib
import io
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specc.backends.torch.accel import kernels, kernels_candidates, kernels_dispatch, kernels_measure, kernels_native

IN, OUT = 48, 81  # OUT is odd: the row-split GEMV also has a remainder block


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(kernels.ENV, raising=False)
    kernels.reset()
    yield
    kernels.reset()


def _weights(bias: bool, dtype: torch.dtype = torch.float32, n_in: int = IN, n_out: int = OUT):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(n_out, n_in, generator=g).to(dtype)
    return w, (torch.randn(n_out, generator=g).to(dtype) if bias else None)


def _close(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert y.shape == ref.shape and y.dtype == ref.dtype
    tol = 1e-5 if ref.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol * (ref.abs().max().item() + 1))


def _model() -> nn.Sequential:
    g = torch.Generator().manual_seed(5)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 16, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "shape",
    [(1, IN), (3, IN), (8, IN), (100, IN), (2, 4, IN), (1, 1, IN), (IN,)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_linear_equals_f_linear(shape: tuple[int, ...], bias: bool) -> None:
    w, b = _weights(bias)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = F.linear(x, w, b)
        for _ in range(2):  # the measuring call and a cached one
            _close(kernels.linear(x, w, b), ref)
    assert kernels.choices(), "a plain fp32 CPU call is measured"


@pytest.mark.parametrize("rows", [1, 3, 100])
def test_non_contiguous_input(rows: int) -> None:
    w, b = _weights(True)
    x = torch.randn(IN, 2, rows, generator=torch.Generator().manual_seed(4)).permute(1, 2, 0)  # [2, rows, IN]
    assert not x.is_contiguous()
    with torch.inference_mode():
        _close(kernels.linear(x, w, b), F.linear(x, w, b))
        _close(kernels.linear(x[:, :, :], w.t().contiguous().t(), b), F.linear(x, w, b))


@pytest.mark.parametrize("name", sorted(kernels.CANDIDATES))
@pytest.mark.parametrize("rows", [1, 3, 8, 100])
def test_every_candidate_equals_f_linear(name: str, rows: int) -> None:
    if name == "onednn" and not kernels_candidates.onednn_available(torch.float32):
        pytest.skip("this torch build has no working oneDNN linear")
    if name == "native" and not kernels_native.available():
        pytest.skip(f"native GEMV: {kernels_native.status()}")
    w, b = _weights(True)
    x = torch.randn(2, rows, IN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _close(kernels.CANDIDATES[name](x, w, b), F.linear(x, w, b))
        _close(kernels.CANDIDATES[name](x, w, None), F.linear(x, w, None))


def test_bf16() -> None:
    w, b = _weights(True, torch.bfloat16)
    for rows in (1, 5, 70):
        x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(4)).bfloat16()
        with torch.no_grad():
            _close(kernels.linear(x, w, b), F.linear(x, w, b))


def test_gradients_flow_in_training() -> None:
    w, b = _weights(True)
    w.requires_grad_(True)
    b.requires_grad_(True)
    x = torch.randn(3, IN, generator=torch.Generator().manual_seed(4), requires_grad=True)
    y = kernels.linear(x, w, b)
    assert y.grad_fn is not None
    assert torch.equal(y, F.linear(x, w, b)), "training calls are F.linear itself"
    y.square().sum().backward()
    grads = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    F.linear(x, w, b).square().sum().backward()
    for got, t in zip(grads, (x, w, b), strict=True):
        torch.testing.assert_close(got, t.grad)
    assert not kernels.choices(), "nothing measured for autograd calls"


def test_flop_counter_sees_aten_linear() -> None:
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    registry = dict(flop_registry)
    model = _model()
    x = torch.randn(4, 7, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), FlopCounterMode(display=False) as plain:
        model(x)
    assert kernels.accelerate(model) == 3
    with torch.no_grad():
        model(x)  # measured and cached outside the counter
        with FlopCounterMode(display=False) as fast:
            model(x)
    assert plain.get_total_flops() == fast.get_total_flops() == 2 * 28 * (32 * 64 + 64 * 32 + 32 * 16)
    assert dict(flop_registry) == registry, "specc registers no flop formulas"


def test_import_and_measuring_leave_global_state_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.flop_counter import flop_registry

    rng, registry = torch.get_rng_state(), dict(flop_registry)
    names = [n for n in sys.modules if n.startswith("specc.backends.torch.accel.kernels")]
    package = sys.modules["specc.backends.torch.accel"]
    for name in names:  # both restored after the test
        monkeypatch.delitem(sys.modules, name)
        monkeypatch.setattr(package, name.rsplit(".", 1)[1], getattr(package, name.rsplit(".", 1)[1]))
    fresh = importlib.import_module("specc.backends.torch.accel.kernels")  # a fresh import of the package's code
    assert fresh is not kernels
    assert not fresh.choices() and not sys.modules["specc.backends.torch.accel.kernels_candidates"].onednn_ok
    assert torch.equal(torch.get_rng_state(), rng), "import probes nothing"
    w, b = _weights(True)
    with torch.no_grad():
        for rows in (1, 5, 40, 100):
            fresh.linear(torch.ones(rows, IN), w, b)
    assert len(fresh.choices()) == 4
    assert torch.equal(torch.get_rng_state(), rng), "measuring draws from no global generator"
    assert dict(flop_registry) == registry
    assert torch._C._len_torch_dispatch_stack() == 0 and not torch._C._is_torch_function_mode_enabled()


def test_env_var_forces_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ENV, "torch")
    monkeypatch.setitem(kernels.CANDIDATES, "onednn", None)  # would fail if called
    monkeypatch.setitem(kernels.CANDIDATES, "split", None)
    w, b = _weights(True)
    with torch.no_grad():
        for rows in (1, 2, 100):
            x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(4))
            for _ in range(2):
                assert torch.equal(kernels.linear(x, w, b), F.linear(x, w, b))
    assert [c.kernel for c in kernels.choices().values()] == ["torch"] * 3
    assert not any(c.seconds for c in kernels.choices().values()), "nothing measured"
    assert not kernels_candidates.onednn_ok, "nothing probed"


def test_noisy_measurements_are_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    w, b = _weights(True)
    x = torch.randn(3, IN, generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(kernels_dispatch, "_AGAIN", 3)  # measure again at calls 3, 9, 27 (not 10, 100, 1000)

    def measurements(calls: int) -> list[int]:
        kernels.reset()
        counts = []
        with torch.no_grad():
            for _ in range(calls):
                y = kernels.linear(x, w, b)
                (choice,) = kernels.choices().values()
                counts.append(choice.measurements)
        _close(y, F.linear(x, w, b))
        return counts

    monkeypatch.setattr(kernels_measure, "_NOISE", 1e9)  # quiet: one measurement
    monkeypatch.setattr(kernels_measure, "preemptions", lambda: 0)
    assert set(measurements(12)) == {1}
    monkeypatch.setattr(kernels_measure, "_NOISE", -1.0)  # every measurement noisy
    counts = measurements(40)
    assert [counts.index(n) for n in (1, 2, 3, 4)] == [0, 3, 9, 27]
    assert counts[-1] == kernels_dispatch._MEASUREMENTS == 4, "at most four measurements"
    monkeypatch.setattr(kernels_measure, "_NOISE", 1e9)
    switches = iter(range(0, 10**6, 10))  # preempted 10 times during every measurement: noisy
    monkeypatch.setattr(kernels_measure, "preemptions", lambda: next(switches))
    assert measurements(4)[-1] == 2


class Clock:
    """A virtual ``time`` for the measurement: candidates made by ``costing`` advance it by their cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def costing(self, fn, seconds: float):
        def kernel(x, w, b):
            self.now += seconds
            return fn(x, w, b)

        return kernel


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(kernels_measure, "time", clock)
    monkeypatch.setattr(kernels_measure, "preemptions", lambda: 0)
    return clock


@pytest.mark.parametrize(
    ("rows", "costs", "expect"),
    [
        (2, {"torch": 1.0, "onednn": 0.5, "split": 0.2, "native": 0.4}, "split"),
        (2, {"torch": 1.0, "onednn": 0.5, "split": 0.7, "native": 0.9}, "onednn"),
        (2, {"torch": 1.0, "onednn": 0.5, "split": 0.7, "native": 0.3}, "native"),
        (1, {"torch": 1.0, "onednn": 1.2, "split": 1.1, "native": 0.98}, "torch"),  # within the margin
        (100, {"torch": 1.0, "onednn": 0.5}, "onednn"),
        (100, {"torch": 1.0, "onednn": 0.98}, "torch"),  # within the margin: F.linear
        (100, {"torch": 0.5, "onednn": 1.0}, "torch"),
    ],
)
def test_the_fastest_candidate_is_chosen(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, rows: int, costs: dict[str, float], expect: str
) -> None:
    if not kernels_candidates.onednn_available(torch.float32):
        pytest.skip("this torch build has no working oneDNN linear")
    if rows <= kernels.FEW_ROWS and torch.get_num_threads() == 1:
        pytest.skip("the row split needs 2 threads")
    if "native" in costs and not kernels_native.available():
        pytest.skip(f"native GEMV: {kernels_native.status()}")
    for name, seconds in costs.items():
        monkeypatch.setitem(kernels.CANDIDATES, name, clock.costing(kernels.CANDIDATES[name], seconds * 1e-3))
    w, b = _weights(True)
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _close(kernels.linear(x, w, b), F.linear(x, w, b))
    (choice,) = kernels.choices().values()
    assert choice.kernel == expect, choice
    assert choice.measured == (rows, OUT, IN) and choice.measurements == 1
    assert choice.seconds == pytest.approx({k: v * 1e-3 for k, v in costs.items()})


@pytest.mark.parametrize("failure", ["missing", "raises", "disagrees", "disagrees on large inputs"])
def test_onednn_fallback(monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    real = F.linear

    def broken(x, w, b, *args):
        if failure == "raises":
            raise RuntimeError("could not create a primitive descriptor")
        if failure == "disagrees" or x.numel() > 1000:
            return real(x, w, b) + 1
        return real(x, w, b)

    if failure == "missing":
        monkeypatch.setattr(torch.ops, "mkldnn", types.SimpleNamespace())
    else:
        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", broken)
    # The other kernels are slow (on a virtual clock): oneDNN would win any measurement it took part in.
    clock = Clock()
    monkeypatch.setattr(kernels_measure, "time", clock)
    monkeypatch.setitem(kernels.CANDIDATES, "torch", clock.costing(kernels_candidates._torch, 1.0))
    monkeypatch.setitem(kernels.CANDIDATES, "split", clock.costing(kernels_candidates._split, 1.0))
    w, b = _weights(True)
    x = torch.randn(100, IN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _close(kernels.linear(x, w, b), F.linear(x, w, b))
    assert [c.kernel for c in kernels.choices().values()] == ["torch"]
    assert kernels_candidates.onednn_ok[torch.float32] is (failure == "disagrees on large inputs")


def test_special_contexts_get_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(kernels.CANDIDATES, "onednn", None)  # would fail if chosen
    monkeypatch.setitem(kernels.CANDIDATES, "split", None)
    w, b = _weights(True)
    x = torch.randn(3, IN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        with torch.device("cpu"):  # a torch-function mode
            assert torch.equal(kernels.linear(x, w, b), F.linear(x, w, b))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = kernels.linear(x, w, b)
            assert y.dtype == torch.bfloat16 and torch.equal(y, F.linear(x, w, b))
        x64, w64, b64 = x.double(), w.double(), b.double()
        assert torch.equal(kernels.linear(x64, w64, b64), F.linear(x64, w64, b64))
        assert kernels.linear(x[:0], w, b).shape == (0, OUT)
    assert torch.func.vmap(lambda r: kernels.linear(r, w, b))(x).shape == (3, OUT)
    assert not kernels.choices()


def test_accelerate_and_restore() -> None:
    class Sub(nn.Linear):
        pass

    model = _model()
    model.append(Sub(16, 4))
    keys = list(model.state_dict())
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(x)
        assert kernels.accelerate(model) == 3, "exact nn.Linear only"
        assert kernels.accelerate(model) == 3, "idempotent"
        assert all(type(m) is nn.Linear for m in model[:5:2])
        assert list(model.state_dict()) == keys
        assert isinstance(model[0].forward, kernels.FastForward) and "forward" not in model[5].__dict__
        _close(model(x), ref)
        assert kernels.restore(model) == 3
        assert not any("forward" in m.__dict__ for m in model.modules())
        assert torch.equal(model(x), ref)


def test_accelerated_model_deepcopies_pickles_and_hooks() -> None:
    model = _model()
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(x)
    kernels.accelerate(model)
    twin = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for m in (twin, loaded):
        assert isinstance(m[0].forward, kernels.FastForward) and m[0].forward.module is m[0]
        with torch.no_grad():
            _close(m(x), ref)
    seen = []
    handle = model[2].register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    pre = model[2].register_forward_pre_hook(lambda mod, args: (args[0] * 0,))
    with torch.no_grad():
        model(x)
    handle.remove()
    pre.remove()
    assert seen == [torch.Size([5, 32])]


def test_accelerated_model_compiles_and_traces() -> None:
    model = _model()
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(x)
    kernels.accelerate(model)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        with torch.no_grad():
            _close(compiled(x), ref)
        _close(compiled(x).detach(), ref)  # grad enabled: another graph, also F.linear
    finally:
        torch._dynamo.reset()
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            traced = torch.jit.trace(model, x)
            _close(traced(x * 2), model(x * 2))
        assert "mkldnn" not in str(traced.inlined_graph)
    exported = torch.export.export(model, (x,))
    assert "mkldnn" not in exported.graph_module.code
    _close(exported.module()(x).detach(), ref)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")  # torch.ao's deprecation notices
def test_quantize_dynamic_replaces_every_linear() -> None:
    model = _model()
    kernels.accelerate(model)
    quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    assert not any(type(m) is nn.Linear for m in quantized.modules())
    assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in quantized.modules()) == 3
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert quantized(x).shape == (5, 16)
