"""How each weight initializer of an exported graph is made from the model's parameters, a bounded piece at a
time: the graph holds only a placeholder per weight (name, dtype, shape); ``stream.py`` runs these recipes as
the parameters arrive from their source and writes what they produce straight to the output file.

A recipe reads parameters through ``Param`` handles (rows of axis 0, in the source's dtype) and yields its
outputs in row chunks of about ``CHUNK_BYTES``: the first output in order, as it is made; any further (small)
outputs whole at the end. Kinds:
- ``Cast``: a parameter in the export dtype (fp16 / bf16 sources cast chunk by chunk, never through fp32 when
  the export dtype is theirs);
- ``Concat``: parameters joined along axis 0 (MultiHeadAttention's packed q|k|v bias);
- ``NBits``: a linear weight [N, K] (or one expert's slice of an [E, N, K] stack) quantized as onnxruntime's
  ``MatMulNBitsQuantizer`` does it, by the same C++ kernel (``quantize_matmul_4bits`` / ``_8bits``) on the same
  [K, N] layout, N rows at a time: every output channel is quantized on its own, so the bytes equal a
  whole-tensor run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

CHUNK_BYTES = 32 << 20  # fp32-equivalent bytes of one chunk (a few copies of it are alive at once)


class Param(Protocol):
    """A parameter as its source holds it."""

    shape: tuple[int, ...]
    dtype: Any  # numpy dtype (float32, float16, ml_dtypes.bfloat16)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of axis 0 (the whole tensor for a 0-d parameter)."""
        ...


@dataclass(frozen=True)
class Out:
    name: str
    dtype: Any  # numpy dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


Chunk = tuple[int, np.ndarray]  # (output index, the next rows of that output)
Read = Callable[[str], Param]


def pieces(p: Param, start: int, stop: int) -> list[np.ndarray]:
    """Rows ``start:stop`` of ``p`` as consecutive arrays (one, unless the parameter joins several sources)."""
    split = getattr(p, "pieces", None)
    return split(start, stop) if split is not None else [p.rows(start, stop)]


def row_chunks(rows: int, row_elems: int) -> Iterator[tuple[int, int]]:
    step = max(1, CHUNK_BYTES // max(1, 4 * row_elems))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


@dataclass(frozen=True)
class Cast:
    param: str
    out: Out

    @property
    def params(self) -> tuple[str, ...]:
        return (self.param,)

    @property
    def outs(self) -> tuple[Out, ...]:
        return (self.out,)

    def produce(self, read: Read) -> Iterator[Chunk]:
        p, shape = read(self.param), self.out.shape
        if not shape:
            yield 0, np.asarray(p.rows(0, 1)).astype(self.out.dtype).reshape(())
            return
        for a, b in row_chunks(shape[0], math.prod(shape[1:])):
            for piece in pieces(p, a, b):
                yield 0, np.ascontiguousarray(piece.astype(self.out.dtype, copy=False))


@dataclass(frozen=True)
class Concat:
    parts: tuple[str, ...]
    out: Out

    @property
    def params(self) -> tuple[str, ...]:
        return self.parts

    @property
    def outs(self) -> tuple[Out, ...]:
        return (self.out,)

    def produce(self, read: Read) -> Iterator[Chunk]:
        arrays = [read(n).rows(0, read(n).shape[0]).astype(self.out.dtype, copy=False) for n in self.parts]
        yield 0, np.ascontiguousarray(np.concatenate(arrays))


@dataclass(frozen=True)
class NBits:
    """B [N, K/block, block·bits/8] uint8 and scales [N, K/block] of weight ``param`` ([N, K], or expert
    ``expert`` of [E, N, K]) in the export dtype ``dtype``, symmetric, as MatMulNBits reads them."""

    param: str
    expert: int | None
    n: int
    k: int
    bits: int
    block: int
    dtype: Any
    b_name: str
    scales_name: str

    @property
    def params(self) -> tuple[str, ...]:
        return (self.param,)

    @property
    def k_blocks(self) -> int:
        return (self.k + self.block - 1) // self.block

    @property
    def outs(self) -> tuple[Out, ...]:
        blob = self.block * self.bits // 8
        return (
            Out(self.b_name, np.uint8, (self.n, self.k_blocks, blob)),
            Out(self.scales_name, self.dtype, (self.n, self.k_blocks)),
        )

    def produce(self, read: Read) -> Iterator[Chunk]:
        p = read(self.param)
        whole = p.rows(self.expert, self.expert + 1)[0] if self.expert is not None else None
        scales = []
        for a, b in row_chunks(self.n, self.k):
            for w in [whole[a:b]] if whole is not None else pieces(p, a, b):  # output rows are independent
                packed, s = quantize_rows(w.astype(self.dtype, copy=False), self.bits, self.block)
                scales.append(s)
                yield 0, packed
        yield 1, np.concatenate(scales)


def quantize_rows(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's blockwise symmetric quantization (``DefaultWeightOnlyQuantizer.qbits_block_quant``) of the
    MatMul weight ``wᵀ`` [K, N]: packed [N, K/block, blob] and scales [N, K/block]."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    n, k = w.shape
    weight = np.ascontiguousarray(w.T)  # [K, N], as the quantizer hands it to the kernel
    k_blocks = (k + block - 1) // block
    if k_blocks * block > k:
        weight = np.pad(weight, ((0, k_blocks * block - k), (0, 0)), "constant")
    blob = (block * bits + 7) // 8
    packed = np.zeros((n, k_blocks, blob), dtype=np.uint8)
    zero_point = np.zeros((n, (k_blocks + 8 // bits - 1) // (8 // bits)), dtype=np.uint8)
    scales = np.zeros((n, k_blocks), dtype=weight.dtype)
    kernel = quantize_matmul_8bits if bits == 8 else quantize_matmul_4bits
    kernel(packed, weight, scales, zero_point, block, n, k, True)
    return packed, scales


Recipe = Cast | Concat | NBits
