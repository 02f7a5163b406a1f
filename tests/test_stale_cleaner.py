"""The stale-temp cleaner removes only specc's own temporary files and folders (``.NAME.specc-<pid>-XXXXXXXX.tmp``)
whose process is gone; a user's files next to them are never touched, whatever their name or age."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import specc.io as sio

OLD = time.time() - 2 * sio.STALE_AFTER_S


def _dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _age(*paths: Path) -> None:
    for p in paths:
        for q in [p, *(p.iterdir() if p.is_dir() else [])]:
            os.utime(q, (OLD, OLD))


def test_user_files_with_look_alike_names_are_never_removed(cli, tmp_path: Path) -> None:
    """The names the old cleaner deleted (``.NAME.XXXXXXXX.tmp``, ``.NAME.onnx.XXXXXXXX``), old and owned by
    this user, survive an unrelated ``specc compile -o`` into the same folder."""
    notes = tmp_path / ".notes.20240101.tmp"
    notes.write_text("my notes")
    photos = tmp_path / ".photos.backup_1.tmp"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"jpeg")
    archive = tmp_path / ".model.onnx.archive1"
    archive.mkdir()
    (archive / "model.onnx").write_bytes(b"onnx")
    dead = _dead_pid()
    near = [
        tmp_path / f".x.specc-{dead}-abcd1234.tmp.bak",  # not the exact form
        tmp_path / f".x.specc-{dead}-abcd123.tmp",  # 7 random characters
        tmp_path / f"x.specc-{dead}-abcd1234.tmp",  # no leading dot
        tmp_path / f".x.specc-0{dead}-abcd1234.tmp",  # a pid with a leading zero: not what specc writes
        tmp_path / f".x.SPECC-{dead}-abcd1234.tmp",
    ]
    for p in near:
        p.write_text("mine")
    _age(notes, photos, archive, *near)
    code, _, err = cli(
        "compile", "gpt2", "--set", "blocks=1", "--set", "d_model=16", "--set", "attention.heads=2",
        "--set", "vocab_size=50", "--set", "context=16", "--set", "mlp.hidden=32", "--target", "onnx",
        "-o", tmp_path / "x.onnx",
    )  # fmt: skip
    assert code == 0, err
    assert notes.read_text() == "my notes" and (photos / "a.jpg").read_bytes() == b"jpeg"
    assert (archive / "model.onnx").read_bytes() == b"onnx"
    assert all(p.read_text() == "mine" for p in near)
    assert sio.clean_stale(tmp_path) == []


def test_specc_temps_of_a_dead_process_go_those_of_a_live_one_stay(tmp_path: Path) -> None:
    from specc.io.targets import temp_dir, temp_file

    target = tmp_path / "m.onnx"
    dead = _dead_pid()
    gone_file = tmp_path / f".m.onnx.specc-{dead}-abcd1234.tmp"
    gone_file.write_bytes(b"x")
    gone_dir = tmp_path / f".m.onnx.specc-{dead}-zz_9yy88.tmp"
    gone_dir.mkdir()
    (gone_dir / "m.onnx").write_bytes(b"x")
    mine_file = temp_file(tmp_path, target)  # this process is alive: its temporaries are in use
    mine_dir = temp_dir(tmp_path, target)
    (mine_dir / "shard-00000.safetensors").write_bytes(b"x")
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = tmp_path / f".m.onnx.specc-{alive.pid}-qwer5678.tmp"
        other.write_bytes(b"x")
        young = tmp_path / f".m.onnx.specc-{dead}-young123.tmp"  # a dead pid, but written a moment ago
        young.write_bytes(b"x")
        link = tmp_path / f".m.onnx.specc-{dead}-link1234.tmp"  # never followed, never removed
        link.symlink_to("/etc/passwd")
        odd = tmp_path / f".m.onnx.specc-{dead}-efgh5678.tmp"  # a folder holding a link: left alone
        odd.mkdir()
        (odd / "link").symlink_to("/etc/passwd")
        foreign = tmp_path / f".m.onnx.specc-{dead}-ijkl9012.tmp"
        foreign.write_bytes(b"x")
        if os.geteuid() == 0:  # tests run as root here: another user's file, by an unused uid
            os.chown(foreign, 64123, 64123)
        os.utime(link, (OLD, OLD), follow_symlinks=False)
        _age(gone_file, gone_dir, mine_file, mine_dir, other, odd, foreign)
        removed = sio.clean_stale(tmp_path)
        assert sorted(removed) == sorted([gone_file, gone_dir] + ([] if os.geteuid() == 0 else [foreign]))
        assert not gone_file.exists() and not gone_dir.exists()
        assert mine_file.exists() and mine_dir.exists() and other.exists() and young.exists()
        assert link.is_symlink() and (odd / "link").is_symlink()
    finally:
        alive.kill()
        alive.wait()
    assert other in sio.clean_stale(tmp_path)  # its process is gone now


def test_every_temporary_name_carries_the_mark_and_the_pid(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    seen = []

    def writer(tmp: Path) -> None:
        seen.append(tmp.name)
        tmp.write_bytes(b"x")

    sio.atomic_write(target, writer)
    stage = sio.folder_stage(tmp_path / "ck")
    seen.append(stage.name)
    sio.discard_stage(stage)
    form = re.compile(rf"^\.(out\.bin|ck)\.specc-{os.getpid()}-[a-z0-9_]{{8}}\.tmp$")
    assert len(seen) == 2 and all(form.match(name) for name in seen), seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]
