"""specc's native decoding step (decode_native.cpp): a decoder's layer graph lowered to a program of native ops
that runs one token in one call, for fp32 models at batch 1.

``stepper(model)`` plans the program once per model from its layer graph (``model.graph``) and its own tensors
(weights, and the KV cache tensors of each call); the program holds raw pointers to them, so it is re-planned
when a parameter's storage moves. A step runs natively only where it computes what the eager step computes:
a one-token step of one sequence with no padding, in eval mode without autograd, no hooks on any module, no
torch function or dispatch mode (FLOP counters, tracing), no attention maps being recorded, a plain KVCache the
prefill filled. Anything else steps eagerly, and ``stepper`` returns None for graphs with an op kind, an
attribute or a dtype the program has no op for (``why_not(model)`` says which).

Like every kernel choice here it is measured: the first native-capable step of a model times both steps
(rewinding the cache between them) and keeps the faster one for that model (``choice`` / ``timings``).
"""

from __future__ import annotations

import ctypes
import time
import weakref
from typing import Any

import torch
from torch import Tensor, nn

from ..layers.rope import by_length
from ..layers.state import KVCache
from . import kernels_native
from .modules import FastForward

# The one definition of the native program's vocabulary, held against decode_native.cpp (its ``enum Code``,
# ``enum Fn`` and ``struct Op``) and the op catalogue by tests/test_registries.py:
# op kind of the layer graph → the native op that computes it (None: identity in eval, the same slot)
KINDS: dict[str, str | None] = {
    "embedding": "embed",
    "learned_pos": "position",
    "layernorm": "layernorm",
    "rmsnorm": "rmsnorm",
    "slice_rmsnorm": "slice_rmsnorm",
    "linear": "linear",
    "attention": "attention",
    "add": "add",
    "activation": "act",
    "glu": "glu",
    "scale": "scale",
    "softcap": "softcap",
    "dropout": None,
}
CODES = tuple(dict.fromkeys(code for code in KINDS.values() if code))  # decode_native.cpp's Code, in order
FNS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "tanh": 4}  # decode_native.cpp's Fn
MAX_HEAD_DIM = 1024  # decode_native.cpp's per-head scratch
_REPS = 3  # timed steps of each kind at the first native-capable step


class _Op(ctypes.Structure):  # decode_native.cpp's Op, field for field
    _fields_ = [
        ("code", ctypes.c_int32), ("fn", ctypes.c_int32), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
        ("in0", ctypes.c_int64), ("in1", ctypes.c_int64), ("out", ctypes.c_int64),
        ("w", ctypes.c_void_p), ("b", ctypes.c_void_p), ("eps", ctypes.c_float), ("scale", ctypes.c_float),
        ("heads", ctypes.c_int32), ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
        ("rope_dims", ctypes.c_int32), ("window", ctypes.c_int64), ("chunk", ctypes.c_int64),
        ("kc", ctypes.c_void_p), ("vc", ctypes.c_void_p), ("rope", ctypes.c_void_p), ("softcap", ctypes.c_float),
        ("start", ctypes.c_int64), ("span", ctypes.c_int64), ("group", ctypes.c_int64),
    ]  # fmt: skip


class Unsupported(Exception):
    """The graph has something the native program cannot compute exactly as the eager step does."""


class Program:
    """A model's graph as native ops, the tensors they point into, and the per-cache parts (KV, RoPE tables)."""

    def __init__(self, model: nn.Module):
        self.ops: list[_Op] = []  # the model itself is not held: the plan is kept in a weak table by model
        self.params: list[tuple[dict[str, Any], str, Tensor, int]] = []  # (owner's table, name, parameter, ptr)
        self.cores: list[tuple[int, nn.Module]] = []  # (op index, attention core): the cache each step reads
        self.slots: dict[str, int] = {}  # value name → arena offset (floats)
        self.size, self.vocab, self.positions = 0, 0, 1 << 62  # token ids and positions the tables cover
        graph, self.modules, self.forward = model.graph, _watched(model), type(model.__dict__.get("forward"))
        if set(graph.inputs) - {"input_ids", "attention_mask"} or list(graph.outputs) != ["logits"]:
            raise Unsupported(f"inputs {sorted(graph.inputs)} and outputs {sorted(graph.outputs)}")
        foreign = _not_as_built(model)
        if foreign:
            raise Unsupported(foreign)
        result = graph.outputs["logits"]
        for op in graph.ops():
            self._lower(model, op, result == op.name)
        self.width = int(graph.op(result).shape[-1])
        self.arena = torch.zeros(max(self.size, 1))
        self.table = (_Op * len(self.ops))(*self.ops)
        self.bound: tuple[int, ...] | None = None  # which cache (and KV tensors) the table points at now
        self.held: tuple[Any, ...] = ()  # what the table points into for it: KV tensors, RoPE tables
        self.scores = torch.empty(0)  # attention scratch: heads × the cache's max length

    # ---------------------------------------------------------------------------------------- lowering

    def _param(self, m: nn.Module, name: str, shape: tuple[int, ...]) -> int | None:
        """The pointer to parameter ``name`` of ``m`` (None where the module has it as None), watched: a step
        checks it is still that parameter with that storage."""
        owner_name, _, local = name.rpartition(".")
        owner = m.get_submodule(owner_name)
        t = owner._parameters.get(local)
        if t is None:
            return None
        if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
            raise Unsupported(f"{name}: a {t.dtype} {t.device.type} tensor (fp32 CPU contiguous only)")
        if tuple(t.shape) != shape:
            raise Unsupported(f"{name}: shape {tuple(t.shape)}, not {shape}")
        self.params.append((owner._parameters, local, t, t.data_ptr()))
        return t.data_ptr()

    def _slot(self, name: str, width: int) -> int:
        self.slots[name] = self.size
        self.size += width
        return self.slots[name]

    def _emit(self, code: str, name: str, width: int, inputs: tuple[str, ...], last: bool, **fields: Any) -> None:
        ins = [self.slots[i] for i in inputs if i in self.slots]
        op = _Op(code=CODES.index(code), n=width, in0=ins[0] if ins else -1, in1=ins[1] if len(ins) > 1 else -1)
        for key, value in fields.items():
            setattr(op, key, value)
        op.out = -1 if last else self._slot(name, width)
        self.ops.append(op)

    def _lower(self, m: nn.Module, op: Any, last: bool) -> None:
        a, kind = op.attrs, op.kind
        width = op.shape[-1]
        if not isinstance(width, int):
            raise Unsupported(f"{op.name}: a symbolic width")
        if kind == "dropout":  # identity in eval: the same slot
            self.slots[op.name] = self.slots[op.inputs[0]]
            return
        if kind == "embedding":
            if op.inputs != ("input_ids",):
                raise Unsupported(f"{op.name}: embeds {op.inputs}")
            w = self._param(m, a.tied_to or f"{op.name}.weight", (a.vocab, width))
            self.vocab = a.vocab
            self._emit("embed", op.name, width, (), last, w=w, scale=float(a.scale))
        elif kind == "learned_pos":
            if a.offset:  # rows before position 0 and padded slots reading one of them: the eager step
                raise Unsupported(f"{op.name}: a position table with {a.offset} leading rows")
            w = self._param(m, f"{op.name}.weight", (a.positions, width))
            self.positions = min(self.positions, a.positions)
            self._emit("position", op.name, width, op.inputs, last, w=w, k=a.positions)
        elif kind in ("layernorm", "rmsnorm", "slice_rmsnorm"):
            self._norm(m, op, width, last)
        elif kind == "linear":
            n_in, n_out = a.in_features, a.out_features
            w = self._param(m, a.tied_to or f"{op.name}.weight", (n_out, n_in))
            b = self._param(m, f"{op.name}.bias", (n_out,))
            self._emit("linear", op.name, width, op.inputs, last, w=w, b=b, k=n_in)
        elif kind == "attention":
            self._attention(op, m.get_submodule(op.name), width, last)
        elif kind == "add":
            self._emit(KINDS[kind], op.name, width, op.inputs, last, fn=0)
        elif kind in ("activation", "glu") and a.fn in FNS:
            self._emit(KINDS[kind], op.name, width, op.inputs, last, fn=FNS[a.fn])
        elif kind == "scale":
            self._emit("scale", op.name, width, op.inputs, last, scale=float(a.factor))
        elif kind == "softcap":
            self._emit("softcap", op.name, width, op.inputs, last, scale=float(a.cap))
        else:
            raise Unsupported(f"{op.name}: op kind {kind}{' ' + a.fn if kind in ('activation', 'glu') else ''}")

    def _norm(self, m: nn.Module, op: Any, width: int, last: bool) -> None:
        a = op.attrs
        fields = {"eps": float(a.eps), "fn": int(op.kind != "layernorm" and a.unit_offset)}
        if op.kind == "slice_rmsnorm":  # groups of `dim` features in [start, start + width)
            fields.update(start=a.start, span=a.width, group=a.dim)
        group = a.dim if op.kind == "slice_rmsnorm" else width
        w = self._param(m, f"{op.name}.weight", (group,))
        if w is None:
            raise Unsupported(f"{op.name}: a norm without a weight")
        b = self._param(m, f"{op.name}.bias", (width,))
        self._emit(op.kind, op.name, width, op.inputs, last, w=w, b=b, **fields)

    def _attention(self, op: Any, core: nn.Module, width: int, last: bool) -> None:
        a = op.attrs
        mask, heads, kv_heads, head_dim, rope_dims = a.mask, a.heads, a.kv_heads, a.head_dim, a.rope_dims
        if a.cross or mask not in ("causal", "sliding_window", "chunked"):
            raise Unsupported(f"{op.name}: {'cross-attention' if a.cross else f'mask {mask}'}")
        if a.alibi_max_bias is not None or a.sinks:
            raise Unsupported(f"{op.name}: {'ALiBi' if a.sinks is False else 'attention sinks'}")
        if a.temperature_floor is not None:  # q scaled by its position's factor: the eager step does it
            raise Unsupported(f"{op.name}: attention temperature tuning")
        if rope_dims and (by_length(a.rope_scaling) or rope_dims % 2):
            raise Unsupported(f"{op.name}: RoPE scaling {a.rope_scaling} follows the length")
        if head_dim > MAX_HEAD_DIM or heads % kv_heads:
            raise Unsupported(f"{op.name}: head_dim {head_dim}, {heads}/{kv_heads} heads")
        self.cores.append((len(self.ops), core))
        self._emit("attention", op.name, width, op.inputs[:1], last, fn=int(bool(a.rope_interleaved)),
                   heads=heads, kv_heads=kv_heads, head_dim=head_dim, rope_dims=rope_dims,
                   window=(a.window or 0) if mask == "sliding_window" else 0,
                   chunk=(a.chunk or 0) if mask == "chunked" else 0,
                   scale=float(a.scale), softcap=float(a.softcap or 0.0))  # fmt: skip

    # ---------------------------------------------------------------------------------------------- steps

    def check(self, model: nn.Module) -> str:
        """``"hooked"`` where a forward hook is registered; "stale" where the module tree or a parameter the
        program points at is no longer the one planned (another module, parameter or storage); else "ok"."""
        from torch.nn.modules import module as base

        if base._global_forward_hooks or base._global_forward_pre_hooks:
            return "hooked"
        if model._forward_hooks or model._forward_pre_hooks:
            return "hooked"
        if type(model.__dict__.get("forward")) is not self.forward:
            return "stale"
        for table, key, child, forward in self.modules:
            if table.get(key) is not child or type(child.__dict__.get("forward")) is not forward:
                return "stale"
            if child._forward_hooks or child._forward_pre_hooks:
                return "hooked"
        for table, key, param, ptr in self.params:
            if table.get(key) is not param or param.data_ptr() != ptr:
                return "stale"
        return "ok"

    def bind(self, cache: KVCache) -> bool:
        """Point the attention ops at ``cache``'s tensors (and RoPE tables for its length); False where the
        cache is not one the program can read (not filled by a prefill, another layout)."""
        kv = [cache.kv.get(core) for _, core in self.cores]
        key = (id(cache), cache.max_len, *(id(t) for pair in kv if pair for t in pair))
        if self.bound == key:
            return True
        tables: dict[Any, Tensor] = {}
        for (i, core), pair in zip(self.cores, kv, strict=True):
            shape = (1, core.kv_heads, cache.max_len, core.head_dim)
            if pair is None or any(t.dtype != torch.float32 or tuple(t.shape) != shape or not t.is_contiguous()
                                   for t in pair):  # fmt: skip
                return False
            op = self.table[i]
            op.kc, op.vc, op.k = pair[0].data_ptr(), pair[1].data_ptr(), cache.max_len
            if core.rope is not None:
                rope = core.rope
                if rope.key not in tables:  # this core's own tables, at every position the cache holds
                    cos, sin = rope.tables(torch.arange(cache.max_len)[None], torch.float32)
                    tables[rope.key] = torch.cat((cos, sin), -1).reshape(cache.max_len, rope.dims).contiguous()
                op.rope = tables[rope.key].data_ptr()
        self.scores = torch.empty(max([core.heads for _, core in self.cores] or [1]) * cache.max_len)
        self.bound, self.held = key, (kv, tables)
        return True

    def run(self, cache: KVCache, token: int) -> Tensor:
        """Logits [1, 1, V] of ``token`` at position ``cache.length`` (written into the cache; not advanced)."""
        logits = torch.empty(1, 1, self.width)
        _entry()(self.table, len(self.ops), self.arena.data_ptr(), self.scores.data_ptr(), logits.data_ptr(),
                 token, cache.length, torch.get_num_threads())  # fmt: skip
        return logits


class Stepper:
    """A model's native step, with the measured choice between it and the eager step."""

    def __init__(self, model: nn.Module):
        self.program = Program(model)
        self.choice: str | None = None  # "native" | "eager" once measured
        self.timings: dict[str, float] = {}

    def usable(self, model: nn.Module, cache: Any, tokens: Tensor, mask: Tensor | None) -> bool:
        """Whether a native step of ``model`` computes exactly what its eager step would, for this call."""
        if type(cache) is not KVCache or tuple(tokens.shape) != (1, 1) or tokens.device.type != "cpu":
            return False
        if model.training or cache.length >= min(cache.max_len, self.program.positions):
            return False
        if not 0 <= int(tokens[0, 0]) < self.program.vocab or (mask is not None and not bool(mask.all())):
            return False  # out of the table: the eager step raises
        if torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()):
            return False
        if _modes_active() or any("product" in core.__dict__ for _, core in self.program.cores):  # maps, math
            return False
        state = self.program.check(model)
        if state == "stale":
            try:
                self.program = Program(model)
            except Unsupported:
                return False
            state = self.program.check(model)
        if state != "ok":
            return False
        return self.program.bind(cache)

    def step(self, cache: KVCache, tokens: Tensor, eager: Any) -> Tensor:
        """One step, natively or by ``eager()``, as measured at the first call; the cache advanced by one."""
        if self.choice is None:
            self._measure(cache, tokens, eager)
        if self.choice == "eager":
            return eager()
        logits = self.program.run(cache, int(tokens[0, 0]))
        cache.length += 1
        return logits

    def _measure(self, cache: KVCache, tokens: Tensor, eager: Any) -> None:
        token = int(tokens[0, 0])
        runs = {"eager": eager, "native": lambda: self.program.run(cache, token)}
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(_REPS):  # both write the same position's keys and values: each run starts from it
            for kind, run in runs.items():
                start, length = time.perf_counter(), cache.length
                run()
                times[kind].append(time.perf_counter() - start)
                cache.length = length
        self.timings = {f"{k}_s": min(v) for k, v in times.items()}
        self.choice = min(runs, key=lambda k: self.timings[f"{k}_s"])


# model → (its stepper or None, why not): outside the module, so copies, pickles and state dicts never carry
# raw pointers, and a model's plan goes with it
_PLANS: weakref.WeakKeyDictionary[nn.Module, tuple[Stepper | None, str]] = weakref.WeakKeyDictionary()


def stepper(model: nn.Module) -> Stepper | None:
    """The model's native stepper (planned at the first call), or None where it has none (``why_not``)."""
    if model not in _PLANS:
        made, why = None, ""
        try:
            if getattr(model, "graph", None) is None:
                why = "no layer graph"
            elif _entry() is None:
                why = kernels_native.status()
            else:
                made = Stepper(model)
        except Unsupported as e:
            why = str(e)
        _PLANS[model] = (made, why)
    return _PLANS[model][0]


def why_not(model: nn.Module) -> str:
    """Why ``model`` has no native step ('' where it has one)."""
    stepper(model)
    return _PLANS[model][1]


def _watched(model: nn.Module) -> list[tuple[dict[str, Any], str, nn.Module, type]]:
    """Every module of the tree as (its parent's module table, its key, the module, the type of its instance-level
    forward): what a step checks is unchanged (specc's measured-kernel routing sets a forward that computes the
    same linear; a module swapped in or a forward replaced makes the plan stale)."""
    out: list[tuple[dict[str, Any], str, nn.Module, type]] = []  # the model itself: check() reads it directly
    for parent in model.modules():
        for key, child in parent._modules.items():
            if child is not None:
                out.append((parent._modules, key, child, type(child.__dict__.get("forward"))))
    return out


def _not_as_built(model: nn.Module) -> str | None:
    """The first module that is not the one the model's generated class builds for the layer graph (a quantized or
    LoRA linear, a checkpoint wrapper, a module swapped in by hand, a forward replaced), if any: the tree is held
    against a twin of the same class on the meta device (built without memory or random draws)."""
    try:
        with torch.device("meta"):
            twin = dict(type(model)().named_modules())
    except Exception as e:  # a class that cannot be rebuilt bare: nothing to hold the tree against
        return f"{type(model).__name__} cannot be rebuilt to check its modules ({type(e).__name__})"
    for name, m in model.named_modules():
        forward = m.__dict__.get("forward")
        if (
            name not in twin
            or type(m) is not type(twin[name])
            or (forward is not None and type(forward) is not FastForward)
        ):
            return f"{name or 'the model'}: a {type(m).__module__}.{type(m).__name__}"
    return None


def _modes_active() -> bool:
    """Whether a torch function or dispatch mode is active (FLOP counting, tracing) or torch.compile traces;
    private torch calls, so where they are missing every step counts as inside a mode (eager)."""
    try:
        return (
            torch.compiler.is_compiling()
            or torch._C._is_torch_function_mode_enabled()
            or torch._C._len_torch_dispatch_stack() > 0
        )
    except AttributeError:
        return True


def _entry() -> Any:
    lib = kernels_native.library()
    if lib is None:
        return None
    fn = lib.specc_decode_step
    if fn.argtypes is None:
        if lib.specc_decode_op_size() != ctypes.sizeof(_Op):
            raise RuntimeError("decode_native.cpp's Op and decode_native.py's _Op differ")
        fn.argtypes = [ctypes.POINTER(_Op), ctypes.c_int, *[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 2, ctypes.c_int]
        fn.restype = None
    return fn
