"""Property: any spec either validates (and lowers) or fails with located messages, never anything else."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specc.errors import SpecError
from specc.ir.lower import lower
from specc.spec.loader import load_spec

small_int = st.one_of(st.integers(min_value=-2, max_value=70), st.sampled_from([0, 1, 2, 3, 4, 8, 16, 2**40]))
scalar = st.one_of(small_int, st.booleans(), st.none(), st.floats(allow_nan=True), st.text(max_size=6))


def maybe(strategy: Any, **extra: Any) -> Any:
    """Mostly plausible values, sometimes junk."""
    return st.one_of(strategy, scalar, *extra.values())


attention = st.fixed_dictionaries(
    {"heads": maybe(st.sampled_from([1, 2, 3, 4, 8]))},
    optional={
        "kv_heads": maybe(st.sampled_from([1, 2, 4])),
        "head_dim": maybe(st.sampled_from([2, 3, 4, 8])),
        "mask": maybe(st.sampled_from(["causal", "none", "padding", "sliding_window", "prefix", "casual"])),
        "window": maybe(st.integers(1, 80)),
        "prefix": maybe(st.integers(1, 80)),
        "headz": scalar,
    },
)
mlp = st.one_of(
    st.sampled_from(["classic", "swiglu", "moe", "dense"]),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["classic", "swiglu", "moe"])},
        optional={
            "hidden": maybe(st.integers(1, 64)),
            "experts": maybe(st.integers(1, 6)),
            "active": maybe(st.integers(1, 6)),
            "activation": maybe(st.sampled_from(["relu", "gelu", "silu", "gelu_tanh"])),
            "multiple_of": maybe(st.integers(1, 16)),
        },
    ),
)
spec_dict = st.fixed_dictionaries(
    {
        "name": maybe(st.just("p")),
        "kind": maybe(st.sampled_from(["decoder", "encoder", "encoder_decoder", "vit", "rnn_seq2seq"])),
    },
    optional={
        "vocab_size": maybe(st.integers(1, 50)),
        "context": maybe(st.integers(1, 64)),
        "d_model": maybe(st.sampled_from([4, 6, 8, 12, 16])),
        "blocks": maybe(st.integers(1, 3)),
        "attention": st.one_of(attention, scalar),
        "norm": st.fixed_dictionaries(
            {},
            optional={
                "type": maybe(st.sampled_from(["layernorm", "rmsnorm"])),
                "placement": maybe(st.sampled_from(["pre", "post"])),
                "eps": maybe(st.floats(1e-8, 1e-2)),
            },
        ),
        "mlp": mlp,
        "position": maybe(st.sampled_from(["learned", "sinusoidal", "rotary", "none", "learned_2d", "sinusoidal_2d"])),
        "image": st.fixed_dictionaries({"size": maybe(st.integers(1, 32)), "patch": maybe(st.integers(1, 16))}),
        "classes": maybe(st.integers(1, 10)),
        "pooling": maybe(st.sampled_from(["mean", "cls"])),
        "rnn": st.fixed_dictionaries(
            {"hidden": maybe(st.integers(1, 16))},
            optional={
                "cell": maybe(st.sampled_from(["gru", "lstm", "rnn"])),
                "bidirectional": maybe(st.booleans()),
                "attention": maybe(st.sampled_from(["none", "bahdanau", "luong_dot", "luong_general"])),
            },
        ),
        "bias": maybe(st.booleans()),
        "tie_embeddings": maybe(st.booleans()),
        "type_vocab_size": maybe(st.integers(0, 3)),
        "bogus": scalar,
    },
)


@st.composite
def plausible(draw: Any) -> dict[str, Any]:
    """A spec close to valid: consistent sizes for a random kind, then a few random mutations."""
    kind = draw(st.sampled_from(["decoder", "encoder", "encoder_decoder", "vit", "rnn_seq2seq"]))
    heads = draw(st.sampled_from([1, 2, 4]))
    d: dict[str, Any] = {"name": "p", "kind": kind}
    if kind == "rnn_seq2seq":
        d.update(
            vocab_size=draw(st.integers(2, 30)),
            rnn={
                "hidden": draw(st.integers(1, 8)),
                "cell": draw(st.sampled_from(["gru", "lstm", "rnn"])),
                "bidirectional": draw(st.booleans()),
                "attention": draw(st.sampled_from(["none", "bahdanau", "luong_general", "luong_dot"])),
            },
        )
    else:
        d.update(
            d_model=heads * draw(st.sampled_from([2, 4])),
            blocks=draw(st.integers(1, 2)),
            attention={"heads": heads, "kv_heads": draw(st.sampled_from([1, heads]))},
            mlp=draw(mlp),
            norm={
                "type": draw(st.sampled_from(["layernorm", "rmsnorm"])),
                "placement": draw(st.sampled_from(["pre", "post"])),
            },
        )
        if kind == "vit":
            patch = draw(st.sampled_from([2, 4]))
            d.update(
                image={"size": patch * draw(st.integers(1, 3)), "patch": patch, "channels": 1},
                classes=draw(st.integers(1, 5)),
                pooling=draw(st.sampled_from(["mean", "cls"])),
                position=draw(st.sampled_from(["learned", "learned_2d", "sinusoidal_2d", "none"])),
            )
        else:
            d.update(
                vocab_size=draw(st.integers(2, 30)),
                context=draw(st.integers(4, 16)),
                position=draw(st.sampled_from(["learned", "sinusoidal", "rotary", "none"])),
            )
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from([*d.keys(), "bogus"]))
        action = draw(st.sampled_from(["junk", "delete", "fuzz"]))
        if action == "delete":
            d.pop(key, None)
        elif action == "junk":
            d[key] = draw(scalar)
        else:
            d[key] = draw(spec_dict).get(key, draw(scalar))
    return d


any_spec = st.one_of(plausible(), spec_dict)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_spec)
def test_random_dicts_validate_or_fail_cleanly(d: dict[str, Any]) -> None:
    try:
        spec = load_spec(d)
    except SpecError as e:
        assert e.diagnostics and all(x.message for x in e.diagnostics)
        return
    g = lower(spec)
    assert g.num_params() > 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_spec)
def test_random_yaml_files_fail_with_file_line_col(d: dict[str, Any]) -> None:
    text = yaml.safe_dump(d, sort_keys=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_text(text)
        try:
            lower(load_spec(path))
        except SpecError as e:
            for diag in e.diagnostics:
                assert diag.file == str(path) and diag.line is not None and diag.line >= 1, diag
                assert diag.format().startswith(f"{path}:{diag.line}:{diag.col}: error: ")


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8"))))
def test_random_bytes_never_crash(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.yaml"
        path.write_bytes(raw)
        try:
            load_spec(path)
        except SpecError as e:
            assert all(d.file == str(path) for d in e.diagnostics)
