"""The linear kernel over group-quantized weights (``quant_linear.c``), dequantizing as it
reads: the weights stay packed in memory (``engine.model.quant.weight.QuantWeight``). Same
library as the other kernels (``engine.cpu_kernels``).

Up to ``small_rows()`` rows (decode; 4 where the build targets AVX-512, else none) a kernel
made for them runs: per group, the codes widened to fp32 times the activations, summed, then
scaled once, many panels at a time. From ``AMX_ROWS`` rows on, where the build targets AMX
and the OS grants the tile state, the product runs on AMX tiles (``quant_amx.c``): codes
exact in bf16 times each activation split into three bf16 terms, summed in fp32 per group
and scaled in fp32. Both are fp32-level accurate but not bit for bit the FMA path (which
runs where neither does, and with ``amx_rows=0``), nor each other: a row's result depends on
whether it came in a call of up to ``small_rows()`` rows or of more. The FMA path's prefill
sizes (``prefill_blocking``) run blocked for the caches the build read from the host
(``quant_prefill.c``), the same sums in the same order.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from engine import cpu_kernels

_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
# Rows from which the AMX kernel runs. On the 2-core dev machine (Xeon, AVX-512 + AMX, one
# thread, loaded by other work) it ran even with the FMA path at one row (decode steps of the
# default model at batch 1: 78 and 71 ms) and ahead from a few rows on (the layer 3072 x 576:
# 78 GFLOP/s against 49 at 4 rows, 234 against 67 at 16). Decode steps against the fp32 path,
# interleaved in one process, CPU time per step: batch 1 36.4 ms against 58.1 (1.59x),
# batch 32 84.8 against 169.6 (2.00x). Up to small_rows() rows the small-row kernel runs
# before it: at one row 2.3x the FMA path (the layer 3072 x 576: 68 against 160 us, the Q8_0
# lm_head 1.2 against 2.5 ms, one thread, same run), at 4 rows still ahead of the tiles at 5.
AMX_ROWS = 1


def amx_available() -> bool:
    """Whether the kernels were built with the AMX path and this process may use the tiles."""
    return cpu_kernels.available() and bool(_lib().splitserve_amx_available())


def small_rows() -> int:
    """Up to how many rows the small-row kernel computes the product (0: none in this build)."""
    return int(_lib().splitserve_quant_small_rows()) if cpu_kernels.available() else 0


class PrefillBlocking(NamedTuple):
    """quant_prefill.c's blocks for an input width: ``rows`` x ``panels`` (of 16 columns) in
    registers, ``inputs`` dequantized at a time (half of L1), ``row_block`` rows of A over
    the whole width (half of L2); from ``min_rows`` rows on that kernel runs."""

    rows: int
    panels: int
    inputs: int
    row_block: int
    min_rows: int


def prefill_blocking(k: int) -> PrefillBlocking:
    """The prefill kernel's blocks for inputs of width ``k``, as built for this host."""
    out = (ctypes.c_int32 * 4)()
    _lib().splitserve_quant_prefill_blocking(k, out)
    rows, panels, inputs, row_block = (int(v) for v in out)
    return PrefillBlocking(
        rows, panels, inputs, row_block, int(_lib().splitserve_quant_prefill_rows())
    )


def exact_path(rows: int, amx_rows: int = AMX_ROWS) -> bool:
    """Whether ``quant_linear`` of ``rows`` rows runs the FMA path, bit for bit the fp32
    kernel over the dequantized weights (else a fp32-level kernel)."""
    fast = rows <= small_rows() or (amx_available() and rows >= amx_rows)
    return amx_rows <= 0 or not fast


def quant_linear(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor | None,
    bits: int,
    group: int,
    out: torch.Tensor | None = None,
    amx_rows: int = AMX_ROWS,
    bf16_products: bool = False,
) -> torch.Tensor:
    """``x @ W.T`` for x [M, K] fp32 (unit last stride) and W [N, K] packed in panels:
    ``codes`` [N / 16, K, 8] uint8 (two 4-bit codes a byte) or [N / 16, K, 16] int8,
    ``scales`` and ``mins`` [N / 16, K / group, 16], each fp32 or fp16 (read as fp32: the same
    results for the same values), w = code * scale + min. With
    ``out`` [M, N] (unit last stride) the product is added to it in place. With ``amx_rows``
    > 0 the small-row kernel takes up to ``small_rows()`` rows and the AMX kernel from
    ``amx_rows`` rows on, where the build has them; 0: the FMA path for every row count. With
    ``bf16_products`` the AMX rows are bf16(x) times bf16(W) summed in fp32 over the whole K
    (``quant_amx_bf16.c``; float32_matmul_precision "medium")."""
    return QuantLinear(codes, scales, mins, bits, group)(x, out, amx_rows, bf16_products)


class QuantLinear:
    """``quant_linear`` over one packed weight, checked once: a decode step of the default
    model makes 121 products, and the checks cost more than the call (6 us against 2 a
    product on the 2-core dev machine). The tensors must not change while it lives."""

    def __init__(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        mins: torch.Tensor | None,
        bits: int,
        group: int,
    ) -> None:
        panels, k = codes.shape[0], codes.shape[1]
        if bits not in (4, 8) or codes.shape[2] != (8 if bits == 4 else 16):
            raise ValueError(f"quant_linear: codes {tuple(codes.shape)} are not {bits}-bit panels")
        if group % 16 or k % group or scales.shape != (panels, k // group, 16):
            raise ValueError(f"quant_linear: scales {tuple(scales.shape)} do not fit group {group}")
        if mins is not None and mins.shape != scales.shape:
            raise ValueError(f"quant_linear: mins {tuple(mins.shape)} differ from the scales")
        halves = _halves(scales, 1) | (0 if mins is None else _halves(mins, 2))
        if not all(t is None or t.is_contiguous() for t in (codes, scales, mins)):
            raise ValueError("quant_linear: codes, scales and mins must be contiguous")
        self.tensors = (codes, scales, mins)  # kept alive for the pointers
        self.n, self.k = panels * cpu_kernels.PANEL, k
        mins_ptr = None if mins is None else mins.data_ptr()
        self._weight = (codes.data_ptr(), scales.data_ptr(), mins_ptr, halves, bits, group)
        self._kernel = _lib().splitserve_linear_quant

    def __call__(
        self,
        x: torch.Tensor,
        out: torch.Tensor | None = None,
        amx_rows: int = AMX_ROWS,
        bf16_products: bool = False,
    ) -> torch.Tensor:
        """As ``quant_linear(x, ..., out, amx_rows, bf16_products)``."""
        m, n, k = x.shape[0], self.n, self.k
        self._check_input(x)
        if out is None:
            out, accumulate = torch.empty(m, n, dtype=x.dtype), 0
        elif out.shape != (m, n) or out.stride(-1) != 1:
            raise ValueError(f"quant_linear: out {tuple(out.shape)} is not a [{m}, {n}] view")
        else:
            accumulate = 1
        codes, scales, mins, halves, bits, group = self._weight
        self._kernel(
            x.data_ptr(), x.stride(0), codes, scales, mins, halves, bits, group, m, n, k,
            out.data_ptr(), out.stride(0), accumulate, torch.get_num_threads(), amx_rows,
            int(bf16_products),
        )  # fmt: skip
        return out

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """``silu(x @ gate.T) * (x @ up.T)`` for this weight = [gate; up], in bf16 products
        on AMX tiles (``quant_amx_bf16.c``: only the product is written); None where that
        kernel declines (no AMX, up to ``small_rows()`` rows, N not a multiple of 32)."""
        m, k = x.shape[0], self.k
        self._check_input(x)
        if m <= small_rows() or self.n % 32:
            return None
        out = torch.empty(m, self.n // 2, dtype=x.dtype)
        codes, scales, mins, halves, bits, group = self._weight
        done = _lib().splitserve_quant_amx_bf16_silu_mul(
            x.data_ptr(), x.stride(0), codes, scales, mins, halves, bits, group, m, self.n, k,
            out.data_ptr(), out.stride(0), torch.get_num_threads(),
        )  # fmt: skip
        return out if done else None

    def _check_input(self, x: torch.Tensor) -> None:
        """x must be [M, K] fp32 with a unit last stride."""
        if x.dim() != 2 or x.shape[1] != self.k or x.stride(1) != 1 or x.dtype != torch.float32:
            raise ValueError(
                f"quant_linear: x {tuple(x.shape)} does not fit a weight of {self.n}x{self.k}"
            )


def _halves(t: torch.Tensor, bit: int) -> int:
    """``bit`` where ``t`` is fp16 (0 for fp32; any other dtype is refused)."""
    if t.dtype not in (torch.float16, torch.float32):
        raise ValueError(f"quant_linear: scales and mins are fp32 or fp16, not {t.dtype}")
    return bit if t.dtype == torch.float16 else 0


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    lib.splitserve_linear_quant.restype = None
    lib.splitserve_linear_quant.argtypes = [
        _P, _I64, _P, _P, _P,  # x, its row stride, codes, scales, mins (or NULL)
        _I32, _I32, _I32, _I32, _I32, _I32,  # fp16 bits (1 scales, 2 mins), bits, group, M, N, K
        _P, _I64, _I32, _I32, _I32,  # out, its row stride, accumulate, threads, AMX rows
        _I32,  # bf16 products on the AMX rows
    ]  # fmt: skip
    lib.splitserve_quant_amx_bf16_silu_mul.restype = _I32
    lib.splitserve_quant_amx_bf16_silu_mul.argtypes = [
        _P, _I64, _P, _P, _P,  # x, its row stride, codes, scales, mins (or NULL)
        _I32, _I32, _I32, _I32, _I32, _I32,  # fp16 bits, bits, group, M, N (gate + up), K
        _P, _I64, _I32,  # out [M, N / 2], its row stride, threads
    ]  # fmt: skip
    lib.splitserve_quant_prefill_blocking.restype = None
    lib.splitserve_quant_prefill_blocking.argtypes = [_I32, _P]
    lib.splitserve_quant_prefill_rows.restype = _I32
    lib.splitserve_quant_prefill_rows.argtypes = []
    lib.splitserve_amx_available.restype = _I32
    lib.splitserve_amx_available.argtypes = []
    lib.splitserve_quant_small_rows.restype = _I32
    lib.splitserve_quant_small_rows.argtypes = []
    return lib
