"""The packed linear layer on integer dot products (``quant_int8.c``): each row of the
activations rounded to int8 per block of 32 inputs (16 where the weight's group is 16), with
an fp32 scale (Q8_0, as llama.cpp quantizes its activations), times the 4-bit or 8-bit codes
in integer sums, each block's sums scaled in fp32. The result is the product of the
dequantized weights with the rounded activations, not bit for bit the FMA path
(``quant_linear``); the rounding moves each activation by at most max|a| / 254 of its block.

Kernels where the build targets them: AVX-512 VNNI (``isa() == 2``) or AVX2 (1, 4-bit codes
from ``gemm_rows()`` rows on, else the few-row tiles); 0: none, and the callers keep
``quant_linear``. Up to ``gemm_rows()`` rows the few-row tiles of ``quant_int8.c`` run (decode
steps), from there ``quant_int8_gemm.c``'s, blocked for the host's caches (prefill chunks,
decode batches). AMX-int8 is not written.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import QuantLinear

_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
ISA_NAMES = {0: "none", 1: "avx2", 2: "avx512_vnni"}


def isa() -> int:
    """The integer-dot kernel this build has: 2 AVX-512 VNNI, 1 AVX2, 0 none."""
    return int(_lib().splitserve_qi8_isa()) if cpu_kernels.available() else 0


def block_size(group: int) -> int:
    """Inputs per block of a rounded activation row for a weight of this group."""
    return int(_lib().splitserve_qi8_block_for(group))


def gemm_rows() -> int:
    """Rows from which a product runs the many-row tiles (``quant_int8_gemm.c``)."""
    return int(_lib().splitserve_qi8_gemm_rows())


def repack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """quant_linear's panel codes ([P, K, 8] nibble pairs or [P, K, 16] int8) in this kernel's
    lines of 64 bytes, byte 4 c + j holding column c at input k0 + j: 4 bits [P, K / 8, 64]
    (the high nibble input k0 + 4 + j), 8 bits [P, K / 4, 64] (code + 128, unsigned)."""
    panels, k = codes.shape[0], codes.shape[1]
    if bits == 4:
        full = torch.cat([codes & 15, codes >> 4], dim=2)  # [P, K, 16]: columns 0-7, 8-15
        lines = full.view(panels, k // 8, 2, 4, 16)  # k = 8 line + 4 half + j
        packed = lines[:, :, 0] | (lines[:, :, 1] << 4)  # [P, K / 8, 4, 16]
        return packed.transpose(2, 3).contiguous().view(panels, k // 8, 64)
    shifted = (codes.to(torch.int16) + 128).to(torch.uint8).view(panels, k // 4, 4, 16)
    return shifted.transpose(2, 3).contiguous().view(panels, k // 4, 64)


class QuantInt8Linear:
    """``x @ W.T`` for one packed weight on integer dots; built from its ``QuantLinear``
    (checked there), the codes repacked once. The tensors must not change while it lives."""

    def __init__(self, exact: QuantLinear) -> None:
        _, scales, mins, halves, bits, group = exact._weight
        self.codes = repack_codes(exact.tensors[0], bits)
        self.n, self.k, self.exact = exact.n, exact.k, exact
        self._weight = (self.codes.data_ptr(), scales, mins, halves, bits, group)
        self._kernel = _lib().splitserve_linear_qi8

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """As ``QuantLinear.__call__``: x [M, K] fp32, ``out`` [M, N] accumulated into."""
        m = x.shape[0]
        self.exact._check_input(x)
        if out is None:
            out, accumulate = torch.empty(m, self.n, dtype=x.dtype), 0
        elif out.shape != (m, self.n) or out.stride(-1) != 1:
            raise ValueError(f"quant_int8: out {tuple(out.shape)} is not a [{m}, {self.n}] view")
        else:
            accumulate = 1
        codes, scales, mins, halves, bits, group = self._weight
        done = self._kernel(
            x.data_ptr(), x.stride(0), codes, scales, mins, halves, bits, group, m, self.n,
            self.k, out.data_ptr(), out.stride(0), accumulate, torch.get_num_threads(),
        )  # fmt: skip
        if not done:  # no memory for the rounded rows: the exact path
            return self.exact(x, out if accumulate else None)
        return out


def quantize_rows(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's rounding of x [M, K] fp32 for a weight of this group: codes [M, K] int8
    and scales [M, K / block_size(group)] (x ~ codes * scales per block), for the tests."""
    m, k = x.shape
    block = block_size(group)
    q = torch.empty(m, k, dtype=torch.int8)
    d = torch.empty(m, k // block, dtype=torch.float32)
    sums = torch.empty(m, k // block, dtype=torch.int32)
    dsum = torch.empty(m, k // group, dtype=torch.float32)
    x = x if x.stride(-1) == 1 else x.contiguous()
    _lib().splitserve_qi8_quantize(
        x.data_ptr(), x.stride(0), m, k, block, group, q.data_ptr(), d.data_ptr(),
        sums.data_ptr(), dsum.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return q, d


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    for name in ("splitserve_qi8_isa", "splitserve_qi8_gemm_rows"):
        getattr(lib, name).restype = _I32
        getattr(lib, name).argtypes = []
    lib.splitserve_qi8_block_for.restype = _I32
    lib.splitserve_qi8_block_for.argtypes = [_I32]
    lib.splitserve_linear_qi8.restype = _I32
    lib.splitserve_linear_qi8.argtypes = [
        _P, _I64, _P, _P, _P,  # x, its row stride, int8-layout codes, scales, mins (or NULL)
        _I32, _I32, _I32, _I32, _I32, _I32,  # fp16 bits, bits, group, M, N, K
        _P, _I64, _I32, _I32,  # out, its row stride, accumulate, threads
    ]  # fmt: skip
    lib.splitserve_qi8_quantize.restype = None
    lib.splitserve_qi8_quantize.argtypes = [
        _P, _I64, _I32, _I32, _I32, _I32,  # x, its row stride, M, K, block, group
        _P, _P, _P, _P, _I32,  # codes, scales, sums of codes, group sums of d x sum, threads
    ]  # fmt: skip
    return lib
