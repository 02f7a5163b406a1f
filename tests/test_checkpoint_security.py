"""Distributed checkpoint folders are data: no pickle is read from one (a planted ``.metadata`` runs nothing and is
refused unless ``--trust-pickled-checkpoint``), and a damaged folder is one located line and exit 2 on every path
that reads one (``generate DIR``, ``train --resume DIR`` with and without ``--parallel``)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

TINY = ["--set", "blocks=1", "--set", "d_model=32", "--set", "attention.heads=4", "--set", "attention.kv_heads=2"]
TINY += ["--set", "mlp.hidden=48", "--set", "dtype=fp32"]


@pytest.fixture(autouse=True)
def _plain_kernels(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECC_KERNELS", "torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder from ``specc train --parallel dp=1`` (one process, no torchrun): step 1, with Adam moments."""
    from specc.cli import run

    base = tmp_path_factory.mktemp("good")
    text = base / "text.txt"
    text.write_text("pack my box with five dozen liquor jugs " * 4, encoding="utf-8")
    args = ["train", "llama2-7b", *TINY, "--task", "lm", "--text", text, "--batch", "2", "--max-len", "8"]
    args += ["--eval-size", "2", "--steps", "1", "--device", "cpu", "--parallel", "dp=1", "-o", base / "ck"]
    assert run([str(a) for a in args]) == 0
    return base / "ck"


def _copy(good: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "ck"
    shutil.copytree(good, folder)  # makes tmp_path too
    return folder


def _refused(result: tuple[int, str, str], *needles: str) -> str:
    code, _, err = result
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err  # the error line and a hint
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def _paths(cli: Any, folder: Path, tmp_path: Path, *more: str) -> list[tuple[int, str, str]]:
    """The commands that read a folder: generate, resume in one process, resume on a mesh, attention-map."""
    return [
        cli("generate", folder, "-p", "1 2", "-n", "2", *more),
        cli("train", "--resume", folder, "--steps", "3", "--device", "cpu", "-o", tmp_path / "o.safetensors", *more),
        cli("train", "--resume", folder, "--steps", "3", "--parallel", "dp=1", "-o", tmp_path / "o", *more),
        cli("attention-map", folder, "-i", "1 2", "-o", tmp_path / "map.png", *more),
    ]


# ---------------------------------------------------------------------------------------------- pickle


class _Plant:
    """Unpickling this creates ``marker``: what a hostile .metadata would do, made harmless."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_runs_nothing_and_is_refused(cli, good: Path, tmp_path: Path) -> None:
    folder = _copy(good, tmp_path)
    marker = tmp_path / "pwned"
    (folder / ".metadata").write_bytes(pickle.dumps(_Plant(marker)))
    for result in _paths(cli, folder, tmp_path):
        _refused(result, ".metadata", "older specc", "--trust-pickled-checkpoint")
    from specc.errors import SpecError
    from specc.parallel import sharded_checkpoint as distributed

    for call in (lambda: distributed.load(folder), lambda: distributed.has_optimizer(folder)):
        with pytest.raises(SpecError, match="pickle format"):
            call()
    assert not marker.exists()
    # the opt-in does read the pickle: the file above would have run had it been read
    cli("generate", folder, "-p", "1 2", "-n", "2", "--trust-pickled-checkpoint")
    assert marker.exists()


def test_a_folder_of_an_older_specc_reads_only_when_trusted(cli, good: Path, tmp_path: Path) -> None:
    """Written the old way (DCP's FileSystemWriter: pickled .metadata, __0_0.distcp): refused by default,
    read with the flag, and resaved by a resumed run in the data-only format."""
    import torch.distributed.checkpoint as dcp

    from specc.parallel import sharded_checkpoint as distributed

    ck = distributed.load(good)
    old = tmp_path / "old"
    with pytest.warns(UserWarning):  # "assuming the intent is to save in a single process"
        dcp.save(dict(ck.weights), checkpoint_id=old, no_dist=True)
    meta = json.loads((good / "specc.json").read_text())
    meta = {k: v for k, v in meta.items() if k in ("specc.spec", "specc.train", "specc.version")}
    (old / "specc.json").write_text(json.dumps(meta))
    assert (old / ".metadata").exists() and list(old.glob("*.distcp"))
    want = cli("generate", good, "-p", "1 2", "-n", "3")
    assert want[0] == 0, want[2]
    for result in _paths(cli, old, tmp_path):
        _refused(result, "older specc")
    assert cli("generate", old, "-p", "1 2", "-n", "3", "--trust-pickled-checkpoint")[:2] == want[:2]
    code, _, err = cli(
        "train", "--resume", old, "--steps", "2", "--parallel", "dp=1", "--trust-pickled-checkpoint",
        "-o", tmp_path / "new",
    )  # fmt: skip
    assert code == 0, err
    assert not (tmp_path / "new" / ".metadata").exists() and distributed.load(tmp_path / "new").step == 2


# ---------------------------------------------------------------------------------------------- damage


def _index(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "specc.json").read_text())


def _edit_index(folder: Path, edit: Any) -> None:
    meta = _index(folder)
    edit(meta["specc.shards"]["tensors"])
    (folder / "specc.json").write_text(json.dumps(meta))


def _first(tensors: dict[str, Any]) -> dict[str, Any]:
    return tensors[sorted(tensors)[0]]


SHARD = "shard-00000.safetensors"


def _nan_data(folder: Path) -> None:
    """Every data byte of the shard 0xff (NaN as float32), its header kept."""
    raw = bytearray((folder / SHARD).read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    raw[start:] = b"\xff" * (len(raw) - start)
    (folder / SHARD).write_bytes(bytes(raw))


INDEX = "specc.json"
DAMAGE = {  # kind: [(damage, what the message names)]
    "shard": [
        (lambda f: (f / SHARD).unlink(), SHARD),
        (lambda f: os.truncate(f / SHARD, (f / SHARD).stat().st_size // 2), SHARD),
        (lambda f: (f / SHARD).write_bytes(os.urandom((f / SHARD).stat().st_size)), SHARD),
        (lambda f: (f / SHARD).write_bytes(b""), SHARD),
        (lambda f: ((f / SHARD).unlink(), os.mkfifo(f / SHARD)), SHARD),  # never opened: no hang
        (lambda f: ((f / SHARD).unlink(), (f / SHARD).mkdir()), SHARD),
        (_nan_data, "NaN"),  # a valid header over data that is not weights
    ],
    "index file": [
        (lambda f: (f / INDEX).unlink(), "no specc.json"),
        (lambda f: (f / INDEX).write_bytes(os.urandom(300)), INDEX),
        (lambda f: os.truncate(f / INDEX, (f / INDEX).stat().st_size // 2), INDEX),
        (lambda f: (f / INDEX).write_bytes(b""), INDEX),
    ],
    "index entries": [
        (lambda f: _edit_index(f, lambda t: t.clear()), "lists no tensors"),
        (lambda f: _edit_index(f, lambda t: t.update({"x": 1})), INDEX),
        (lambda f: _edit_index(f, lambda t: _first(t)["pieces"][0]["shape"].__setitem__(0, 1)), "do not cover"),
        (lambda f: _edit_index(f, lambda t: _first(t)["pieces"].append(_first(t)["pieces"][0])), "overlap"),
        (lambda f: _edit_index(f, lambda t: _first(t)["pieces"][0].__setitem__("file", f"../{SHARD}")), "shard-NNNNN"),
        (lambda f: _edit_index(f, lambda t: t.pop(sorted(t)[0])), "does not hold what the index says"),
    ],
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_folder_is_one_line_naming_the_file_on_every_path(cli, good: Path, tmp_path: Path, kind: str) -> None:
    for i, (damage, needle) in enumerate(DAMAGE[kind]):
        folder = _copy(good, tmp_path / str(i))
        damage(folder)
        for result in _paths(cli, folder, tmp_path):
            _refused(result, needle)
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.safetensors").exists()
