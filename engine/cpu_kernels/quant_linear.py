"""The linear kernel over group-quantized weights (``quant_linear.c``), dequantizing as it
reads: the weights stay packed in memory (``engine.model.quant.weight.QuantWeight``). Same
library as the other kernels (``engine.cpu_kernels``)."""

from __future__ import annotations

import ctypes
import functools

import torch

from engine import cpu_kernels

_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p


def quant_linear(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor | None,
    bits: int,
    group: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ W.T`` for x [M, K] fp32 (unit last stride) and W [N, K] packed in panels:
    ``codes`` [N / 16, K, 8] uint8 (two 4-bit codes a byte) or [N / 16, K, 16] int8,
    ``scales`` and ``mins`` [N / 16, K / group, 16] fp32 (w = code * scale + min). With
    ``out`` [M, N] (unit last stride) the product is added to it in place."""
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
        out.data_ptr(), out.stride(0), int(accumulate), torch.get_num_threads(),
    )  # fmt: skip
    return out


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    lib.splitserve_linear_quant.restype = None
    lib.splitserve_linear_quant.argtypes = [
        _P, _I64, _P, _P, _P,  # x, its row stride, codes, scales, mins (or NULL)
        _I32, _I32, _I32, _I32, _I32,  # bits, group, M, N, K
        _P, _I64, _I32, _I32,  # out, its row stride, accumulate, threads
    ]  # fmt: skip
    return lib
