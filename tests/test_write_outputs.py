"""The writing layer (specc/io/): outputs never replace a non-regular file or an input, modes are kept,
writability is checked before long work, failures name the target, stale temporary files are cleaned."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specc import io as sio
from specc.errors import SpecError

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "blocks=1", "--set", "d_model=16", "--set", "attention.heads=2", "--set", "vocab_size=50",
        "--set", "context=16", "--set", "mlp.hidden=32"]  # fmt: skip
GPT2_YAML = (ROOT / "specs" / "gpt2.yaml").read_text(encoding="utf-8")


def one_line_error(result: tuple[int, str, str], *needles: str) -> str:
    code, out, err = result
    assert code == 2, (out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("  hint:")]
    assert len(lines) == 1 and "error:" in lines[0], err
    assert all(n in lines[0] for n in needles), err
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".tmp"))


# ---------------------------------------------------------------------------------------------- non-regular


@pytest.fixture
def char_device(tmp_path: Path) -> Path:
    """A /dev/null twin (character device 1:3) in tmp_path: never the real /dev/null, in case of a bug."""
    node = tmp_path / "null"
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as e:
        pytest.skip(f"mknod not permitted here: {e}")
    return node


def test_a_character_device_is_refused_and_kept(cli, char_device: Path) -> None:
    for args in (["compile", "gpt2", *TINY, "-o", char_device],
                 ["compile", "gpt2", *TINY, "--target", "onnx", "-o", char_device],
                 ["analyze", "gpt2", *TINY, "-o", char_device]):  # fmt: skip
        line = one_line_error(cli(*args), str(char_device), "character device")
        assert "never replaces" in line
        assert stat.S_ISCHR(os.lstat(char_device).st_mode)
    assert leftovers(char_device.parent) == []


def test_a_fifo_is_refused_without_hanging(cli, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    one_line_error(cli("compile", "gpt2", *TINY, "-o", fifo), "FIFO")
    one_line_error(cli("analyze", "gpt2", *TINY, "--format", "json", "-o", fifo), "FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_directory_is_refused(cli, tmp_path: Path) -> None:
    one_line_error(cli("compile", "gpt2", *TINY, "-o", tmp_path), "is a directory")
    one_line_error(cli("compile", "gpt2", *TINY, "-o", "."), "not a file name")


def test_a_symlink_to_a_file_writes_through_and_stays_a_link(cli, tmp_path: Path) -> None:
    real = tmp_path / "real.py"
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.py"
    link.symlink_to(real.name)
    assert cli("compile", "gpt2", *TINY, "--target", "python", "-o", link)[0] == 0
    assert link.is_symlink() and "class" in real.read_text()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640


def test_dangling_and_special_symlinks_are_refused(cli, tmp_path: Path) -> None:
    dangling = tmp_path / "dangling.py"
    dangling.symlink_to(tmp_path / "nowhere.py")
    one_line_error(cli("compile", "gpt2", *TINY, "--target", "python", "-o", dangling), "does not exist")
    assert dangling.is_symlink() and not (tmp_path / "nowhere.py").exists()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    to_fifo = tmp_path / "to_fifo"
    to_fifo.symlink_to(fifo)
    one_line_error(cli("compile", "gpt2", *TINY, "-o", to_fifo), "FIFO")
    assert to_fifo.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_unwritable_places_are_refused_before_any_work(cli, tmp_path: Path) -> None:
    one_line_error(cli("compile", "gpt2", *TINY, "-o", "/proc/specc-x.safetensors"), "cannot write in /proc")
    one_line_error(cli("compile", "gpt2", *TINY, "-o", tmp_path / "no" / "x.safetensors"), "does not exist")
    one_line_error(cli("compile", "gpt2", *TINY, "-o", tmp_path / "gpt2.yaml" / "x"), "does not exist")


def test_read_only_folder_as_a_normal_user(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders (the /proc case covers refusals as root)")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(SpecError, match="cannot write in"):
            sio.output_target(ro / "x.safetensors")
    finally:
        ro.chmod(0o755)


# ---------------------------------------------------------------------------------------------- inputs


def test_output_equal_to_the_spec_is_refused(cli, tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(GPT2_YAML, encoding="utf-8")
    svg = tmp_path / "spec.svg"  # a spec file that --plot would accept as an image name
    svg.write_text(GPT2_YAML, encoding="utf-8")
    one_line_error(cli("analyze", svg, "--sweep", "seq=8,16", "--plot", svg), "is also the spec")
    assert svg.read_text(encoding="utf-8") == GPT2_YAML
    for args in (["analyze", spec, "-o", spec],
                 ["compile", spec, *TINY, "--target", "python", "-o", spec],
                 ["compile", spec, *TINY, "--target", "onnx", "-o", spec],
                 ["compare", spec, "gpt2", "-o", spec]):  # fmt: skip
        one_line_error(cli(*args), "is also the spec", str(spec))
        assert spec.read_text(encoding="utf-8") == GPT2_YAML
    hard = tmp_path / "hard.yaml"
    os.link(spec, hard)  # another name of the same file
    one_line_error(cli("analyze", spec, "-o", hard), "is also the spec")
    link = tmp_path / "link.yaml"
    link.symlink_to(spec)
    one_line_error(cli("analyze", spec, "-o", link), "is also the spec")
    assert spec.read_text(encoding="utf-8") == GPT2_YAML


def test_output_equal_to_an_extended_spec_is_refused(cli, tmp_path: Path) -> None:
    parent = tmp_path / "parent.yaml"
    parent.write_text(GPT2_YAML, encoding="utf-8")
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\nname: child\nblocks: 1\n", encoding="utf-8")
    code, _, err = cli("analyze", child, "-o", parent)  # the reading layer records every file it opens
    assert code == 2 and "parent.yaml" in err and parent.read_text(encoding="utf-8") == GPT2_YAML


def test_output_equal_to_weights_or_text_is_refused(cli, tmp_path: Path) -> None:
    weights = tmp_path / "w.safetensors"
    assert cli("compile", "gpt2", *TINY, "-o", weights)[0] == 0
    before = weights.read_bytes()
    for target in ("torch", "onnx", "python"):
        one_line_error(cli("compile", "gpt2", *TINY, "--weights", weights, "--target", target, "-o", weights),
                       "is also the weights")  # fmt: skip
    assert weights.read_bytes() == before
    text = tmp_path / "t.txt"
    text.write_text("hello world " * 20, encoding="utf-8")
    one_line_error(cli("train", "gpt2", *TINY, "--task", "lm", "--text", text, "--steps", "2", "-o", text),
                   "is also the --text file")  # fmt: skip
    assert text.read_text(encoding="utf-8") == "hello world " * 20


def test_import_hf_never_overwrites_its_config(cli, tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 16, "n_layer": 1, "n_head": 2,
              "n_positions": 16, "vocab_size": 50}  # fmt: skip
    text = json.dumps(config)
    (folder / "config.json").write_text(text, encoding="utf-8")
    one_line_error(cli("import-hf", folder, "-o", folder / "config.json"), "is also the config")
    one_line_error(cli("import-hf", folder / "config.json", "-o", folder / "config.json"), "is also the config")
    assert (folder / "config.json").read_text(encoding="utf-8") == text


def test_resume_in_place_is_allowed_but_not_over_the_text(cli, tmp_path: Path) -> None:
    """``train --resume CK -o CK`` continues a checkpoint in place on purpose; -o must still not be the text."""
    text = tmp_path / "t.txt"
    text.write_text("abcabcabc " * 30, encoding="utf-8")
    ck = tmp_path / "lm.safetensors"
    lm = ["--task", "lm", "--text", text, "--max-len", "8", "--eval-size", "4", "--device", "cpu", "--threads", "1"]
    assert cli("train", "gpt2", *TINY, *lm, "--steps", "2", "-o", ck)[0] == 0
    code, _, err = cli("train", "--resume", ck, "--text", text, "--steps", "3", "-o", ck, "--device", "cpu")
    assert code == 0, err
    one_line_error(cli("train", "--resume", ck, "--text", text, "--steps", "4", "-o", text), "is also the --text")
    side = tmp_path / "lm.optim.safetensors"
    assert side.is_file()
    one_line_error(cli("train", "--resume", ck, "--steps", "4", "-o", side), "optimizer state")


# ---------------------------------------------------------------------------------------------- modes, errors


def test_an_existing_file_keeps_its_mode(cli, tmp_path: Path) -> None:
    for target, extra in ((tmp_path / "m.safetensors", []), (tmp_path / "m.py", ["--target", "python"]),
                          (tmp_path / "m.onnx", ["--target", "onnx"]), (tmp_path / "r.json", None)):  # fmt: skip
        target.write_text("old")
        os.chmod(target, 0o600)
        if extra is None:
            args = ["analyze", "gpt2", *TINY, "-f", "json", "-o", target]
        else:
            args = ["compile", "gpt2", *TINY, *extra, "-o", target]
        assert cli(*args)[0] == 0
        assert stat.S_IMODE(target.stat().st_mode) == 0o600, target
        assert target.read_bytes() != b"old"
    assert leftovers(tmp_path) == []


def test_a_new_file_gets_the_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        sio.atomic_write(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o640


def test_a_full_disk_is_a_located_error_and_replaces_nothing(tmp_path: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk: the write fails with EFBIG (SIGXFSZ ignored), in safetensors'
    Rust writer as in Python's."""
    out = tmp_path / "x.safetensors"
    out.write_bytes(b"previous")
    code = f"""
import resource, signal, sys
from specc.cli import run
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.exit(run(["compile", "gpt2", *{[str(a) for a in TINY]!r}, "-o", {str(out)!r}]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and f"{out}: error: cannot write: File too large" in proc.stderr
    assert out.read_bytes() == b"previous" and leftovers(tmp_path) == []


def test_write_errors_are_translated_only_for_writing_failures(tmp_path: Path) -> None:
    import errno

    err = sio.write_error(tmp_path / "x", OSError(errno.ENOSPC, "No space left on device"))
    assert err is not None and "No space left on device" in str(err) and str(tmp_path / "x") in str(err)
    rust = RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })')
    assert "No space left on device" in str(sio.write_error("x", rust))
    assert sio.write_error("x", ValueError("a bug")) is None  # bugs keep their traceback
    assert sio.write_error("x", OSError(errno.ENOENT, "gone")) is None

    def fail(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    target = tmp_path / "y.bin"
    target.write_bytes(b"keep")
    with pytest.raises(SpecError, match="cannot write: No space left on device"):
        sio.atomic_write(target, fail)
    assert target.read_bytes() == b"keep" and leftovers(tmp_path) == []


def test_writability_is_checked_before_training(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import specc.train as train

    def never(*a, **k):
        raise AssertionError("training started before the output was checked")

    monkeypatch.setattr(train, "new_run", never)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for bad in (fifo, tmp_path / "missing" / "ck.safetensors", Path("/proc/ck.safetensors")):
        one_line_error(cli("train", "gpt2", *TINY, "--task", "copy", "--steps", "2", "-o", bad))


def test_writability_is_checked_before_export(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import specc.backends.onnx.export as export

    def never(*a, **k):
        raise AssertionError("weights were built before the output was checked")

    monkeypatch.setattr(export, "open_weights", never)
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    one_line_error(cli("compile", "gpt2", *TINY, "--target", "onnx", "-o", fifo), "FIFO")
    with pytest.raises(SpecError, match="cannot write in /proc"):
        export.export_onnx("gpt2", "/proc/x.onnx")


# ---------------------------------------------------------------------------------------------- stale files


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temporary_files_of_our_naming_are_removed(tmp_path: Path) -> None:
    old = time.time() - 2 * sio.STALE_AFTER_S
    dead = _dead_pid()
    stale_file = tmp_path / f".m.onnx.specc-{dead}-abcd1234.tmp"
    stale_file.write_bytes(b"x")
    stale_dir = tmp_path / f".m.onnx.specc-{dead}-zz_9yy88.tmp"
    stale_dir.mkdir()
    (stale_dir / "m.onnx").write_bytes(b"x")
    (stale_dir / "m.onnx.data").write_bytes(b"x")
    legacy = tmp_path / ".m.onnx.k2j4h5g6"  # a name specc ≤ 0.1 used; now a user's as much as specc's: kept
    legacy.mkdir()
    (legacy / "m.onnx").write_bytes(b"x")
    fresh = tmp_path / f".other.py.specc-{dead}-qwer5678.tmp"  # a write in progress elsewhere: too young to touch
    fresh.write_bytes(b"x")
    keep = [tmp_path / ".hidden", tmp_path / ".notes.tmp", tmp_path / "data.tmp", tmp_path / ".m.onnx.abcd1234.tmp"]
    for p in keep:
        p.write_bytes(b"x")
    busy = tmp_path / f".big.onnx.specc-{dead}-bbbb2222.tmp"  # an old staging folder whose data is being written
    busy.mkdir()
    (busy / "big.onnx.data").write_bytes(b"x")
    for p in (stale_file, stale_dir, *stale_dir.iterdir(), legacy, *legacy.iterdir(), busy, *keep):
        os.utime(p, (old, old))
    sio.atomic_write(tmp_path / "out.txt", "new")
    assert not stale_file.exists() and not stale_dir.exists()
    assert legacy.exists() and fresh.exists() and busy.exists() and all(p.exists() for p in keep)
    assert (tmp_path / "out.txt").read_text() == "new"


def test_a_staging_folder_holding_a_link_is_left_alone(tmp_path: Path) -> None:
    old = time.time() - 2 * sio.STALE_AFTER_S
    odd = tmp_path / f".m.onnx.specc-{_dead_pid()}-abcd1234.tmp"
    odd.mkdir()
    (odd / "link").symlink_to("/etc/passwd")
    os.utime(odd, (old, old))
    assert sio.clean_stale(tmp_path) == [] and odd.exists()


def test_failed_writes_leave_nothing_and_replace_nothing(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    target.write_text("old")

    def bug(tmp: Path) -> None:
        tmp.write_text("half")
        raise ValueError("a bug in the writer")

    with pytest.raises(ValueError):
        sio.atomic_write(target, bug)
    with pytest.raises(KeyboardInterrupt), sio.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert target.read_text() == "old" and leftovers(tmp_path) == []


def test_command_scope_records_inputs_only_inside_it(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("x")
    sio.note_input(spec)  # outside a command: library use records nothing
    sio.atomic_write(spec, "y")
    with sio.command_scope():
        sio.note_input(spec, "the spec s.yaml")
        with pytest.raises(SpecError, match=r"is also the spec s\.yaml"):
            sio.atomic_write(spec, "z")
        sio.output_target(spec, replaces=[spec])  # a command that rewrites its input on purpose says so
        sio.atomic_write(spec, "z")
    assert spec.read_text() == "z"
