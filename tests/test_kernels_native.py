"""specc's native GEMV (kernels_native): equal to F.linear, built once per machine and cached, and every way it
can be missing (no compiler, a failing compiler, a damaged cache file, SPECC_NATIVE=0) leaves the other kernels
in charge."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specc.backends.torch.accel import kernels, kernels_native

BUILDS_HERE = sys.platform.startswith("linux") and shutil.which("c++") is not None


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(kernels.ENV, raising=False)
    monkeypatch.delenv(kernels_native.ENV, raising=False)
    kernels.reset()
    kernels_native.reset()
    yield
    kernels.reset()
    kernels_native.reset()  # the next user loads the real cache again


@pytest.fixture
def own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SPECC_CACHE", str(tmp_path))
    return tmp_path / "kernels"


def _need_native() -> None:
    if not kernels_native.available():
        pytest.skip(f"native GEMV: {kernels_native.status()}")


def test_it_builds_where_a_compiler_is() -> None:
    if not BUILDS_HERE:
        pytest.skip("no Linux C++ compiler here")
    assert kernels_native.available(), kernels_native.status()
    assert kernels_native.status().startswith("ready: ")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13])
@pytest.mark.parametrize(("n_in", "n_out"), [(1, 1), (15, 7), (16, 64), (17, 65), (100, 3), (64, 1027)])
def test_equals_f_linear(rows: int, n_in: int, n_out: int, threads: int) -> None:
    _need_native()
    g = torch.Generator().manual_seed(rows * 1000 + n_in)
    x, w = torch.randn(rows, n_in, generator=g), torch.randn(n_out, n_in, generator=g)
    b = torch.randn(n_out, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for bias in (b, None):
            torch.testing.assert_close(kernels_native.native_linear(x, w, bias), F.linear(x, w, bias))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
@pytest.mark.parametrize(("n_in", "n_out"), [(17, 65), (768, 130)])
def test_bf16_weights(rows: int, n_in: int, n_out: int) -> None:
    _need_native()
    g = torch.Generator().manual_seed(rows + n_in)
    x, w = torch.randn(rows, n_in, generator=g).bfloat16(), torch.randn(n_out, n_in, generator=g).bfloat16()
    b = torch.randn(n_out, generator=g).bfloat16()
    for bias in (b, None):
        y = kernels_native.native_linear(x, w, bias)
        exact = F.linear(x.double(), w.double(), None if bias is None else bias.double())
        assert y.dtype == torch.bfloat16 and y.shape == exact.shape
        # one rounding to bf16 of an fp32 sum: within a bf16 ulp of the exact result
        torch.testing.assert_close(y.double(), exact, rtol=2**-7, atol=1e-3 * n_in**0.5)
    with torch.no_grad():
        assert kernels.linear(x, w, b).dtype == torch.bfloat16
    (choice,) = kernels.choices().values()
    assert "native" in choice.seconds, "bf16 GEMVs time it too"


def test_shapes_and_strides() -> None:
    _need_native()
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(33, 48, generator=g), torch.randn(33, generator=g)
    x = torch.randn(48, 2, 3, generator=g).permute(1, 2, 0)  # [2, 3, 48], not contiguous
    torch.testing.assert_close(kernels_native.native_linear(x, w, b), F.linear(x, w, b))
    wt = torch.randn(48, 33, generator=g).t()  # a transposed view: made contiguous first
    torch.testing.assert_close(kernels_native.native_linear(x[0, 0], wt, None), F.linear(x[0, 0], wt))


def test_gemvs_time_it_gemms_do_not() -> None:
    _need_native()
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(512, 256, generator=g), torch.randn(512, generator=g)
    with torch.no_grad():
        for rows in (1, 100):
            x = torch.randn(rows, 256, generator=g)
            torch.testing.assert_close(kernels.linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    timed = {key[1]: set(c.seconds) for key, c in kernels.choices().items()}
    assert "native" in timed[1], "a GEMV times the native kernel"
    assert "native" not in timed[512], "a GEMM (100 rows: bucket 512) does not"


def test_built_once_and_cached(own_cache: Path) -> None:
    if not BUILDS_HERE:
        pytest.skip("no Linux C++ compiler here")
    assert kernels_native.available(), kernels_native.status()
    (lib,) = own_cache.glob("gemv-*.so")
    stamp = lib.stat().st_mtime_ns
    kernels_native.reset()
    assert kernels_native.available() and lib.stat().st_mtime_ns == stamp, "loaded from the cache, not rebuilt"
    assert not list(own_cache.glob("*.tmp")), "no temporary file is left"


def test_a_damaged_cache_file_is_rebuilt(own_cache: Path) -> None:
    if not BUILDS_HERE:
        pytest.skip("no Linux C++ compiler here")
    lib, _ = kernels_native.target(kernels_native._torch_openmp())
    assert lib.parent == own_cache
    own_cache.mkdir(parents=True)
    lib.write_bytes(b"not a shared library")  # as a crash in the middle of some other writer might leave it
    assert kernels_native.available(), kernels_native.status()
    assert lib.read_bytes()[:4] == b"\x7fELF"
    x, w = torch.ones(1, 40), torch.ones(8, 40)
    torch.testing.assert_close(kernels_native.native_linear(x, w, None), F.linear(x, w))


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"CXX": "/nonexistent/c++"}, "no C++ compiler"),
        ({"CXX": "c++ -fno-such-option-anywhere"}, "failed"),
        ({kernels_native.ENV: "0"}, "SPECC_NATIVE=0"),
    ],
    ids=["no-compiler", "compiler-fails", "turned-off"],
)
def test_missing_native_leaves_the_others(
    monkeypatch: pytest.MonkeyPatch, own_cache: Path, setting: dict[str, str], reason: str
) -> None:
    if "fno-such" in setting.get("CXX", "") and not BUILDS_HERE:
        pytest.skip("no Linux C++ compiler here")
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    assert not kernels_native.available()
    assert kernels_native.status().startswith("unavailable: ") and reason in kernels_native.status()
    assert not own_cache.exists() or not any(own_cache.iterdir()), "nothing half-written"
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(64, 32, generator=g), torch.randn(64, generator=g)
    x = torch.randn(1, 32, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(kernels.linear(x, w, b), F.linear(x, w, b))
    (choice,) = kernels.choices().values()
    assert "native" not in choice.seconds and choice.kernel != "native"
    with pytest.raises(RuntimeError, match="fp32/bf16-only and must be available"):
        kernels_native.native_linear(x, w, b)
