"""``position.offset`` and ``position.skip_padding``: located errors where they cannot apply, their JSON schema,
and what they do without HF: with skip_padding an encoder's left-padded row equals the same tokens unpadded (in
torch and ONNX); an offset table holds offset + context rows and a real token never reads the leading ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import specc
from specc.errors import SpecError
from specc.spec.loader import load_spec
from specc.spec.schema import json_schema

ENCODER = """\
name: tiny-roberta
kind: encoder
vocab_size: 50
context: 16
d_model: 32
blocks: 2
attention: {heads: 4, mask: padding}
norm: {type: layernorm, placement: post, embedding: true}
position: {type: learned, offset: 2, skip_padding: true}
init: {std: 0.3}
"""


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        (ENCODER.replace("type: learned, offset: 2", "type: rotary, offset: 2"), 9, "offset", "learned table"),
        (
            ENCODER.replace("kind: encoder", "kind: decoder")
            .replace("attention: {heads: 4, mask: padding}", "attention: {heads: 4}")
            .replace("skip_padding: true", "skip_padding: false"),
            9,
            "skip_padding",
            "real tokens",
        ),
        (
            ENCODER.replace(
                "position: {type: learned, offset: 2, skip_padding: true}", "position: {type: none, skip_padding: true}"
            ),
            9,
            "skip_padding",
            "no token numbering",
        ),
    ],
    ids=["offset-rotary", "decoder-by-index", "none"],
)
def test_numbering_where_it_cannot_apply_is_a_located_error(write_spec, text, line, key, words) -> None:
    p = write_spec(text)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    d = e.value.diagnostics[0]
    col = text.splitlines()[line - 1].index(key) + 1  # the key itself
    assert words in d.message and (d.file, d.line, d.col) == (str(p), line, col), d.format()


def test_json_schema_describes_the_fields() -> None:
    text = str(json_schema())
    assert "skip_padding" in text and "offset" in text and "pad_token_id + 1" in text


def _encoder() -> specc.SpecModel:
    import yaml

    return load_spec(yaml.safe_load(ENCODER))


def test_an_offset_table_holds_its_leading_rows_and_real_tokens_skip_them() -> None:
    s = _encoder()
    g = specc.lower(s)
    assert g.params()["pos.weight"].shape == (2 + 16, 32)
    model = specc.build_torch(s)
    ids = torch.randint(3, 50, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = model.run({"input_ids": ids})["last_hidden_state"]
        model.pos.weight[:2] += torch.randn(2, 32)  # rows before position 0: no real token reads them
        same = model.run({"input_ids": ids})["last_hidden_state"]
        model.pos.weight[2] += torch.randn(32)  # position 0 does (not a constant: the embedding LayerNorm removes it)
        moved = model.run({"input_ids": ids})["last_hidden_state"]
    torch.testing.assert_close(same, base)
    assert (moved - base).abs().max() > 1e-3


def test_skip_padding_makes_a_left_padded_row_equal_to_its_tokens_alone(tmp_path: Path) -> None:
    s = _encoder()
    model = specc.build_torch(s)
    ids = torch.randint(3, 50, (1, 7), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([torch.ones(1, 4, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones_like(ids)], 1)
    with torch.no_grad():
        alone = model.run({"input_ids": ids})["last_hidden_state"]
        left = model.run({"input_ids": padded, "attention_mask": mask})["last_hidden_state"][:, 4:]
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=0)
    ort = pytest.importorskip("onnxruntime")
    save_file(dict(model.state_dict()), str(tmp_path / "w.safetensors"))
    path = specc.export_onnx(s, tmp_path / "m.onnx", weights=str(tmp_path / "w.safetensors"))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": padded.numpy(), "attention_mask": mask.numpy()}
    got = sess.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})
    np.testing.assert_allclose(got[0][:, 4:], alone.numpy(), atol=1e-4, rtol=0)
