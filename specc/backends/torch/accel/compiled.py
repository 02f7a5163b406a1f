"""Compiled KV-cache decoding: every one-token step through ``torch.compile`` over a static cache.

The cache is preallocated for ``max_len`` tokens (zeros, kept across calls of the same shape) and written in
place at a slot held in a tensor; attention reads the whole buffer (a sliding-window or chunked layer: its
window, gathered) under a mask built from that slot. So a step's shapes never change and it compiles once,
the way Hugging Face's StaticCache + ``torch.compile`` decode. The prompt (prefill) runs eagerly through the
same buffers; sampling stays eager too (the same generator draws as without compiling).

On CUDA the step is compiled with ``mode="reduce-overhead"`` (CUDA graphs); on the CPU with inductor and
``CPU_OPTIONS`` (see there why). Inductor builds and loads its kernels from ``TORCHINDUCTOR_CACHE_DIR``, by
default ``/tmp/torchinductor_$USER``, which another user can create first: specc points it at ``inductor/`` in
its own private cache (``specc.cache``) before compiling, unless it already names a private folder.
"""

from __future__ import annotations

import getpass
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .... import cache
from ..layers.attention import AlibiAttention, LatentAttention, SelfAttention
from ..layers.generation import GenerationError
from ..layers.rope import Temperature
from ..layers.state import KVCache, State

# Inductor options on the CPU: its defaults, by measurement (GPT-2 small, fp32, greedy 32 + 128 tokens, 2-core
# AMD EPYC, 2 threads, tokens/s against eager specc in the same run, near-idle machine): defaults 0.83×, freezing
# 0.89× (it folds the weights into the compiled code: weights changed in place later would be ignored), the
# decompose_mm pass (one-row matmuls as a fused multiply + reduction, size limits raised to cover every layer)
# slower than the defaults under load (0.65× vs 1.47× eager at 2 threads, 1.05× vs 1.16× at 1 thread) and 1.6×
# their compile time. Inductor calls MKL for the linears, where eager specc runs its kernels measured on this
# CPU (row-split / oneDNN GEMVs): on such a CPU compiled decoding pays off on CUDA, not here.
CPU_OPTIONS: dict[str, Any] = {}

BUCKET = 64  # static cache lengths are multiples of this
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def private_inductor_cache() -> Path:
    """Point inductor's cache at a folder only this user can write (read by inductor at each use). A folder the
    user chose is kept where it is private; torch's default is not a choice (importing torch._dynamo sets it)."""
    current = os.environ.get(INDUCTOR_ENV)
    if current and current != _torch_default() and cache.why_not_private(Path(current)) is None:
        return Path(current)
    where = cache.folder("inductor") or cache.temporary_folder("inductor")  # not private: this process's own
    os.environ[INDUCTOR_ENV] = str(where)
    return where


def _torch_default() -> str:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return os.path.abspath(default_cache_dir())
    except (ImportError, AttributeError):  # a torch without it: its documented default
        return os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")


class StaticCache(KVCache):
    """A KVCache whose buffers (zeros, one per attention layer) belong to ``decoder`` and outlive the call."""

    def __init__(self, max_len: int, inputs: dict[str, Any], decoder: CompiledDecoder):
        super().__init__(max_len, inputs)
        self.kv, self.decoder = decoder.kv, decoder

    def update(self, layer: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        old = self.kv.get(layer)
        if old is None or old[0].shape[0] != k.shape[0] or old[0].dtype != k.dtype:  # new batch size or dtype
            # zeros, not empty: a masked slot still enters softmax · V, and 0 · NaN would be NaN
            self.kv[layer] = tuple(t.new_zeros(*t.shape[:2], self.max_len, t.shape[3]) for t in (k, v))
            for t in self.kv[layer]:
                torch._dynamo.mark_static_address(t)  # CUDA graphs: a fixed address, mutated in place
        return super().update(layer, k, v)


class SlotCache(KVCache):
    """Inside the compiled step: writes the new keys/values at ``slot`` and returns every key a layer reads."""

    def __init__(self, kv: dict, slot: Tensor, keys: dict[nn.Module, Tensor | None]):
        super().__init__(0)
        self.kv, self.slot, self.keys = kv, slot, keys

    def update(self, layer: nn.Module, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        ck, cv = self.kv[layer]
        ck.index_copy_(2, self.slot, k)
        cv.index_copy_(2, self.slot, v)
        idx = self.keys[layer]
        return (ck, cv) if idx is None else (ck.index_select(2, idx), cv.index_select(2, idx))


def _kind(core: SelfAttention) -> tuple[str, int | None]:
    """(mask kind, how many cache slots one query can see at most, None: all)."""
    kind = "none" if core.mask == "padding" else core.mask
    span = core.window if kind == "sliding_window" else core.chunk if kind == "chunked" else None
    return kind, span


class CompiledDecoder:
    """The compiled one-token step of one model, and the static buffers it decodes over."""

    def __init__(self, model: Any, device: torch.device):
        if model.STEP_INPUT != "input_ids" or any(hasattr(m, "cell") for m in model.modules()):
            raise GenerationError(f"compiled decoding takes decoder-only attention models, not {type(model).__name__}")
        self.model, self.device = model, device
        self.cores = [m for m in model.modules() if isinstance(m, SelfAttention)]
        if any(isinstance(m, AlibiAttention) for m in self.cores):  # its masks here are boolean; ALiBi's a bias
            raise GenerationError("compiled decoding does not take ALiBi attention; decode without compile")
        if any(isinstance(m, LatentAttention) for m in model.modules()):  # its cache is the latent, not K/V slots
            raise GenerationError("compiled decoding does not take latent attention (MLA); decode without compile")
        if any(isinstance(m.rope, Temperature) for m in self.cores):  # it scales q by the step's index
            raise GenerationError(
                "compiled decoding does not take attention temperature tuning (Llama 4); decode without compile"
            )
        self.follow = model.META.get("positions_follow")
        self.kv: dict[nn.Module, tuple[Tensor, Tensor]] = {}
        self.max_len = 0  # of the buffers
        private_inductor_cache()
        if device.type == "cuda":
            self.fn = torch.compile(self.forward, mode="reduce-overhead", dynamic=False)
        else:
            self.fn = torch.compile(self.forward, options=CPU_OPTIONS, dynamic=False)

    def start(self, cache: KVCache) -> StaticCache:
        """A static cache in place of ``cache``, its length rounded up to a multiple of ``BUCKET`` (so that
        calls of similar lengths share one compilation); the buffers of the last call reused when they fit."""
        max_len = -(-cache.max_len // BUCKET) * BUCKET
        stale = any(k.is_inference() and not torch.is_inference_mode_enabled() for k, _ in self.kv.values())
        if self.max_len != max_len or stale:  # (inference tensors cannot be written outside inference mode)
            self.kv, self.max_len = {}, max_len
        for k, v in self.kv.values():
            k.zero_(), v.zero_()
        return StaticCache(max_len, cache.inputs, self)

    def step(self, cache: StaticCache, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """One token per row [B, 1] after the cache, through the compiled step; logits [B, 1, V]."""
        b, slot = tokens.shape[0], cache.length
        if mask is None:
            pad = torch.ones(b, cache.max_len, dtype=torch.bool, device=tokens.device)
            positions = torch.full((b, 1), slot, device=tokens.device)
        else:
            pad = F.pad(mask.bool(), (0, cache.max_len - mask.shape[1]), value=True)
            positions = (mask.long().sum(-1, keepdim=True) - 1).clamp(min=0) if self.follow else None
            positions = torch.full((b, 1), slot, device=tokens.device) if positions is None else positions
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        logits = self.fn(tokens.contiguous(), torch.tensor([slot], device=tokens.device), pad, positions)
        cache.length += 1
        return logits.clone() if self.device.type == "cuda" else logits  # CUDA graphs reuse the output buffer

    def forward(self, tokens: Tensor, slot: Tensor, pad: Tensor, positions: Tensor) -> Tensor:
        """The compiled step: the model's own forward over a state whose masks and positions are built here."""
        max_len = pad.shape[1]
        memo: dict[Any, Any] = {"positions": positions}
        slots: dict[Any, Tensor] = {}
        reads: dict[nn.Module, Tensor | None] = {}
        for core in self.cores:
            kind, span = _kind(core)
            key = ("mask", kind, core.window, core.prefix, core.chunk, False)  # AttentionCore.mask_for's memo key
            if key not in memo:
                slots[key] = self._slots(kind, span, slot, max_len)
                memo[key] = (self._allowed(core, kind, slots[key], slot, pad), False)
            reads[core] = None if span is None or span >= max_len else slots[key]  # None: the whole buffer
        state = State(SlotCache(self.kv, slot, reads), pad if self.follow else None, last_only=True)
        state.memo.update(memo)
        args = {"input_ids": tokens, "attention_mask": pad}
        return self.model(**{k: args.get(k) for k in self.model.INPUTS}, state=state)

    @staticmethod
    def _slots(kind: str, span: int | None, slot: Tensor, max_len: int) -> Tensor:
        """The cache slots a layer reads: all, or the ``span`` around the new token its window (chunk) covers."""
        if span is None or span >= max_len:
            return torch.arange(max_len, device=slot.device)
        first = slot - span + 1  # a chunk too: a left-padded row's chunk starts at its own first token
        return first.clamp(0, max_len - span) + torch.arange(span, device=slot.device)

    def _allowed(self, core: SelfAttention, kind: str, idx: Tensor, slot: Tensor, pad: Tensor) -> Tensor:
        """Which of the slots ``idx`` the new token attends to [B, 1, 1, S], as AttentionCore.mask_for decides."""
        k, q = idx[None, None, None, :], slot[:, None, None, None]
        if kind in ("prefix", "chunked") and self.follow:  # a row's prefix (chunks): from its first real token
            pos = (pad.long().cumsum(-1) - 1).clamp(min=0)
            k, q = pos[:, idx][:, None, None, :], pos.gather(1, slot.expand(len(pad), 1))[:, :, None, None]
        written = (idx <= slot)[None, None, None, :] & pad[:, idx][:, None, None, :]  # written, not padding
        allowed = core.allows(k, q) & written
        return allowed | ~allowed.any(-1, keepdim=True)
