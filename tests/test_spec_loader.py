"""The YAML loader: exact file:line:col of every error, bad input of every kind, extends and --set."""

from __future__ import annotations

from pathlib import Path

import pytest

from specc.errors import SpecError
from specc.spec.loader import load_spec

GOOD = """\
name: tiny
kind: decoder
vocab_size: 97
context: 64
d_model: 32
blocks: 2
attention:
  heads: 4
"""


def errors(path: Path, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(SpecError) as e:
        load_spec(path, overrides)
    return [d.format().splitlines()[0] for d in e.value.diagnostics]


def test_good_spec_loads(write_spec) -> None:
    s = load_spec(write_spec(GOOD))
    assert s.name == "tiny" and s.blocks == 2


def test_unknown_key_location_and_hint(write_spec) -> None:
    p = write_spec(GOOD + "  kv_head: 2\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    d = e.value.diagnostics[0]
    assert (d.file, d.line, d.col) == (str(p), 9, 3)
    assert d.message == "unknown key 'kv_head' in attention"
    assert d.hint == "did you mean 'kv_heads'?"


def test_rule_error_points_at_the_key(write_spec) -> None:
    p = write_spec(GOOD.replace("heads: 4", "heads: 5"))
    assert errors(p) == [f"{p}:8:3: error: d_model 32 is not divisible by heads 5"]


def test_padding_mask_on_a_decoder_points_at_the_mask(write_spec) -> None:
    p = write_spec(GOOD + "  mask: padding\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    (d,) = e.value.diagnostics
    assert (d.file, d.line, d.col) == (str(p), 9, 3)
    assert d.message == "attention.mask padding is refused on a decoder: it would make the decoder bidirectional"
    assert d.hint is not None and d.hint.startswith("decoders are causal")
    assert d.hint.endswith("use mask: causal")


def test_value_error_location(write_spec) -> None:
    p = write_spec(GOOD.replace("blocks: 2", "blocks: 0"))
    assert errors(p) == [f"{p}:6:1: error: blocks must be ≥ 1, got 0"]


def test_all_errors_of_a_file_together_in_order(write_spec) -> None:
    p = write_spec(GOOD.replace("blocks: 2", "blocks: zero") + "colour: red\n" + "norm: {type: rmsnrom}\n")
    found = errors(p)
    assert [f.split(": error")[0] for f in found] == [f"{p}:6:1", f"{p}:9:1", f"{p}:10:8"]


def test_missing_key_points_at_parent(write_spec) -> None:
    p = write_spec(GOOD.replace("  heads: 4\n", "  kv_heads: 4\n"))
    assert errors(p) == [f"{p}:7:1: error: missing required key 'attention.heads'"]


def test_duplicate_keys(write_spec) -> None:
    p = write_spec(GOOD + "blocks: 3\n")
    assert errors(p) == [f"{p}:9:1: error: duplicate key 'blocks' (first given at line 6)"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: [unclosed\n", ":2:1: error: malformed YAML"),
        ("a: &x [1, 2]\nb: *x\n", ":1:4: error: YAML anchors and aliases are not allowed"),
        (
            "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n",
            ":1:4: error: YAML anchors and aliases are not allowed",
        ),
        ("name: !!python/object/apply:os.system ['echo hacked']\n", ":1:7: error: YAML tag !!python/object/apply"),
        ("name: !custom x\n", ":1:7: error: YAML tag !custom is not allowed"),
        ("- 1\n- 2\n", ":1:1: error: a spec is a mapping of keys, but this is a list"),
        ("just text\n", ":1:1: error: a spec is a mapping of keys, but this is a single value"),
        ("", ":1:1: error: empty spec"),
        ("# only a comment\n", ":1:1: error: empty spec"),
        ("name: x\n---\nname: y\n", "malformed YAML"),
        ("? [a, b]\n: 1\n", ":1:3: error: keys must be plain names"),
        ("<<: {name: x}\n", ":1:1: error: YAML merge keys (<<) are not allowed"),
    ],
)
def test_bad_yaml(write_spec, text: str, expected: str) -> None:
    p = write_spec(text)
    found = errors(p)
    assert len(found) == 1 and found[0].startswith(str(p)) and expected in found[0], found


def test_non_utf8(write_spec) -> None:
    p = write_spec(b"name: ok\nkind: \xff\xfe\n")
    assert errors(p) == [f"{p}:2:7: error: not UTF-8 text: byte 0xff is invalid"]


def test_binary(write_spec) -> None:
    p = write_spec(b"\x7fELF\x00\x01\x02")
    assert errors(p) == [f"{p}:1:1: error: binary data (NUL byte) in a spec file"]


def test_directory_and_missing(tmp_path: Path) -> None:
    assert errors(tmp_path) == [f"{tmp_path}: error: {tmp_path} is a directory, not a spec file"]
    missing = tmp_path / "nope.yaml"
    assert errors(missing) == [f"{missing}: error: no such file: {missing}"]


def test_extends_preset_and_file(write_spec, tmp_path: Path) -> None:
    child = write_spec("extends: gpt2\nname: small\nblocks: 2\n")
    s = load_spec(child)
    assert (s.name, s.blocks, s.d_model, s.mlp.hidden) == ("small", 2, 768, 3072)
    grandchild = write_spec("extends: spec.yaml\nname: smaller\nd_model: 64\nattention: {heads: 2}\n", "g.yaml")
    s = load_spec(grandchild)
    assert (s.blocks, s.d_model, s.attention.heads, s.vocab_size) == (2, 64, 2, 50257)


def test_extends_type_change_replaces_mapping(write_spec) -> None:
    p = write_spec("extends: gpt2\nname: moe\nmlp: {type: moe, experts: 4, active: 2}\n")
    s = load_spec(p)
    assert s.mlp.type == "moe" and s.mlp.hidden is None  # gpt2's classic hidden size did not leak in


def test_extends_errors_point_into_the_right_file(write_spec) -> None:
    parent = write_spec(GOOD, "parent.yaml")
    child = write_spec("extends: parent.yaml\nattention: {heads: 5}\n", "child.yaml")
    assert errors(child) == [f"{child}:2:13: error: d_model 32 is not divisible by heads 5"]
    assert str(parent) not in errors(child)[0]


def test_extends_unknown_and_cycle(write_spec) -> None:
    p = write_spec("extends: gtp2\nname: x\n")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "no preset or file named 'gtp2'" in e.value.format() and "did you mean 'gpt2'?" in e.value.format()
    a = write_spec("extends: b.yaml\nname: a\n", "a.yaml")
    write_spec("extends: a.yaml\nname: b\n", "b.yaml")
    assert "extends cycle" in errors(a)[0]


def test_overrides(write_spec) -> None:
    p = write_spec(GOOD)
    s = load_spec(p, ["blocks=5", "attention.kv_heads=2", "mlp.type=swiglu", "position=rotary", "bias=false"])
    assert (s.blocks, s.attention.kv_heads, s.mlp.type, s.position.type, s.bias.qkv) == (
        5,
        2,
        "swiglu",
        "rotary",
        False,
    )


def test_override_errors_are_located_at_the_flag(write_spec) -> None:
    p = write_spec(GOOD)
    assert errors(p, ["attention.heads=5"]) == ["--set attention.heads: error: d_model 32 is not divisible by heads 5"]
    assert errors(p, ["blokcs=3"])[0].startswith("--set blokcs: error: unknown key 'blokcs'")
    with pytest.raises(SpecError, match="bad override"):
        load_spec(p, ["noequals"])


def test_preset_by_name() -> None:
    assert load_spec("gpt2-medium").blocks == 24


def test_dumped_spec_reloads_identically() -> None:
    s = load_spec("mixtral-8x7b")
    dumped = s.model_dump(mode="json")
    assert "extends" not in dumped
    assert load_spec(dumped) == s
    assert load_spec({**dumped, "extends": None}) == s


def test_rule_errors_blame_the_key_the_user_wrote(write_spec) -> None:
    # the rule's main key (attention.heads) lives in the preset; the value that broke it is the child's d_model
    p = write_spec("extends: gpt2\nname: mine\nd_model: 770\n")
    assert errors(p) == [f"{p}:3:1: error: d_model 770 is not divisible by heads 12"]
