"""A built wheel works outside the checkout: presets and device profiles are package data.

The wheel is built from a copy of the sources (the checkout stays clean), installed without dependencies into a
fresh virtual environment that sees this environment's packages (torch, onnx, ...) but not the checkout, and
run from an unrelated folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "specc", src / "specc", symlinks=False, ignore=ignore)  # presets: the files themselves
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECC_PRESETS", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    dist = base / "dist"
    py = sys.executable
    _run([py, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(dist), "-q"], base, env)
    wheels = list(dist.glob("specc-*.whl"))
    assert len(wheels) == 1
    venv = base / "venv"
    _run([py, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], base, env)
    vpy = venv / "bin" / "python"
    # --system-site-packages sees the base interpreter's packages; this environment's (torch, onnx, ...) come in
    # through a .pth file, after the venv's own site-packages, so the installed specc is the one imported
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(subprocess.check_output([str(vpy), "-c", where], text=True, env=env).strip())
    (purelib / "outer-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([py, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "--no-index", "-q", str(wheels[0])], base, env)
    work = base / "elsewhere"
    work.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return work, env, wheels[0]


def test_wheel_holds_presets_and_device_profiles(installed: tuple[Path, dict[str, str], Path]) -> None:
    import zipfile

    names = set(zipfile.ZipFile(installed[2]).namelist())
    presets = {p.name for p in (ROOT / "specs").glob("*.yaml")}
    assert presets and {f"specc/presets/{n}" for n in presets} <= names
    assert "specc/presets/devices/rtx4090.yaml" in names
    assert not any(n.startswith(("tests/", "specs/")) for n in names)


def test_installed_wheel_runs_from_an_unrelated_folder(installed: tuple[Path, dict[str, str], Path]) -> None:
    work, env, _ = installed
    specc = shutil.which("specc", path=env["PATH"])
    assert specc is not None and Path(specc).parent.parent.name == "venv"
    where = _run([str(Path(specc).parent / "python"), "-c", "import specc; print(specc.__file__)"], work, env)
    assert "site-packages" in where.stdout and str(ROOT) not in where.stdout
    presets = _run([specc, "presets"], work, env).stdout
    for name in ("gpt2", "llama2-7b", "mixtral-8x7b", "vit-b16", "gru-bahdanau", "transformer-base"):
        assert name in presets
    analyzed = _run([specc, "analyze", "gpt2"], work, env).stdout
    assert "124,439,808" in analyzed
    roofline = _run([specc, "analyze", "gpt2", "--device", "rtx4090", "--format", "json"], work, env).stdout
    assert "RTX 4090" in roofline  # a packaged device profile, by name
    out = _run([specc, "compile", "gpt2", "--target", "torch", "-o", "x.safetensors", "--set", "blocks=1"], work, env)
    assert "wrote x.safetensors" in out.stdout and (work / "x.safetensors").is_file()
    child = work / "mine.yaml"
    child.write_text("extends: gpt2\nname: mine\nblocks: 2\n", encoding="utf-8")  # extends a packaged preset
    assert "mine" in _run([specc, "validate", str(child)], work, env).stdout


def test_specc_presets_adds_folders(installed: tuple[Path, dict[str, str], Path], tmp_path: Path) -> None:
    work, env, _ = installed
    extra = tmp_path / "more"
    (extra / "devices").mkdir(parents=True)
    (extra / "tiny-lm.yaml").write_text(
        "name: tiny-lm\nkind: decoder\nvocab_size: 64\ncontext: 32\nd_model: 16\nblocks: 1\nattention: {heads: 2}\n",
        encoding="utf-8",
    )
    (extra / "devices" / "toy.yaml").write_text(
        "name: toy\npeak_flops: {fp32: 1e12}\nbandwidth: 1e11\nmemory: 1e9\n", encoding="utf-8"
    )
    env = {**env, "SPECC_PRESETS": str(extra)}
    specc = shutil.which("specc", path=env["PATH"])
    assert specc is not None
    presets = _run([specc, "presets"], work, env).stdout
    assert "tiny-lm" in presets and "gpt2" in presets  # added, not replacing the packaged ones
    assert "toy" in _run([specc, "analyze", "tiny-lm", "--device", "toy"], work, env).stdout
