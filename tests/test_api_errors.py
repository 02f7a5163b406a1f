"""Misuse of the Python API is a SpecError that says what to pass, never a raw error from deep inside torch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import specc
from specc.errors import SpecError

TINY = {"extends": "gpt2", "blocks": 1, "d_model": 16, "attention": {"heads": 2}, "vocab_size": 50, "context": 16}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": torch.int8}, r"dtype torch.int8 is not a weight dtype"),
        ({"dtype": torch.bool}, r"dtype torch.bool is not a weight dtype"),
        ({"dtype": 3}, r"unknown dtype 3"),
        ({"device": "tpu:9"}, r"unknown device 'tpu:9'"),
        ({"device": 3}, r"device must be a name such as 'cpu'"),
        ({"device": "cpu:x"}, r"unknown device 'cpu:x'"),
    ],
)
def test_build_torch_refuses_what_it_cannot_build(kwargs: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        specc.build_torch(TINY, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_a_device_this_machine_lacks_is_named() -> None:
    with pytest.raises(SpecError, match=r"device cuda:1 is not available on this machine"):
        specc.build_torch(TINY, device="cuda:1")


@pytest.mark.parametrize("mesh", [None, "dp=2", 2])
def test_parallelize_takes_a_device_mesh(mesh: object) -> None:
    with pytest.raises(SpecError, match=r"parallelize takes a DeviceMesh, not"):
        specc.parallelize(specc.build_torch(TINY), mesh)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_parallelizing_twice_or_with_odd_flags_is_refused() -> None:
    from test_parallel_torch import _free_port
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        with pytest.raises(SpecError, match=r"sequence_parallel must be True or False, not 'yes'"):
            specc.parallelize(specc.build_torch(TINY), mesh, sequence_parallel="yes")
        model = specc.parallelize(specc.build_torch(TINY), mesh)
        with pytest.raises(SpecError, match=r"this model is already parallelized"):
            specc.parallelize(model, mesh)
    finally:
        dist.destroy_process_group()
