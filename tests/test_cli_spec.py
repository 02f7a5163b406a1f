"""CLI front end: exit codes, one-line located messages, no tracebacks; graph formats, schema, presets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specc.spec.presets import preset_names, presets_dir

ROOT = Path(__file__).resolve().parents[1]


def test_validate_all_presets(cli) -> None:
    code, out, err = cli("validate", *sorted(presets_dir().glob("*.yaml")))
    assert code == 0, err
    assert out.count(": ok (") == len(preset_names())


def test_validate_reports_every_bad_file(cli, write_spec) -> None:
    bad1 = write_spec("name: a\nkind: decoder\n", "a.yaml")
    bad2 = write_spec("name: [\n", "b.yaml")
    code, _out, err = cli("validate", bad1, bad2, "gpt2")
    assert code == 2
    assert f"{bad1}:1:1: error: missing required key" in err
    assert f"{bad2}:2:1: error: malformed YAML" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "content",
    [b"name: !!python/object/apply:os.system ['touch /tmp/specc-pwned']\n", b"\x00\x01", b"a: &x 1\nb: *x\n", b""],
)
def test_bad_input_exit_2_one_line(cli, write_spec, content: bytes) -> None:
    p = write_spec(content)
    code, out, err = cli("graph", p)
    assert code == 2
    assert err.startswith(f"{p}:") and "error:" in err.splitlines()[0]
    assert "Traceback" not in err and out == ""
    assert not Path("/tmp/specc-pwned").exists()


def test_missing_path_and_directory(cli, tmp_path: Path) -> None:
    code, _, err = cli("validate", tmp_path / "nope.yaml")
    assert code == 2 and "no such file" in err
    code, _, err = cli("validate", tmp_path)
    assert code == 2 and "is a directory" in err


def test_set_override_on_every_command(cli) -> None:
    code, out, _ = cli("graph", "gpt2", "--set", "blocks=1", "--format", "json")
    assert code == 0
    ops = json.loads(out)["ops"]
    assert not any(o["name"].startswith("blocks.1.") for o in ops)
    code, _, err = cli("validate", "gpt2", "--set", "attention.heads=7")
    assert code == 2 and "--set attention.heads: error: d_model 768 is not divisible by heads 7" in err


def test_graph_formats(cli) -> None:
    code, out, _ = cli("graph", "gpt2", "--set", "blocks=1")
    assert code == 0 and "124" not in out.splitlines()[0].split(",")[0]
    assert "blocks.0.attn.qkv" in out and "[B,N,2304]" in out
    code, out, _ = cli("graph", "gpt2", "--set", "blocks=1", "-f", "dot")
    assert code == 0 and out.startswith('digraph "gpt2"') and "blocks_0_attn_qkv -> blocks_0_attn_core" in out
    code, out, _ = cli("graph", "gpt2", "--set", "blocks=1", "-f", "mermaid")
    assert code == 0 and out.startswith("flowchart TD") and "blocks_0_attn_core --> blocks_0_attn_out" in out
    code, out, _ = cli("graph", "gpt2", "-f", "json")
    g = json.loads(out)
    total = sum(int(__import__("math").prod(shape)) for op in g["ops"] for shape in op["params"].values())
    assert total == 124_439_808


def test_every_command_prints_the_analyzers_parameter_count(cli) -> None:
    """DeepSeek-V3's routing bias is a buffer in the reference, not a parameter: validate, graph and presets print
    ``params.total`` (HF's ``num_parameters()``), not the tensors specc stores."""
    from specc.analysis.params import count_params
    from specc.ir.lower import lower
    from specc.spec.loader import load_spec
    from specc.spec.presets import find_preset

    g = lower(load_spec(find_preset("deepseek-v3")))
    counts = count_params(g)
    assert counts.buffers > 0 and g.num_params() == counts.total + counts.buffers
    shown = f"{counts.total:,} parameters"
    for command in (("validate", "deepseek-v3"), ("graph", "deepseek-v3")):
        code, out, err = cli(*command)
        assert code == 0, err
        assert shown in out.splitlines()[0]
    code, out, _ = cli("presets")
    assert code == 0 and f"{counts.total:,}" in out and f"{g.num_params():,}" not in out


def test_schema_is_json_schema(cli) -> None:
    code, out, _ = cli("schema")
    assert code == 0
    schema = json.loads(out)
    assert schema["$schema"].startswith("https://json-schema.org/")
    kinds = {m["properties"]["kind"]["const"] for m in schema["$defs"].values() if "kind" in m.get("properties", {})}
    assert kinds == {"decoder", "encoder", "encoder_decoder", "vit", "rnn_seq2seq", "dual_encoder"}
    # the committed copy used by the presets' modeline is current
    assert json.loads((ROOT / "specc.schema.json").read_text()) == schema


def test_presets_table(cli) -> None:
    code, out, _ = cli("presets")
    assert code == 0
    for name in ("gpt2-xl", "mixtral-8x7b", "gru-bahdanau"):
        assert name in out
    assert "1,557,611,200" in out


def test_version_and_usage_errors(cli) -> None:
    code, out, _ = cli("--version")
    assert code == 0 and out.startswith("specc ")
    code, _, err = cli("graph", "gpt2", "--format", "png")
    assert code == 2 and "png" in err
    code, _, _ = cli("no-such-command")
    assert code == 2


def test_debug_shows_traceback_for_user_errors(cli, write_spec) -> None:
    p = write_spec("name: [\n")
    code, _, err = cli("--debug", "validate", p)
    assert code == 2 and "Traceback" in err and f"{p}:2:1: error" in err


def test_console_entry_point_runs_as_module(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkind: decoder\nblocks: -1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "specc", "validate", str(bad)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2
    assert f"{bad}:3:1: error: blocks must be ≥ 1, got -1" in proc.stderr
    assert "Traceback" not in proc.stderr
