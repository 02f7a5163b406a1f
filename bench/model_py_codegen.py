"""How long `specc compile -t python` takes to write model.py (the specialiser), per family.

    python bench/model_py_codegen.py            # every family of tests/test_torch_model_py.py, then 5 presets
    python bench/model_py_codegen.py --presets  # every preset alone (model.py's time and length per preset)

Each file is written once, in this process, from the same specs the model.py tests use; the times are wall
seconds on this CPU (printed first). Run it on two checkouts to compare a change to the code generator.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from cpu_info import cpu_model  # noqa: E402
from test_torch_model_py import CASES, EXTRA, _spec  # noqa: E402

import specc  # noqa: E402
from specc.backends.torch import write_model_py  # noqa: E402
from specc.spec.presets import preset_names  # noqa: E402

PRESETS = ("gpt2", "llama2-7b", "llama3.1-8b", "mixtral-8x7b", "t5-base")


def main() -> None:
    print(f"{cpu_model()}, torch {torch.__version__}")
    total = 0.0
    with tempfile.TemporaryDirectory() as out:
        every = "--presets" in sys.argv[1:]
        specs = [] if every else [(c, lambda c=c: _spec(c)) for c in [*CASES, *EXTRA]]
        specs += [(f"preset {p}", lambda p=p: specc.load_spec(p)) for p in (preset_names() if every else PRESETS)]
        for name, spec in specs:
            s = spec()
            t0 = time.perf_counter()
            path = write_model_py(s, Path(out) / "model.py")
            seconds = time.perf_counter() - t0
            total += seconds
            print(f"{name:32s} {seconds:6.1f} s  {len(path.read_text().splitlines()):4d} lines", flush=True)
    print(f"{'total':32s} {total:6.1f} s")


if __name__ == "__main__":
    main()
