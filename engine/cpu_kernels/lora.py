"""The multi-LoRA delta as one C call per fused projection (``lora.c``), fp32 on the CPU.

``CpuMatrix`` describes one fused matrix's slots (A [slots, rows, in], B rank-major
[slots, rank, cols]) once; ``CpuPlan`` groups a step's tokens by slot once per step; ``add_``
then runs shrink and expand for every group in one call. Same library as the other kernels
(``engine.cpu_kernels``); the torch reference and the Triton twin are in ``engine.lora.delta``
and ``engine.triton_kernels.lora``.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence

import torch

from engine import cpu_kernels

_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p


class _Matrix(ctypes.Structure):
    _fields_ = [
        ("a", _P), ("bt", _P), ("ends", _P), ("a_slot_stride", _I64), ("b_slot_stride", _I64),
        ("in_features", _I32), ("rows", _I32), ("cols", _I32), ("rank", _I32), ("subs", _I32),
    ]  # fmt: skip


class _Plan(ctypes.Structure):
    _fields_ = [
        ("order", _P), ("starts", _P), ("slot", _P), ("y", _P), ("y_stride", _I64),
        ("groups", _I32), ("threads", _I32),
    ]  # fmt: skip


def supports(x: torch.Tensor, out: torch.Tensor) -> bool:
    """True when ``add_`` takes these tensors (fp32 on the CPU, unit last strides); the
    kernels themselves are checked when a ``CpuMatrix`` is made."""
    f32 = torch.float32
    return x.dtype == f32 and out.dtype == f32 and x.is_cpu and x.stride(-1) == out.stride(-1) == 1


class CpuMatrix:
    """One fused matrix's slots as the kernel reads them; the tensors must stay in place
    (filled in place by ``engine.lora.slots``).

    a: [slots, subs * rank, in] and bt: [slots, rank, cols], contiguous fp32; ends: the
    column end of each sub-matrix (the last is cols)."""

    def __init__(self, a: torch.Tensor, bt: torch.Tensor, ends: Sequence[int]) -> None:
        if not (a.is_contiguous() and bt.is_contiguous() and a.dtype == bt.dtype == torch.float32):
            raise ValueError("CpuMatrix needs contiguous fp32 A and B")
        if not cpu_kernels.available():
            raise RuntimeError("the CPU kernels are not available (see the log for why)")
        self.a, self.bt, self.rows = a, bt, a.shape[1]
        self.ends = torch.tensor(ends, dtype=torch.int64)
        self.struct = _Matrix(
            a.data_ptr(), bt.data_ptr(), self.ends.data_ptr(), a.stride(0), bt.stride(0),
            a.shape[2], a.shape[1], bt.shape[2], bt.shape[1], len(ends),
        )  # fmt: skip
        self.ref = ctypes.byref(self.struct)


class CpuPlan:
    """A step's tokens grouped by slot (tokens with a negative slot in no group), with the
    shrink's scratch for up to `max_rows` rows a token; `threads` (default torch's) share the
    work: whole groups each where there are enough, else the rows and columns of every group."""

    def __init__(
        self, token_slots: torch.Tensor, max_rows: int, threads: int | None = None
    ) -> None:
        slots = token_slots.to("cpu", torch.int64)
        order = torch.argsort(slots, stable=True)  # [T]
        order = order[slots[order] >= 0].contiguous()  # [n]
        slot, counts = torch.unique_consecutive(slots[order], return_counts=True)
        self.order, self.slot = order, slot.contiguous()
        self.starts = torch.zeros(len(counts) + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=self.starts[1:])
        self.max_rows = max_rows
        self.y = torch.empty(max(len(order), 1), max_rows, dtype=torch.float32)
        self.struct = _Plan(
            order.data_ptr(), self.starts.data_ptr(), self.slot.data_ptr(), self.y.data_ptr(),
            max_rows, len(counts), threads or torch.get_num_threads(),
        )  # fmt: skip
        self.ref = ctypes.byref(self.struct)


def add_(out: torch.Tensor, x: torch.Tensor, matrix: CpuMatrix, plan: CpuPlan) -> None:
    """out [T, cols] += the LoRA delta of `matrix` for x [T, in], every token under its slot
    (rows of `x` and `out` may be strided, their last dimension unit-strided)."""
    if matrix.rows > plan.max_rows:
        raise ValueError(f"the plan's scratch has {plan.max_rows} rows, A has {matrix.rows}")
    _fn()(matrix.ref, plan.ref, x.data_ptr(), x.stride(0), out.data_ptr(), out.stride(0))


@functools.cache
def _fn() -> Callable[..., None]:
    fn = cpu_kernels._require().splitserve_lora_add_f32
    fn.restype = None
    fn.argtypes = [_P, _P, _P, _I64, _P, _I64]  # matrix, plan, x, its stride, out, its stride
    return fn  # type: ignore[no-any-return]
