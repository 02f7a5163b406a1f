"""Left-padded batches through ONNX: positions follow attention_mask as HF's generate counts them
(cumsum(mask) - 1, padded slots 1), so a padded row computes and generates what it would alone, and what HF
computes and generates; for learned (GPT-2), rotary (Llama, GQA) and sinusoidal positions.

The graph contract: decoder-only graphs take an optional ``position_ids`` [batch, sequence] int64 (an
onnxruntime overridable initializer, default ``[[-1]]`` = derive); without it positions come from
``attention_mask`` (past + new with a KV cache), and without a mask from the past length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import specc
from specc.backends.onnx.export import export_onnx
from specc.runtime.generate import greedy, mask_positions
from specc.runtime.inputs import check, complete
from specc.runtime.onnx_model import OrtModel

TEXT = ["blocks=2", "d_model=32", "attention.heads=4", "context=32", "vocab_size=61", "init.std=0.3"]
DECODERS = {
    "gpt2_learned": ("gpt2", [*TEXT, "mlp.hidden=64"]),
    "llama_rotary_gqa": ("llama2-7b", [*TEXT, "attention.kv_heads=2", "mlp.hidden=48", "dtype=fp32"]),
    "sinusoidal": ("gpt2", [*TEXT, "mlp.hidden=64", "position=sinusoidal"]),
}
NEW = 8
LENGTHS = (7, 4)  # two prompts; the shorter is left-padded to the longer


def _batch(vocab: int, seed: int = 0, low: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Left-padded ids and mask [2, 7], and the rows' real tokens."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(max(low, 1), vocab - 1, n) for n in LENGTHS]
    width = max(LENGTHS)
    ids = np.zeros((len(rows), width), np.int64)  # pad id 0
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
    return ids, mask, rows


def _session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3  # not the warning about an initializer that is also an input (position_ids)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _logits(sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return sess.run(["logits"], feeds)[0]


def _generate(path: Path, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    m = OrtModel.open(path, "cpu", threads=1)
    feeds = {"input_ids": ids, **({"attention_mask": mask} if mask is not None else {})}
    return greedy(m, check(m, complete(m, feeds)), NEW)


def _spec(name: str) -> Any:
    return specc.load_spec(*DECODERS[name])


# ---------------------------------------------------------------------------------------------- contract


def test_position_ids_is_an_optional_input_of_decoder_graphs_only(tmp_path: Path) -> None:
    for kv in (False, True):
        model = onnx.load(str(export_onnx(_spec("gpt2_learned"), tmp_path / f"d{kv}.onnx", kv_cache=kv)))
        inputs = {i.name: i for i in model.graph.input}
        dims = [d.dim_param or d.dim_value for d in inputs["position_ids"].type.tensor_type.shape.dim]
        assert dims == ["batch", "sequence"]
        assert inputs["position_ids"].type.tensor_type.elem_type == onnx.TensorProto.INT64
        (default,) = [t for t in model.graph.initializer if t.name == "position_ids"]
        assert onnx.numpy_helper.to_array(default).tolist() == [[-1]]
        sess = _session(tmp_path / f"d{kv}.onnx")
        assert "position_ids" not in {i.name for i in sess.get_inputs()}  # existing callers need not feed it
        assert [i.name for i in sess.get_overridable_initializers()] == ["position_ids"]
    others = {
        "bert": ("bert-base", ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=20", "mlp.hidden=32"]),
        "enc_dec": ("transformer-base", ["blocks=1", "d_model=16", "attention.heads=2", "vocab_size=20"]),
    }
    for name, (preset, overrides) in others.items():
        model = onnx.load(str(export_onnx(specc.load_spec(preset, overrides), tmp_path / f"{name}.onnx")))
        assert "position_ids" not in {i.name for i in model.graph.input}, name
    m = OrtModel.open(tmp_path / "dTrue.onnx", "cpu", threads=1)
    spec = {s.name: s for s in m.inputs()}["position_ids"]
    assert spec.optional and spec.shape == ("batch", "sequence")


# ---------------------------------------------------------------------------------------------- forward


@pytest.mark.parametrize("name", list(DECODERS))
def test_left_padded_forward_equals_each_row_alone(tmp_path: Path, name: str) -> None:
    spec = _spec(name)
    sess = _session(export_onnx(spec, tmp_path / "m.onnx"))
    ids, mask, rows = _batch(spec.vocab_size)
    derived = _logits(sess, {"input_ids": ids, "attention_mask": mask})
    fed = _logits(sess, {"input_ids": ids, "attention_mask": mask, "position_ids": mask_positions(mask)})
    np.testing.assert_array_equal(derived, fed)  # in-graph rule == the runtime's
    for i, r in enumerate(rows):
        alone = _logits(sess, {"input_ids": r[None], "attention_mask": np.ones((1, len(r)), np.int64)})[0]
        np.testing.assert_allclose(derived[i, mask[i] == 1], alone, atol=1e-5, rtol=0)
    if name != "llama_rotary_gqa":  # (RoPE is shift-invariant: index positions give the same logits there)
        index = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
        wrong = _logits(sess, {"input_ids": ids, "attention_mask": mask, "position_ids": index})
        assert np.abs(wrong[1, mask[1] == 1] - derived[1, mask[1] == 1]).max() > 1e-2  # positions matter


def test_without_a_mask_positions_continue_from_the_past(tmp_path: Path) -> None:
    """padding_mask=False graphs (no attention_mask): past length + arange, as before."""
    spec = _spec("gpt2_learned")
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=True, padding_mask=False)
    ids = np.random.default_rng(5).integers(0, spec.vocab_size, (1, 6))
    torch_tokens = specc.build_torch(spec).generate(torch.from_numpy(ids), NEW)[:, -NEW:].numpy()
    np.testing.assert_array_equal(_generate(path, ids), torch_tokens)


# ---------------------------------------------------------------------------------------------- generation


@pytest.mark.parametrize("kv", [True, False], ids=["kv_cache", "recompute"])
@pytest.mark.parametrize("name", list(DECODERS))
def test_left_padded_greedy_equals_each_row_alone(tmp_path: Path, name: str, kv: bool) -> None:
    spec = _spec(name)
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=kv)
    ids, mask, rows = _batch(spec.vocab_size, seed=0)
    got = _generate(path, ids, mask)
    want = np.concatenate([_generate(path, r[None]) for r in rows])
    np.testing.assert_array_equal(got, want)
    assert all(len(set(row.tolist())) > 1 for row in want)  # varied continuations, not one repeated token


@pytest.mark.parametrize("name", list(DECODERS))
def test_cached_steps_derive_positions_from_the_mask(tmp_path: Path, name: str) -> None:
    """Fed no position_ids, the KV-cache graph reads them off the mask of past + new tokens: each step's
    last logits == the row alone, recomputed from scratch."""
    spec = _spec(name)
    sess = _session(export_onnx(spec, tmp_path / "m.onnx", kv_cache=True))
    names = [o.name for o in sess.get_outputs()]

    def empty(batch: int) -> dict[str, np.ndarray]:
        return {
            i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), np.float32)
            for i in sess.get_inputs()
            if i.name.startswith("past_key_values.")
        }

    ids, mask, rows = _batch(spec.vocab_size, seed=2)
    feeds, steps = {"input_ids": ids, "attention_mask": mask, **empty(2)}, []
    for _ in range(3):
        out = dict(zip(names, sess.run(None, feeds), strict=True))
        steps.append(out["logits"][:, -1])
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
        presents = {f"past_key_values.{k[len('present.') :]}": v for k, v in out.items() if k.startswith("present.")}
        feeds = {"input_ids": steps[-1].argmax(-1)[:, None], "attention_mask": mask, **presents}
    tokens = np.stack([s.argmax(-1) for s in steps], 1)
    for i, r in enumerate(rows):
        seq = np.concatenate([r, tokens[i, :-1]])[None]
        for t in range(3):
            n = len(r) + t
            alone = _logits(sess, {"input_ids": seq[:, :n], "attention_mask": np.ones((1, n), np.int64), **empty(1)})
            np.testing.assert_allclose(steps[t][i], alone[0, -1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- HF


@pytest.fixture(scope="module")
def hf_zoo(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("transformers")
    from test_hf_zoo import BY_ID, save

    from specc.interop import import_hf

    cache: dict[str, tuple[Any, Any, str]] = {}

    def get(case_id: str) -> tuple[Any, Any, str]:
        if case_id not in cache:
            hf, folder = save(BY_ID[case_id], tmp_path_factory.mktemp(case_id), std=0.3)
            cache[case_id] = (hf, import_hf(folder).spec, str(folder / "model.safetensors"))
        return cache[case_id]

    return get


HF_CASES = ["gpt2-tied", "llama-gqa"]


@pytest.mark.parametrize("case_id", HF_CASES)
def test_left_padded_forward_matches_hf(hf_zoo, case_id: str, tmp_path: Path) -> None:
    hf, spec, weights = hf_zoo(case_id)
    sess = _session(export_onnx(spec, tmp_path / "m.onnx", weights=weights))
    ids, mask, _ = _batch(hf.config.vocab_size, seed=3, low=3)
    got = _logits(sess, {"input_ids": ids, "attention_mask": mask})  # positions derived in-graph
    t_mask = torch.from_numpy(mask)
    position_ids = (t_mask.cumsum(-1) - 1).masked_fill(t_mask == 0, 1)  # what HF's generate passes
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(ids), attention_mask=t_mask, position_ids=position_ids).logits.numpy()
    keep = mask == 1
    np.testing.assert_allclose(got[keep], want[keep], atol=1e-4, rtol=0)


@pytest.mark.parametrize("case_id", HF_CASES)
def test_left_padded_greedy_with_kv_cache_matches_hf_generate(hf_zoo, case_id: str, tmp_path: Path) -> None:
    hf, spec, weights = hf_zoo(case_id)
    path = export_onnx(spec, tmp_path / "m.onnx", weights=weights, kv_cache=True)
    ids, mask, rows = _batch(hf.config.vocab_size, seed=4, low=3)
    hf.generation_config.update(eos_token_id=None, pad_token_id=0, do_sample=False, num_beams=1)
    with torch.no_grad():
        out = hf.generate(
            torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW, min_new_tokens=NEW
        )
    want = out[:, ids.shape[1] :].numpy()
    np.testing.assert_array_equal(_generate(path, ids, mask), want)
    np.testing.assert_array_equal(np.concatenate([_generate(path, r[None]) for r in rows]), want)
    assert all(len(set(row.tolist())) > 1 for row in want)


def test_specc_run_generates_a_left_padded_batch_row_by_row(cli, tmp_path: Path) -> None:
    spec = _spec("gpt2_learned")
    path = export_onnx(spec, tmp_path / "m.onnx", kv_cache=True)
    ids, mask, rows = _batch(spec.vocab_size)
    np.savez(tmp_path / "batch.npz", input_ids=ids, attention_mask=mask)
    code, out, err = cli("run", path, "--input", tmp_path / "batch.npz", "--generate", NEW, "--provider", "cpu")
    assert code == 0, err
    printed = out.split("tokens per row:")[1].split()
    want = np.concatenate([_generate(path, r[None]) for r in rows])
    assert [int(t) for t in printed[: 2 * NEW]] == want.ravel().tolist()
