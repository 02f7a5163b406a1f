"""build_torch: spec → layer graph → generated module classes → a model, refusing what will not fit."""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from ...errors import SpecError
from ...ir.graph import LayerGraph, eval_dim
from ...ir.lower import lower
from .layers import Model
from .layers.model import init_rule, param_owner
from .memory import Need, check_fits, init_transient, param_bytes
from .source import model_class
from .weights import read_weights

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64}


def as_graph(spec: Any) -> LayerGraph:
    """A LayerGraph from a graph, a validated spec, a spec dict, or a path / preset name."""
    if isinstance(spec, LayerGraph):
        return spec
    if isinstance(spec, (str, os.PathLike, dict)):
        from ...spec.loader import load_spec

        spec = load_spec(spec)
    return lower(spec)


def torch_dtype(dtype: str | torch.dtype | None, graph: LayerGraph) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise SpecError(f"dtype {dtype} is not a weight dtype", hint=f"use one of {', '.join(DTYPES)}")
        return dtype
    name = dtype or graph.meta.get("dtype", "fp32")
    if not isinstance(name, str) or name not in DTYPES:
        raise SpecError(f"unknown dtype {name!r}", hint=f"use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def torch_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a torch.device this process can allocate on (CPU by default); anything else is a SpecError."""
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise SpecError(f"device must be a name such as 'cpu' or 'cuda:1', not {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise SpecError(f"unknown device {str(device)!r}", hint="cpu | cuda | cuda:1 | meta") from None
    if dev.type in ("cpu", "meta"):
        return dev
    backend = getattr(torch, dev.type, None)
    count = getattr(backend, "device_count", lambda: 0)() if getattr(backend, "is_available", lambda: False)() else 0
    if count == 0 or (dev.index is not None and dev.index >= count):
        raise SpecError(
            f"device {dev} is not available on this machine"
            + (f" ({count} {dev.type} device{'s' if count != 1 else ''})" if count else ""),
            hint="cpu" + (f" | {dev.type}:0" if count else ""),
        )
    return dev


def build_torch(
    spec: Any,
    weights: str | os.PathLike[str] | dict[str, torch.Tensor] | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    accelerate: bool | None = None,
) -> Model:
    """``nn.Module`` for a spec (or LayerGraph), from Python source generated off the layer graph.

    The module tree is the scope tree (``blocks.3.attn.qkv`` is an ``nn.Linear``) and state_dict keys are the
    IR parameter names. The model is built on the meta device first; its parameter bytes are compared with
    the memory available on ``device`` and a model that does not fit is refused with a SpecError before
    anything is allocated. ``weights``: a .safetensors path (specc names, or a ``specc compile --target
    torch`` checkpoint), a sharded folder or index, or a dict of tensors; names pass through
    ``specc.interop.names.to_specc_names``. Without weights the parameters are initialised from the spec's
    seed. ``dtype`` defaults to the spec's; ``device`` to the CPU. ``accelerate`` (default: on unless
    ``SPECC_ACCEL=0``): the acceleration pass (``specc.backends.torch.accel``) is applied to the built model —
    on the CPU every linear layer runs the kernel measured fastest for its shape on this machine (plain
    F.linear for training, tracing, compiling and counting), decoding steps natively where measured faster,
    and ``generate(compile=True)`` compiles; off, the model is the plain module tree (the same logits; the
    pass can be undone later with ``model.plain()``). Returned in eval mode; ``model.graph`` is the layer graph
    it came from and ``type(model).SOURCE`` its generated source.
    """
    graph = as_graph(spec)
    cls = model_class(graph)
    dt = torch_dtype(dtype, graph)
    dev = torch_device(device)
    with torch.device("meta"):
        model = cls().to(dt)
    _check_against_graph(model, graph)
    if dev.type != "meta":
        transient = init_transient(model) if weights is None else load_transient(weights, dt, param_bytes(model))
        check_fits(model, dev, graph.meta.get("name", "model"), transient)
        if weights is not None:
            tensors = read_weights(weights, graph)
            model.load_state_dict({k: v.to(device=dev, dtype=dt) for k, v in tensors.items()}, assign=True)
        else:
            model.to_empty(device=dev)
            model.init_weights()
    model.graph = graph
    if not isinstance(accelerate, (bool, type(None))):
        raise SpecError(f"accelerate must be True, False or None (the SPECC_ACCEL switch), not {accelerate!r}")
    if accelerate or (accelerate is None and os.environ.get("SPECC_ACCEL", "1") != "0"):
        from .accel import accelerate as apply  # imported only when applied: a plain build loads none of it

        apply(model)  # from outside, as parallelize is: the generated tree stays plain
    return model.eval()


def load_transient(weights: str | os.PathLike[str] | dict[str, torch.Tensor], dtype: torch.dtype, kept: int) -> Need:
    """Loading holds every stored tensor (read whole, or the dict's clones) beside its cast to ``dtype`` until the
    model takes them: beyond the ``kept`` parameter bytes, that peak's excess. Stored sizes come from the
    safetensors headers (nothing is read); an unreadable source is left to the reader to name."""
    from ...interop.safetensors_read import DTYPES as STORED
    from ...interop.safetensors_read import headers

    if isinstance(weights, dict):
        sizes = [(v.numel() * v.element_size(), v.dtype) for v in weights.values() if isinstance(v, torch.Tensor)]
    else:
        try:
            sizes = [
                (t.end - t.start, getattr(torch, STORED[t.dtype][1]))
                for h, _ in headers(weights)
                for t in h.tensors.values()
            ]
        except (SpecError, OSError):  # ReadError included
            return Need(0)
    stored = sum(n for n, _ in sizes)
    cast = sum(n // max(1, t.itemsize) * dtype.itemsize for n, t in sizes if t != dtype)
    return Need(0, max(0, stored + cast - kept), "the stored tensors beside their casts while they load")


def _check_against_graph(model: Model, graph: LayerGraph) -> None:
    """The generated module must realise exactly the IR's parameters, initialised by the IR's rules."""
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = {k: tuple(p.shape) for k, p in graph.params().items()}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))
        raise AssertionError(f"torch backend parameters differ from the IR: {diff[:8]}")
    residual = re.compile(type(model).RESIDUAL)
    specs = graph.params()
    for name, _ in model.named_parameters():  # a tied parameter once, under its owner's name
        rule = init_rule(*param_owner(model, name))
        if rule == "normal" and residual.match(name):
            rule = "residual"
        if rule != specs[name].init:
            raise AssertionError(f"{name}: generated init rule {rule!r}, the IR says {specs[name].init!r}")


def example_inputs(graph: Any, batch: int = 1, length: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for the required inputs of a graph (or a built model): ids below the vocabulary, pixels
    ~ N(0, 1)."""
    graph = graph.graph if isinstance(graph, torch.nn.Module) else graph
    gen = torch.Generator().manual_seed(seed)
    sizes = {"B": batch, "N": length, "N_dec": length}
    out = {}
    for name, spec in graph.inputs.items():
        if spec.optional:
            continue
        dims = [eval_dim(d, sizes) for d in spec.shape]  # "2*N": Whisper's input frames
        if spec.dtype == "int64":
            vocab = graph.meta.get("target_vocab_size") if name == "decoder_input_ids" else None
            out[name] = torch.randint(0, vocab or graph.meta["vocab_size"], dims, generator=gen)
        else:
            out[name] = torch.randn(dims, generator=gen)
    return out
