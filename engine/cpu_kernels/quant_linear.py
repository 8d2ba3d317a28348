"""The linear kernel over group-quantized weights (``quant_linear.c``), dequantizing as it
reads: the weights stay packed in memory (``engine.model.quant.weight.QuantWeight``). Same
library as the other kernels (``engine.cpu_kernels``).

From ``AMX_ROWS`` rows on, where the build targets AMX and the OS grants the tile state,
the product runs on AMX tiles (``quant_amx.c``): codes exact in
bf16 times each activation split into three bf16 terms, summed in fp32 per group and scaled
in fp32. That is fp32-level accurate but not bit for bit the FMA path (which runs on machines
without AMX, and for the groups of 16 the AMX kernel does not take).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from engine import cpu_kernels

_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
# Rows from which the AMX kernel runs. On the 2-core dev machine (Xeon, AVX-512 + AMX, one
# thread, loaded by other work) it ran even with the FMA path at one row (decode steps of the
# default model at batch 1: 78 and 71 ms) and ahead from a few rows on (the layer 3072 x 576:
# 78 GFLOP/s against 49 at 4 rows, 234 against 67 at 16). Decode steps against the fp32 path,
# interleaved in one process, CPU time per step: batch 1 36.4 ms against 58.1 (1.59x),
# batch 32 84.8 against 169.6 (2.00x). From one row, the packed model's products do not
# depend on how many rows share a call (batches, speculative verification).
AMX_ROWS = 1


def amx_available() -> bool:
    """Whether the kernels were built with the AMX path and this process may use the tiles."""
    return cpu_kernels.available() and bool(_lib().splitserve_amx_available())


def quant_linear(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor | None,
    bits: int,
    group: int,
    out: torch.Tensor | None = None,
    amx_rows: int = AMX_ROWS,
) -> torch.Tensor:
    """``x @ W.T`` for x [M, K] fp32 (unit last stride) and W [N, K] packed in panels:
    ``codes`` [N / 16, K, 8] uint8 (two 4-bit codes a byte) or [N / 16, K, 16] int8,
    ``scales`` and ``mins`` [N / 16, K / group, 16] fp32 (w = code * scale + min). With
    ``out`` [M, N] (unit last stride) the product is added to it in place. From ``amx_rows``
    rows on (0: never) the AMX kernel computes it where there is one."""
    lib = _lib()
    panels, k = codes.shape[0], codes.shape[1]
    m, n = x.shape[0], panels * cpu_kernels.PANEL
    if bits not in (4, 8) or codes.shape[2] != (8 if bits == 4 else 16):
        raise ValueError(f"quant_linear: codes {tuple(codes.shape)} are not {bits}-bit panels")
    if group % 16 or k % group or scales.shape != (panels, k // group, 16):
        raise ValueError(f"quant_linear: scales {tuple(scales.shape)} do not fit group {group}")
    if mins is not None and mins.shape != scales.shape:
        raise ValueError(f"quant_linear: mins {tuple(mins.shape)} differ from the scales")
    if x.shape[1] != k or x.stride(-1) != 1 or x.dtype != torch.float32:
        raise ValueError(f"quant_linear: x {tuple(x.shape)} does not fit a weight of {n}x{k}")
    if out is not None and (out.shape != (m, n) or out.stride(-1) != 1):
        raise ValueError(f"quant_linear: out {tuple(out.shape)} is not a [{m}, {n}] view")
    accumulate = out is not None
    out = torch.empty(m, n, dtype=x.dtype) if out is None else out
    lib.splitserve_linear_quant(
        x.data_ptr(), x.stride(0), codes.data_ptr(), scales.data_ptr(),
        None if mins is None else mins.data_ptr(), bits, group, m, n, k,
        out.data_ptr(), out.stride(0), int(accumulate), torch.get_num_threads(), amx_rows,
    )  # fmt: skip
    return out


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    lib.splitserve_linear_quant.restype = None
    lib.splitserve_linear_quant.argtypes = [
        _P, _I64, _P, _P, _P,  # x, its row stride, codes, scales, mins (or NULL)
        _I32, _I32, _I32, _I32, _I32,  # bits, group, M, N, K
        _P, _I64, _I32, _I32, _I32,  # out, its row stride, accumulate, threads, AMX rows
    ]  # fmt: skip
    lib.splitserve_amx_available.restype = _I32
    lib.splitserve_amx_available.argtypes = []
    return lib
