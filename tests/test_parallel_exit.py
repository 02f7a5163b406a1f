"""Processes that ran a process group end without aborting (issue 27, item 5).

A rank that trained with FSDP2 on gloo and then exited normally aborted now and then ("terminate called
without an active exception", SIGABRT): the model's FSDP2 state outlives ``destroy_process_group`` and is
destroyed during interpreter finalization while gloo's C++ threads still run (measured with the script below
ending in a plain exit: 3 aborts in 12 torchrun launches, 2 in 10 with FSDP2 alone, none without it).
``launch.end_process`` runs the ``atexit`` handlers and leaves by ``os._exit``; the ranks below do what a
``--parallel`` run does and end so, several launches in a row.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

RANK = """\
import atexit, torch
from torch.distributed.fsdp import fully_shard
from specc.parallel import launch
torch.set_num_threads(1)
mesh = launch.init_mesh({"dp": 2, "tp": 1}, torch.device("cpu"))
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
for layer in model:
    fully_shard(layer, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
model(torch.randn(2, 8)).sum().backward()
atexit.register(print, "atexit ran", flush=False)  # end_process runs the handlers and flushes
launch.shutdown()
print("ended", launch.STARTED, end=" ")
launch.end_process(0)
"""

LAUNCHES = 3  # each ≈2 s of CPU per rank (torch's import); an unfixed exit aborts ≈1 launch in 5


def test_ranks_that_ran_fsdp2_on_gloo_end_with_exit_0_launch_after_launch(tmp_path) -> None:
    from test_parallel_torch import _free_port

    script = tmp_path / "rank.py"
    script.write_text(RANK)
    for launch in range(LAUNCHES):
        env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        env["OMP_NUM_THREADS"] = "1"
        procs = [
            subprocess.Popen(
                [sys.executable, str(script)],
                env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]
        for r, proc in enumerate(procs):
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"launch {launch}, rank {r}: exit {proc.returncode}\n{err[-2000:]}"
            assert out == "ended True atexit ran\n", (launch, r, out)
