"""gpt-oss's experts over packed MXFP4 weights as one C call (``mxfp4.c``).

The weights stay in the checkpoint's packing (``engine.model.quant.mxfp4``): 4-bit e2m1 codes
two a byte and one e8m0 scale a block of 32, decoded in registers as they are read; the
gate / up and down biases and the clamped SwiGLU run in the same call. The (token, expert)
pairs are sorted and summed as in ``engine.cpu_kernels.moe``.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from engine import cpu_kernels

BLOCK = 32  # values a scale covers
_I64, _I32, _F32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p
_ERRORS = {
    -1: "no scratch memory for the step's expert rows",
    -2: "an expert id outside [0, num_experts)",
    -3: "top_k above 64",
}


class Mxfp4Tensors(NamedTuple):
    """One packed expert matrix per expert: ``codes`` [E, rows, cols / 32, 16] uint8 and
    ``scales`` [E, rows, cols / 32] uint8 (``Mxfp4Experts``' ``blocks`` and ``scales``)."""

    codes: torch.Tensor
    scales: torch.Tensor


def supported(w13: Mxfp4Tensors, w2: Mxfp4Tensors, x: torch.Tensor) -> bool:
    """True when ``fused_mxfp4_experts`` takes these: fp32 activations and packed weights on
    the CPU, contiguous, and the library built."""
    tensors = (*w13, *w2)
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and all(t.device.type == "cpu" and t.is_contiguous() for t in tensors)
        and cpu_kernels.available()
    )


def fused_mxfp4_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: Mxfp4Tensors,
    w2: Mxfp4Tensors,
    biases: tuple[torch.Tensor, torch.Tensor] | None,
    alpha: float,
    limit: float,
) -> torch.Tensor:
    """sum_i weights[t, i] * expert_{ids[t, i]}(x[t]) -> [T, H] fp32, an expert being
    ``W2 swiglu(W13 x + b13) + b2`` with gpt-oss's clamped SwiGLU (``alpha``, ``limit``) over
    W13's interleaved gate / up rows.

    x: [T, H] fp32 (unit last stride); weights, ids: [T, k]; w13: [E, 2 I, H] packed; w2:
    [E, H, I] packed; ``biases``: [E, 2 I] and [E, H] (fp32), or None.
    """
    tokens, hidden = x.shape
    experts, two_inter = w13.codes.shape[:2]
    inter = two_inter // 2
    _check(x, weights, ids, w13, w2, hidden, inter)
    b13, b2 = (None, None) if biases is None else (b.float().contiguous() for b in biases)
    if (
        b13 is not None
        and b2 is not None
        and (b13.numel(), b2.numel()) != (experts * two_inter, experts * hidden)
    ):
        raise ValueError(
            f"fused_mxfp4_experts: biases {tuple(b13.shape)} and {tuple(b2.shape)} do not "
            f"fit [{experts}, {two_inter}] and [{experts}, {hidden}]"
        )
    out = torch.empty_like(x)
    ids = ids.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    rc = _lib().splitserve_moe_mxfp4_f32(
        x.data_ptr(), x.stride(0), tokens, hidden, ids.data_ptr(), weights.data_ptr(),
        ids.shape[1], w13.codes.data_ptr(), w13.scales.data_ptr(), _ptr(b13),
        w2.codes.data_ptr(), w2.scales.data_ptr(), _ptr(b2), experts, inter, alpha, limit,
        out.data_ptr(), out.stride(0), 0, torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise ValueError(f"fused_mxfp4_experts: {_ERRORS.get(rc, f'error {rc}')}")
    return out


def _check(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    w13: Mxfp4Tensors,
    w2: Mxfp4Tensors,
    hidden: int,
    inter: int,
) -> None:
    """The C side trusts these shapes: a mismatch would read outside the weights."""
    experts, groups = w13.codes.shape[0], hidden // BLOCK
    want13 = (experts, 2 * inter, groups, BLOCK // 2)
    want2 = (experts, hidden, inter // BLOCK, BLOCK // 2)
    if hidden % BLOCK or inter % BLOCK or w13.codes.shape != want13 or w2.codes.shape != want2:
        raise ValueError(
            f"fused_mxfp4_experts: x {tuple(x.shape)}, w13 {tuple(w13.codes.shape)} and w2 "
            f"{tuple(w2.codes.shape)} do not fit [T, H], [E, 2 I, H / 32, 16], "
            "[E, H, I / 32, 16] with H and I multiples of 32"
        )
    if w13.scales.shape != want13[:3] or w2.scales.shape != want2[:3]:
        raise ValueError("fused_mxfp4_experts: scales do not fit their codes")
    if x.stride(-1) != 1 or x.dtype != torch.float32:
        raise ValueError("fused_mxfp4_experts: x must be fp32 with a unit last stride")
    if weights.shape != ids.shape or ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"fused_mxfp4_experts: {x.shape[0]} tokens need [{x.shape[0]}, k] weights and "
            f"ids, got {tuple(weights.shape)} and {tuple(ids.shape)}"
        )


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    lib.splitserve_moe_mxfp4_f32.restype = _I32
    lib.splitserve_moe_mxfp4_f32.argtypes = [
        _P, _I64, _I32, _I32, _P, _P,  # x, its row stride, tokens, hidden, ids, weights
        _I32, _P, _P, _P,  # top_k, w13's codes, scales and bias
        _P, _P, _P, _I32, _I32,  # w2's codes, scales and bias, experts, intermediate
        _F32, _F32, _P, _I64, _I32, _I32,  # alpha, limit, out, its stride, accumulate, threads
    ]  # fmt: skip
    return lib
