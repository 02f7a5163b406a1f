"""specc's code cache cannot be planted or damaged into running code (``specc.cache``, issue 23).

One root (``SPECC_CACHE``) for generated source and the native library, private and checked before use; the
generated source executed from bytes whose hash is its name (no package folder, no ``.pyc``); the native library
loaded only where its bytes match the hash recorded when specc built it; damaged entries (not UTF-8, truncated,
FIFOs, folders) rebuilt without hanging; ``SPECC_KERNELS=torch`` loads no native code; compiled decoding caches in
specc's private folder. Each run that loads planted or damaged entries runs in a fresh process (a planted module
or library would otherwise be cached, a truncated library can kill the process, a FIFO can hang it)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from specc import cache

ROOT = Path(__file__).resolve().parents[1]
BUILDS_HERE = sys.platform.startswith("linux") and shutil.which("c++") is not None
FOREIGN_UID = 54321  # no such user here: a folder of "someone else"
TINY = '["blocks=1", "d_model=16", "attention.heads=2", "mlp.hidden=32", "vocab_size=40", "context=16"]'
BUILD = f"import specc, torch\nmodel = specc.build_torch(specc.load_spec('gpt2', {TINY}))\n"
SAVE = BUILD + "torch.save(model, 'm.pt')\n"
LOAD = "import torch\nm = torch.load('m.pt', weights_only=False)\nprint(m(torch.tensor([[1, 2, 3]])).shape)\n"
NATIVE = "import torch\nfrom specc.backends.torch.accel import kernels_native\nprint(kernels_native.status())\n"
MARK = "planted code ran"


def _env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPECC_KERNELS", "SPECC_NATIVE", "XDG_CACHE_HOME")}
    return {**env, "SPECC_CACHE": str(root), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def _run(code: str, root: Path, cwd: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh process on the cache ``root`` (a hang fails the test at ``timeout``)."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=_env(root, **extra), capture_output=True, text=True, timeout=timeout
    )


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    return done.stdout


def _payload(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write({MARK!r})\n"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache filled by one fresh process: the generated source of the tiny model (and ``m.pt``, the model
    pickled beside the root), and the native library where it builds here."""
    where = tmp_path_factory.mktemp("pristine")
    _ok(_run(SAVE + NATIVE, where / "cache", where))
    return where


@pytest.fixture
def filled(pristine: Path, tmp_path: Path) -> Path:
    """This test's own copy of the pristine cache root (``tmp_path/cache``, ``tmp_path/m.pt``)."""
    shutil.copytree(pristine / "cache", tmp_path / "cache", symlinks=True)
    shutil.copy2(pristine / "m.pt", tmp_path / "m.pt")
    return tmp_path / "cache"


def _source_entry(root: Path) -> Path:
    (entry,) = (root / "generated").glob("m_*.py")
    return entry


# ============================================================================================ generated source


def test_one_root_holds_both_caches_private_and_without_bytecode(pristine: Path) -> None:
    root = pristine / "cache"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    entry = _source_entry(root)
    assert entry.read_bytes().decode().count("class ") >= 2
    assert not (root / "generated" / "__pycache__").exists(), "no bytecode file is written"
    if BUILDS_HERE:  # the native library lands under the same root, with its recorded hash
        (lib,) = (root / "kernels").glob("gemv-*.so")
        assert (root / "kernels" / (lib.name + ".sha256")).read_text().split()[0] == cache.digest(lib.read_bytes())
    assert not list(root.rglob("*.tmp")), "no temporary file is left"


def test_xdg_cache_home_is_the_root_when_specc_cache_is_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECC_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.root() == tmp_path / "xdg" / "specc"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored, as the XDG spec says
    assert cache.root() == Path.home() / ".cache" / "specc"


def test_a_planted_package_folder_never_runs(tmp_path: Path, filled: Path) -> None:
    root, marker = filled, tmp_path / "marker"
    package = _source_entry(root).with_suffix("")  # generated/m_<hash>/__init__.py beside m_<hash>.py
    package.mkdir()
    (package / "__init__.py").write_text(_payload(marker))
    assert "torch.Size([1, 3, 40])" in _ok(_run(LOAD + BUILD, root, tmp_path))  # unpickling, then building
    assert not marker.exists(), "a planted package folder ran"


def test_a_planted_pyc_never_runs(tmp_path: Path, filled: Path) -> None:
    root, marker = filled, tmp_path / "marker"
    entry = _source_entry(root)
    st = entry.stat()  # a .pyc whose header matches the source's mtime and size: what the import system trusts
    code = compile(_payload(marker), str(entry), "exec")
    pyc = Path(importlib.util.cache_from_source(str(entry)))
    pyc.parent.mkdir(exist_ok=True)
    from importlib._bootstrap_external import _code_to_timestamp_pyc  # type: ignore[attr-defined]

    pyc.write_bytes(_code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size))
    assert "torch.Size([1, 3, 40])" in _ok(_run(LOAD + BUILD, root, tmp_path))
    assert not marker.exists(), "a planted .pyc ran"


def test_a_source_entry_that_is_not_utf8_is_rewritten(tmp_path: Path, filled: Path) -> None:
    root = filled
    entry = _source_entry(root)
    good = entry.read_bytes()
    entry.write_bytes(b"\xff\xfe\x00 not source" + good[:50])
    _ok(_run(BUILD, root, tmp_path))
    assert entry.read_bytes() == good


@pytest.mark.parametrize("damage", ["fifo", "corrupt"])
def test_a_damaged_bytecode_file_is_never_read(tmp_path: Path, filled: Path, damage: str) -> None:
    entry = _source_entry(filled)
    pyc = Path(importlib.util.cache_from_source(str(entry)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.unlink(missing_ok=True)
    if damage == "fifo":
        os.mkfifo(pyc)
    else:  # the header the import system trusts (the source's mtime and size), then garbage
        from importlib._bootstrap_external import _pack_uint32  # type: ignore[attr-defined]

        st = entry.stat()
        header = importlib.util.MAGIC_NUMBER + _pack_uint32(0) + _pack_uint32(int(st.st_mtime))
        pyc.write_bytes(header + _pack_uint32(st.st_size) + b"\xe3" + b"\xff" * 64)
    assert "torch.Size([1, 3, 40])" in _ok(_run(LOAD, filled, tmp_path, timeout=90))  # a hang: TimeoutExpired


@pytest.mark.parametrize("kind", ["fifo", "folder", "symlink", "device"])
def test_a_special_file_in_a_source_entrys_place_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from specc import _generated

    monkeypatch.setenv("SPECC_CACHE", str(tmp_path / "cache"))
    text = f"value = {kind!r}\n# {tmp_path}\n"  # a source of its own: not in sys.modules yet
    data = text.encode()
    entry = tmp_path / "cache" / "generated" / f"m_{cache.digest(data)[: _generated.DIGITS]}.py"
    entry.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "folder":
        entry.mkdir()
        (entry / "__init__.py").write_text("value = 'planted'\n")
    elif kind == "symlink":  # a link to the very same bytes: still not followed
        (tmp_path / "elsewhere.py").write_bytes(data)
        entry.symlink_to(tmp_path / "elsewhere.py")
    elif os.geteuid() == 0:
        os.mknod(entry, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's device, under the entry's name
    else:
        pytest.skip("making a device node takes root")
    module = _generated.load(text)
    assert module.value == kind
    assert stat.S_ISREG(os.lstat(entry).st_mode) and entry.read_bytes() == data, "the entry is written anew"


def test_a_full_disk_leaves_no_temporary_file(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    code = (
        "import resource, signal, specc, torch\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, as on a full disk\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
        f"model = specc.build_torch(specc.load_spec('gpt2', {TINY}))\n"
        "print(model(torch.tensor([[1, 2]])).shape)\n"
    )
    assert "torch.Size([1, 2, 40])" in _ok(_run(code, root, tmp_path, SPECC_NATIVE="0"))
    assert not list(root.rglob("*.tmp")) and not list(root.rglob(".m_*"))
    assert not list((root / "generated").glob("m_*.py")), "nothing half-written under the entry's name"


# ================================================================================================ cache folders


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user takes root")
@pytest.mark.parametrize("where", ["root", "subfolders"])
def test_a_cache_folder_of_another_user_is_not_used(tmp_path: Path, where: str) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    folders = [root] if where == "root" else [root / "generated", root / "kernels"]
    for folder in folders:
        folder.mkdir(exist_ok=True)
        os.chown(folder, FOREIGN_UID, FOREIGN_UID)
    done = _run(BUILD + "print(model(torch.tensor([[1, 2]])).shape)\n" + NATIVE, root, tmp_path)
    out = _ok(done)
    assert "torch.Size([1, 2, 40])" in out, "the model runs from memory"
    assert out.strip().splitlines()[-1].startswith("unavailable: "), "no native library is loaded"
    warnings = [line for line in done.stderr.splitlines() if "cache folder" in line]
    assert len(warnings) == len(folders), done.stderr  # one line per folder
    assert all(line.startswith("warning: ") and "owned by uid 54321" in line for line in warnings)
    assert not [p for p in root.rglob("*") if p not in folders], "nothing is written there"


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "symlink", "a file"])
def test_a_cache_root_that_is_not_private_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    root = tmp_path / "cache"
    if how == "symlink":  # to a private folder, even: the root itself must be a folder
        (tmp_path / "real").mkdir(mode=0o700)
        root.symlink_to(tmp_path / "real")
    elif how == "a file":
        root.write_text("")
    else:
        root.mkdir(mode=0o700)
        root.chmod(0o770 if how == "group-writable" else 0o777)
    monkeypatch.setenv("SPECC_CACHE", str(root))
    assert cache.folder("generated") is None and cache.folder("kernels") is None
    (line,) = capsys.readouterr().err.splitlines()  # one warning line, once
    assert line.startswith(f"warning: specc's cache folder {root} ") and "not used" in line
    assert not (tmp_path / "real").exists() or not any((tmp_path / "real").iterdir())
    if root.is_dir() and not root.is_symlink():
        assert not any(root.iterdir())


needs_compiler = pytest.mark.skipif(not BUILDS_HERE, reason="no Linux C++ compiler here")


def _library(root: Path) -> Path:
    (lib,) = (root / "kernels").glob("gemv-*.so")
    return lib


@needs_compiler
def test_a_planted_library_with_the_right_name_is_never_loaded(tmp_path: Path, filled: Path) -> None:
    root, marker = filled, tmp_path / "marker"
    lib = _library(root)
    good = lib.read_bytes()
    c = tmp_path / "planted.c"
    c.write_text(
        "#include <stdio.h>\n"
        f'__attribute__((constructor)) static void run(void) {{ FILE *f = fopen("{marker}", "w"); '
        f'fputs("{MARK}", f); fclose(f); }}\n'
        "int specc_gemv_version(void) { return 3; }\n"
    )
    planted = tmp_path / "planted.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(c), "-o", str(planted)], check=True, timeout=60)
    shutil.copyfile(planted, lib)  # the name anyone can compute
    assert _ok(_run(NATIVE, root, tmp_path)).startswith("ready: ")
    assert not marker.exists(), "the planted library's initialiser ran"
    assert lib.read_bytes() == good, "the library is rebuilt in its place"


@needs_compiler
@pytest.mark.parametrize("damage", ["truncated", "fifo", "symlink"])
def test_a_damaged_library_is_rebuilt_without_crashing_or_hanging(tmp_path: Path, filled: Path, damage: str) -> None:
    root = filled
    lib = _library(root)
    good = lib.read_bytes()
    if damage == "truncated":  # the headers intact, the segments cut off: mapping it would SIGBUS
        lib.write_bytes(good[: len(good) // 2])
    else:
        lib.unlink()
        if damage == "fifo":
            os.mkfifo(lib)
        else:
            (tmp_path / "other.so").write_bytes(good)
            lib.symlink_to(tmp_path / "other.so")
    assert _ok(_run(NATIVE, root, tmp_path, timeout=90)).startswith("ready: ")
    assert stat.S_ISREG(os.lstat(lib).st_mode) and lib.read_bytes() == good


@needs_compiler
def test_specc_kernels_torch_loads_no_native_code(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    code = (
        BUILD + "ids = torch.tensor([[1, 2, 3]])\n"
        "with torch.no_grad(): model.generate(ids, 4); model(ids)\n"
        "print(open('/proc/self/maps').read().count('gemv-'))\n" + NATIVE
    )
    lines = _ok(_run(code, root, tmp_path, SPECC_KERNELS="torch")).strip().splitlines()
    assert lines[-2] == "0", "the native library is mapped"
    assert lines[-1] == "unavailable: SPECC_KERNELS=torch"
    assert not list(root.rglob("*.so")), "nor built"


# ================================================================================================ torch.compile


@pytest.mark.parametrize("preset", ["foreign", "torch-default"])
def test_compiled_decoding_uses_a_private_inductor_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any, preset: str
) -> None:
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    seen: list[str] = []

    def compile_(fn: Any, **options: Any) -> Any:  # what inductor would use, at the time it would compile
        seen.append(cache_dir())
        return fn

    monkeypatch.setattr(torch, "compile", compile_)
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECC_CACHE", str(root))
    if preset == "foreign":  # as another user could create /tmp/torchinductor_$USER first
        shared = tmp_path / "torchinductor_shared"
        shared.mkdir()
        os.chown(shared, FOREIGN_UID, FOREIGN_UID) if os.geteuid() == 0 else shared.chmod(0o777)
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    else:  # what importing torch._dynamo leaves in the environment
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))
    tiny = ["--set", "blocks=1", "--set", "d_model=16", "--set", "attention.heads=2", "--set", "vocab_size=50"]
    code, _, err = cli("generate", "gpt2", *tiny, "-p", "1 2 3", "-n", "3", "--compile")
    assert code == 0, err
    assert seen == [str(root / "inductor")]
    assert stat.S_IMODE((root / "inductor").stat().st_mode) == 0o700
