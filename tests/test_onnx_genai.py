"""`specc compile --target onnx --kv-cache --genai`: onnxruntime-genai's Generator loads the graph through the
genai_config.json written beside it and decodes the same greedy ids as `specc run --generate`.

onnxruntime-genai needs the plain `onnxruntime` distribution, which clashes with specc's `onnxruntime-gpu`, so it
runs in its own cached environment (scripts/genai_env.sh, keyed on requirements-genai.txt), made on first use.
The test is skipped only when the package index has no onnxruntime-genai wheel for this platform."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hf_families_zoo import FAMILY_BY_ID
from test_hf_zoo import BY_ID, build

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[1]
PROMPT = [1, 5, 9, 30, 17]
NEW = 16

GENERATE = """
import json, sys
import onnxruntime_genai as og
folder, prompt, new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = og.Model(folder)
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=len(prompt) + new)
generator = og.Generator(model, params)
generator.append_tokens(prompt)
while not generator.is_done():
    generator.generate_next_token()
print(json.dumps([int(t) for t in generator.get_sequence(0)][len(prompt):]))
"""


@functools.cache
def _genai_python() -> str:
    """The python of the onnxruntime-genai environment, made if missing (skip: no wheel for this platform)."""
    req = ROOT / "requirements-genai.txt"
    pin = next(line for line in req.read_text().splitlines() if line.startswith("onnxruntime-genai"))
    made = subprocess.run(["bash", str(ROOT / "scripts" / "genai_env.sh")], capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    if made.returncode == 0:
        return made.stdout.strip().splitlines()[-1]
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", "/tmp/specc-genai-probe",
                            pin], capture_output=True, text=True, timeout=600)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"the package index has no {pin} wheel for this platform: {probe.stderr.strip()[-300:]}")
    raise AssertionError(f"scripts/genai_env.sh failed although {pin} is available:\n{made.stderr[-2000:]}")


def _genai_ids(folder: Path) -> list[int]:
    proc = subprocess.run([_genai_python(), "-c", GENERATE, str(folder), json.dumps(PROMPT), str(NEW)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _specc_ids(cli, model: Path, eos: int | list[int]) -> list[int]:
    stop = ["--eos-id", str(eos)] if isinstance(eos, int) else []  # ([]: the HF config names no eos)
    code, out, err = cli("run", model, "--input-ids", " ".join(map(str, PROMPT)), "--generate", str(NEW),
                         "--provider", "cpu", *stop)  # fmt: skip
    assert code == 0, err
    row = out.split("generated", 1)[1].splitlines()[1]
    ids = [int(t) for t in re.findall(r"\d+", row)]
    return ids[: ids.index(eos)] if stop and eos in ids else ids  # genai ends the sequence before eos


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2-tied"])
@pytest.mark.parametrize("quantize", [None, "int4"])
def test_genai_generator_decodes_what_specc_decodes(cli, tmp_path: Path, case: str, quantize: str | None) -> None:
    zoo = BY_ID[case] if case in BY_ID else FAMILY_BY_ID[case]
    hf = tmp_path / "hf"
    build(zoo).save_pretrained(hf)
    (hf / "tokenizer.json").write_text('{"version": "1.0"}')  # copied beside the model, byte for byte
    spec = tmp_path / "spec.yaml"
    assert cli("import-hf", hf, "-o", spec)[0] == 0
    out = tmp_path / "onnx"
    out.mkdir()
    model = out / "model.onnx"
    args = ["--quantize", quantize] if quantize else []
    weights = hf / "model.safetensors"
    code, _, err = cli("compile", spec, "--target", "onnx", "--kv-cache", "--genai", "--weights", weights, "-o", model,
                       *args)  # fmt: skip
    assert code == 0, err
    config = json.loads((out / "genai_config.json").read_text())
    hf_config = json.loads((hf / "config.json").read_text())
    assert config["model"]["type"] == hf_config["model_type"] and config["model"]["decoder"]["filename"] == "model.onnx"
    assert config["model"]["decoder"]["num_key_value_heads"] == hf_config["num_key_value_heads"]
    assert (out / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()
    eos = config["model"]["eos_token_id"]
    want = _specc_ids(cli, model, eos)
    assert len(want) >= 4  # enough tokens to tell decoders apart
    assert _genai_ids(out) == want


def test_genai_needs_a_cached_decoder(cli, tmp_path: Path) -> None:
    tiny = ["--set", "blocks=1", "--set", "d_model=16", "--set", "attention.heads=2", "--set", "vocab_size=50"]
    code, _, err = cli("compile", "gpt2", *tiny, "--target", "onnx", "--genai", "-o", tmp_path / "m.onnx")
    assert code == 2 and "--genai needs --kv-cache" in err and not list(tmp_path.iterdir())
    code, _, err = cli("compile", "bert-base", "--set", "blocks=1", "--target", "onnx", "--kv-cache", "--genai",
                       "-o", tmp_path / "b.onnx")  # fmt: skip
    assert code == 2 and "error:" in err and not list(tmp_path.iterdir())
    code, _, err = cli("compile", "gpt2", *tiny, "--target", "torch", "--genai", "-o", tmp_path / "m.safetensors")
    assert code == 2 and "--genai applies to --target onnx" in err
