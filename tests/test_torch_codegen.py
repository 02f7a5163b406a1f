"""The torch backend is generated source: one class per block kind, readable model.py, located tracebacks."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_torch_cases import one_thread, tiny  # noqa: F401  (autouse fixture)
from torch import nn

import specc
from specc.backends.torch import build_torch, write_model_py
from specc.backends.torch.codegen import model_source


def test_gpt2_model_py_reads_like_hand_written_code(tmp_path: Path) -> None:
    path = write_model_py(specc.load_spec("gpt2"), tmp_path / "model.py")
    text = path.read_text()
    assert len(text.splitlines()) <= 343  # the KV cache, generation, ties, HF names, a Config; only the paths it takes
    tree = ast.parse(text)
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert classes.count("Block") == 1 and "Attention" in classes and "MLP" in classes
    assert "Op(" not in text and "MoE" not in text and "RNNDecoder" not in text  # only the layers it uses
    assert "nn.ModuleList(Block(c) for _ in range(c.blocks))" in text and "class Config:" in text
    assert "x = x + self.attn(self.norm1(x), attention_mask, state)" in text
    ruff = shutil.which("ruff")
    if ruff:
        check = subprocess.run([ruff, "format", "--check", "--line-length", "120", str(path)], capture_output=True)
        assert check.returncode == 0, check.stdout


def test_build_runs_the_same_classes_model_py_holds(tmp_path: Path) -> None:
    spec = tiny("llama_gqa_rope")
    model = build_torch(spec)
    text = write_model_py(spec, tmp_path / "model.py").read_text()
    generated = {n.name for n in ast.parse(type(model).SOURCE).body if isinstance(n, ast.ClassDef)}
    assert generated <= {n.name for n in ast.parse(text).body if isinstance(n, ast.ClassDef)}
    assert isinstance(model.get_submodule("blocks.0.attn.qkv"), nn.Linear)
    assert type(model.get_submodule("blocks.0.attn.qkv")) is nn.Linear
    assert isinstance(model.get_submodule("blocks.1.norm1"), nn.RMSNorm)
    assert type(model.blocks) is nn.ModuleList and type(model.blocks[0]) is type(model.blocks[1])


def test_blocks_that_differ_get_a_parameter_or_a_class_of_their_own() -> None:
    graph = specc.lower(tiny("gpt2", "blocks=3"))
    norm1 = graph.op("blocks.1.norm1")
    norm1.attrs = replace(norm1.attrs, eps=1e-3)  # a constructor attribute: a parameter of Block
    src = model_source(graph).body
    assert "class Block2" not in src and "Block(eps=0.001)" in src and "Block(eps=1e-05)" in src
    act = graph.op("blocks.2.mlp.act")
    act.attrs = replace(act.attrs, fn="relu")  # a different module: a class of its own
    src = model_source(graph).body
    assert "class Block2" in src and "class MLP2" in src
    model = build_torch(graph)
    assert model.blocks[1].norm1.eps == 1e-3 and model.blocks[0].norm1.eps == 1e-5
    assert isinstance(model.blocks[2].mlp.act, nn.ReLU) and isinstance(model.blocks[0].mlp.act, nn.GELU)


def test_tracebacks_show_the_generated_line_and_name_the_layer() -> None:
    model = build_torch(tiny("gpt2"))
    with pytest.raises(RuntimeError) as info:
        model.blocks[0].attn(torch.randn(1, 4, 31))  # wrong width
    text = "".join(traceback.format_exception(info.value))
    assert "specc/generated/m_" in text and "self.qkv(x)" in text and "in forward" in text


def test_every_case_generates_source_that_compiles_and_names_classes_after_scopes() -> None:
    from test_torch_cases import CASES

    for case in CASES:
        src = model_source(specc.lower(tiny(case)))
        compile(src.text(), case, "exec")
        assert src.root in src.body


def test_pickle_and_deepcopy_find_the_generated_classes() -> None:
    import copy
    import pickle

    model = build_torch(tiny("gpt2"))
    ids = torch.randint(0, 64, (1, 5))
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        torch.testing.assert_close(clone(ids), model(ids))


def test_a_saved_model_loads_in_another_process(tmp_path: Path) -> None:
    model = build_torch(tiny("llama_gqa_rope"))
    torch.save(model, tmp_path / "m.pt")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.save(model(ids), tmp_path / "want.pt")
    code = (
        "import torch; m = torch.load('m.pt', weights_only=False)\n"
        "with torch.no_grad(): got = m(torch.tensor([[1, 2, 3, 4]]))\n"
        "torch.testing.assert_close(got, torch.load('want.pt'), atol=1e-5, rtol=1e-5)  # kernels measured anew"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_model_py_runs_in_a_fresh_interpreter(tmp_path: Path) -> None:
    write_model_py(tiny("mixtral_moe"), tmp_path / "model.py")
    code = "import model, torch; m = model.build(); print(m.generate(torch.tensor([[1, 2, 3]]), 4).shape)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch.Size([1, 7])"


def test_model_signatures_follow_the_graph_inputs() -> None:
    import inspect

    want = {
        "gpt2": ["input_ids", "attention_mask", "state"],
        "bert_mlm": ["input_ids", "attention_mask", "token_type_ids", "state", "return_all"],
        "transformer": ["input_ids", "decoder_input_ids", "attention_mask", "state"],
        "vit_cls": ["pixel_values", "state", "return_all"],
        "gru_bahdanau": ["input_ids", "decoder_input_ids", "attention_mask", "state"],
    }
    for case, params in want.items():
        model = build_torch(tiny(case))
        assert list(inspect.signature(model.forward).parameters) == params, case
    bert = build_torch(tiny("bert_mlm"))
    ids = torch.randint(1, 64, (1, 6))
    mask, types = torch.tensor([[1, 1, 1, 1, 0, 0]]), torch.tensor([[0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        torch.testing.assert_close(bert(ids, mask, types), bert(ids, attention_mask=mask, token_type_ids=types))
