"""The multi-LoRA shrink and expand as C calls (``lora.c``), for fp32 tensors on the CPU.

Same library as the other kernels (``engine.cpu_kernels``); the torch reference and the
Triton twin are in ``engine.lora.delta`` and ``engine.triton_kernels.lora``.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence

import torch

from engine import cpu_kernels

_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p


def supports(x: torch.Tensor, out: torch.Tensor) -> bool:
    """True when the kernels take these tensors (fp32 on the CPU, unit last strides)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and out.dtype == torch.float32
        and x.stride(-1) == 1
        and out.stride(-1) == 1
        and cpu_kernels.available()
    )


def shrink(x: torch.Tensor, a: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
    """y [T, R] with y[t] = a[token_slots[t]] @ x[t] (zeros where the slot is negative).

    x: [T, in]; a: [slots, R, in] contiguous; token_slots: [T] int64."""
    tokens, rows = x.shape[0], a.shape[1]
    y = torch.empty(tokens, rows, dtype=torch.float32)
    _lib().splitserve_lora_shrink_f32(
        x.data_ptr(), x.stride(0), tokens, x.shape[1], a.data_ptr(), a.stride(0), rows,
        token_slots.data_ptr(), y.data_ptr(), y.stride(0), torch.get_num_threads(),
    )  # fmt: skip
    return y


def expand_add_(
    out: torch.Tensor,
    y: torch.Tensor,
    b: torch.Tensor,
    token_slots: torch.Tensor,
    ends: Sequence[int],
) -> None:
    """out[t, j] += b[slot, j] . y[t, sub(j) * R : (sub(j) + 1) * R] for tokens with a slot.

    out: [T, N]; y: [T, subs * R]; b: [slots, N, R] contiguous, R a multiple of 8;
    ends: the column end of each sub-matrix (the last is N)."""
    rank = b.shape[2]
    ends_t = torch.tensor(list(ends), dtype=torch.int64)
    _lib().splitserve_lora_expand_f32(
        out.data_ptr(), out.stride(0), out.shape[0], out.shape[1], y.data_ptr(), y.stride(0),
        rank, b.data_ptr(), b.stride(0), token_slots.data_ptr(), ends_t.data_ptr(), len(ends),
        torch.get_num_threads(),
    )  # fmt: skip


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    lib.splitserve_lora_shrink_f32.restype = None
    lib.splitserve_lora_shrink_f32.argtypes = [
        _P, _I64, _I32, _I32,  # x, its row stride, tokens, in
        _P, _I64, _I32, _P,  # a, its slot stride, rows, token slots
        _P, _I64, _I32,  # y, its row stride, threads
    ]  # fmt: skip
    lib.splitserve_lora_expand_f32.restype = None
    lib.splitserve_lora_expand_f32.argtypes = [
        _P, _I64, _I32, _I32,  # out, its row stride, tokens, columns
        _P, _I64, _I32,  # y, its row stride, rank
        _P, _I64, _P,  # b, its slot stride, token slots
        _P, _I32, _I32,  # sub-matrix ends, their count, threads
    ]  # fmt: skip
    return lib
