"""The reading layer (specc.io.read): regular files only, bounded reads, strict JSON and text, nesting limits.

Also the helpers the other test_read_* / test_fuzz_* files share: ``one_line`` (exit 2, one error line, no
traceback) and ``fifo`` (a named pipe that would hang a reader that does not check what it opened).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from specc import SpecError, load_spec
from specc.io import read as R

CLI = Callable[..., tuple[int, str, str]]


def one_line(result: tuple[int, str, str], *needles: str) -> str:
    """Exit 2 with exactly one ``error:`` line (plus at most a hint) and no traceback; returns that line."""
    code, out, err = result
    assert code == 2, (code, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("  hint:")]
    assert len(lines) == 1 and "error:" in lines[0], err
    assert "Traceback" not in err and "Traceback" not in out, err
    for n in needles:
        assert n in lines[0], (n, err)
    return lines[0]


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def raises(fn: Callable[..., object], *args: object, **kw: object) -> str:
    with pytest.raises(SpecError) as e:
        fn(*args, **kw)
    assert isinstance(e.value, SpecError)
    return e.value.format()


# ---------------------------------------------------------------------------------------------- files


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    pipe = fifo(tmp_path / "pipe")
    start = time.perf_counter()
    assert "is a FIFO (named pipe), not a spec file" in raises(R.read_bytes, pipe, "a spec file")
    assert time.perf_counter() - start < 2  # a FIFO with no writer is never waited on
    assert "/dev/zero is a character device" in raises(R.read_bytes, "/dev/zero", "a spec file")
    assert "/dev/null is a character device" in raises(R.read_bytes, "/dev/null")
    assert "is a directory, not a profile" in raises(R.read_bytes, tmp_path, "a profile")
    assert "no such file" in raises(R.read_bytes, tmp_path / "nope")


def test_symlinks_are_followed_to_what_they_name(tmp_path: Path) -> None:
    target = tmp_path / "real.yaml"
    target.write_text("name: x\n")
    (tmp_path / "good").symlink_to(target)
    assert R.read_bytes(tmp_path / "good") == b"name: x\n"
    (tmp_path / "dev").symlink_to("/dev/zero")
    assert "character device" in raises(R.read_bytes, tmp_path / "dev")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert "symbolic link to" in raises(R.read_bytes, tmp_path / "dangling") and "does not exist" in raises(
        R.read_bytes, tmp_path / "dangling"
    )
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert "symbolic links" in raises(R.read_bytes, tmp_path / "loop")


def test_size_limits_have_their_own_message(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (R.SPEC_BYTES + 1))
    assert "a spec file is at most 1 MiB; this file is 1,048,577 bytes" in raises(R.read_bytes, big, "a spec file")
    # /proc files say st_size 0: the read itself is bounded
    assert len(R.read_bytes("/proc/self/status", limit=64 << 10)) > 0
    with pytest.raises(SpecError, match="at most 16 bytes; this file is larger"):
        R.read_bytes("/proc/self/status", limit=16)


def test_unreadable_file(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    p = tmp_path / "secret.yaml"
    p.write_text("x: 1\n")
    p.chmod(0)
    assert "permission denied" in raises(R.read_bytes, p)


def test_sibling_names_stay_in_the_folder(tmp_path: Path) -> None:
    assert (
        R.sibling(tmp_path, "model-00001.safetensors", "i.json", "weight_map") == tmp_path / "model-00001.safetensors"
    )
    for bad in ("../x.safetensors", "/etc/passwd", "sub/x", "..", "", "a\x00b", 3, None, ["x"]):
        assert "weight_map" in raises(R.sibling, tmp_path, bad, "i.json", "weight_map")


# ---------------------------------------------------------------------------------------------- text


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("name: x\n".encode("utf-16"), "1:1: error: UTF-16 text"),
        ("name: x\n".encode("utf-16-le"), "1:1: error: UTF-16 text"),
        ("name: x\n".encode("utf-32"), "1:1: error: UTF-32 text"),
        (b"a: 1\n\x00\x01", "2:1: error: binary data (NUL byte)"),
        (b"a: 1\nb: \xc3\x28\n", "2:4: error: not UTF-8 text: byte 0xc3 is invalid"),
    ],
)
def test_text_must_be_utf8(raw: bytes, message: str) -> None:
    assert message in raises(R.decode_text, raw, "f.txt", "a text file")


def test_utf8_bom_is_dropped() -> None:
    assert R.decode_text(b"\xef\xbb\xbfname: x", "f") == "name: x"


# ---------------------------------------------------------------------------------------------- JSON


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": 1,\n "a": 2}', "2:2: error: duplicate key 'a'"),
        ('{"a": {"b": 1, "b": 2}}', "1:16: error: duplicate key 'b'"),
        ('{"eps": NaN}', "1:9: error: NaN is not a JSON number"),
        ('{"eps": -Infinity}', "1:9: error: -Infinity is not a JSON number"),
        ('{"eps": 1e400}', "error: 1e400 overflows to infinity"),
        ('{"n": ' + "9" * 5000 + "}", "a number with too many digits"),
        ('{"a": [1, 2,]}', "1:13: error: not valid JSON: Expecting value"),
        ("[" * 100 + "]" * 100, "1:33: error: nested deeper than 32 levels"),
    ],
)
def test_strict_json(text: str, message: str) -> None:
    assert message in raises(R.parse_json, text, "c.json")


def test_strings_that_look_like_constants_or_brackets_are_data() -> None:
    text = '{"a": "NaN", "b": "[[[[{{{{", "c": "Infinity", "d\\"": 1}'
    assert R.parse_json(text, "c.json", max_depth=2)["b"] == "[[[[{{{{"


def test_json_inside_a_file_says_where_it_is() -> None:
    msg = raises(R.parse_json, '{"a": }', "ck.safetensors", "metadata 'specc.spec'", located=False)
    assert msg == "ck.safetensors: error: metadata 'specc.spec': not valid JSON: Expecting value (line 1, column 7)"


def test_deep_json_is_refused_quickly() -> None:
    start = time.perf_counter()
    for text in ("[" * 200_000 + "]" * 200_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        with pytest.raises(SpecError, match="nested deeper than 32 levels"):
            R.parse_json(text, "x.json")
    assert time.perf_counter() - start < 5


def test_read_json_empty_and_not_an_object(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text("  \n")
    assert "c.json:1:1: error: config.json is empty" in raises(R.read_json, p, "config.json")
    assert "must be a JSON object, not a list of 2 items" in raises(R.json_object, [1, 2], "c.json", "config.json")


# ---------------------------------------------------------------------------------------------- specs (YAML)


@pytest.mark.parametrize(
    "text",
    [
        "name: x\nkind: decoder\nmlp: " + "[" * 20_000 + "]" * 20_000 + "\n",  # 40 KB: was 31 s and a RecursionError
        "name: x\nkind: decoder\nmlp:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(300)),
        "name: x\nkind: decoder\nmlp: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
        "name: x\nkind: decoder\nmlp:\n  " + "- " * 5000 + "x\n",
    ],
    ids=["flow-lists", "block-maps", "flow-maps", "dashes"],
)
def test_deeply_nested_spec_is_a_quick_located_error(write_spec, text: str) -> None:
    p = write_spec(text)
    start = time.perf_counter()
    msg = raises(load_spec, p)
    assert time.perf_counter() - start < 5
    assert re.match(rf"{re.escape(str(p))}:\d+:\d+: error: nested deeper than 32 levels", msg), msg


def test_specs_and_extends_targets_must_be_regular_files(write_spec, tmp_path: Path) -> None:
    fifo(tmp_path / "pipe.yaml")
    start = time.perf_counter()
    assert "is a FIFO" in raises(load_spec, tmp_path / "pipe.yaml")
    assert "is a character device" in raises(load_spec, "/dev/zero")
    child = write_spec("extends: pipe.yaml\nname: x\n", "child.yaml")
    assert "pipe.yaml is a FIFO (named pipe), not a spec file" in raises(load_spec, child)
    child = write_spec("extends: /dev/zero\nname: x\n", "child2.yaml")
    assert "/dev/zero is a character device" in raises(load_spec, child)
    assert time.perf_counter() - start < 5


def test_set_extends_is_refused_not_ignored() -> None:
    msg = raises(load_spec, "gpt2", ["extends=bert-base"])
    assert msg.startswith("--set extends: error: extends cannot be set with --set")


def test_cli_spec_from_a_device_or_fifo(cli: CLI, tmp_path: Path) -> None:
    one_line(cli("validate", "/dev/zero"), "/dev/zero is a character device")
    one_line(cli("analyze", fifo(tmp_path / "p.yaml")), "is a FIFO")
    one_line(cli("graph", "gpt2", "--set", "extends=gpt2-xl"), "extends")
