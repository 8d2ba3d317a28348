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
decode batches). Where the build targets AMX-INT8 (``amx_int8()``), the many-row products take
16 rows at a time on its tiles (``quant_int8_amx.c``: the same sums in the same order, so a
row's result does not depend on the kernel), once a check at first use has found them equal
to the VNNI kernel's on the host.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from collections.abc import Iterator

import torch

from engine import cpu_kernels
from engine.cpu_kernels.quant_linear import QuantLinear

log = logging.getLogger("engine.cpu_kernels")
_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
ISA_NAMES = {0: "none", 1: "avx2", 2: "avx512_vnni"}


def isa() -> int:
    """The integer-dot kernel this build has: 2 AVX-512 VNNI, 1 AVX2, 0 none."""
    return int(_lib().splitserve_qi8_isa()) if cpu_kernels.available() else 0


def amx_int8() -> bool:
    """Whether the many-row products run on AMX-int8 tiles: the build has the kernel (or its
    emulation, SPLITSERVE_AMX_EMULATE), the OS grants the tile state, and the check at first
    use passed (products of 4- and 8-bit codes equal to the VNNI kernel's, bit for bit)."""
    return cpu_kernels.available() and _amx_checked()


def kernel_name() -> str:
    """The many-row kernel of the products: ``amx_int8``, or the ISA's name (``ISA_NAMES``)."""
    return "amx_int8" if amx_int8() else ISA_NAMES[isa()]


@contextlib.contextmanager
def without_amx() -> Iterator[None]:
    """The products inside run the VNNI kernel where AMX-int8 is on (the benchmarks' baseline);
    no product may run beside them in other threads."""
    on = amx_int8()
    _lib().splitserve_qi8_amx_enable(0)
    try:
        yield
    finally:
        _lib().splitserve_qi8_amx_enable(1 if on else 0)


@functools.cache
def _amx_checked() -> bool:
    lib = _lib()
    built = int(lib.splitserve_qi8_amx_built())
    if not built:
        return False
    if not lib.splitserve_qi8_amx_enable(1):
        log.info("qi8_amx_off reason=the OS refused the tile state")
        return False
    lib.splitserve_qi8_amx_enable(0)
    mismatched = [bits for bits in (4, 8) if not _same_with_and_without_amx(lib, bits)]
    lib.splitserve_qi8_amx_enable(0 if mismatched else 1)
    if mismatched:
        log.warning("qi8_amx_refused bits=%s reason=differs from the VNNI kernel", mismatched)
    else:
        log.info("qi8_amx_on emulated=%s", built == 2)
    return not mismatched


def _same_with_and_without_amx(lib: ctypes.CDLL, bits: int) -> bool:
    """A 56-row product (a pair of 16-row tiles, one tile and a tail) with 48 columns (pairs
    of panels and one alone) over 3 groups of 32 with mins, with the kernel off then on."""
    gen = torch.Generator().manual_seed(bits)
    m, n, k, group = 56, 48, 96, 32
    x = torch.randn(m, k, generator=gen)
    lines = torch.randint(0, 256, (n // 16, k * bits // 32, 64), dtype=torch.uint8, generator=gen)
    scales = torch.rand(n // 16, k // group, 16, generator=gen) / 8
    mins = torch.randn(n // 16, k // group, 16, generator=gen) / 4
    outs = []
    for on in (0, 1):
        lib.splitserve_qi8_amx_enable(on)
        out = torch.full((m, n), float("nan"))
        done = lib.splitserve_linear_qi8(
            x.data_ptr(), k, lines.data_ptr(), scales.data_ptr(), mins.data_ptr(), 0, bits,
            group, m, n, k, out.data_ptr(), n, 0, 1,
        )  # fmt: skip
        outs.append(out if done else None)
    return outs[0] is not None and outs[1] is not None and torch.equal(outs[0], outs[1])


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
        amx_int8()  # its check at first use, before any product that may take it
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
    lib.splitserve_qi8_amx_built.restype = _I32
    lib.splitserve_qi8_amx_built.argtypes = []
    lib.splitserve_qi8_amx_enable.restype = _I32
    lib.splitserve_qi8_amx_enable.argtypes = [_I32]
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
