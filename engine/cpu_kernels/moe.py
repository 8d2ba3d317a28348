"""The mixture-of-experts experts as one C call (``moe.c``), over weights packed once at load.

``pack_experts`` lays each expert's fused gate/up weight and its down weight out in the linear
kernel's 16-column panels (gate panel j beside up panel j); ``fused_experts`` then sorts the
step's (token, expert) pairs by expert, runs every chosen expert once over all of its rows
(threads share out (expert, panel) work items), and adds each token's k results, weighted,
into its output row. Same library as the other kernels (``engine.cpu_kernels``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from engine import cpu_kernels

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}
MAX_TOP_K = 64  # moe.c
_I64, _I32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
_ERRORS = {
    -1: "no scratch memory for the step's expert rows",
    -2: "an expert id outside [0, num_experts)",
    -3: f"top_k above {MAX_TOP_K}",
}


class PackedExperts(NamedTuple):
    """Expert weights in the panel layout of ``moe.c``."""

    w13: torch.Tensor  # [E, I / 16, 2, H, 16]: gate panel j, then up panel j
    w2: torch.Tensor  # [E, H / 16, I, 16]

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w13.shape[3]

    @property
    def intermediate(self) -> int:
        return self.w2.shape[2]


def pack_experts(w13: torch.Tensor, w2: torch.Tensor) -> PackedExperts | None:
    """``w13`` [E, 2 I, H] (gate rows, then up rows) and ``w2`` [E, H, I] packed for
    ``fused_experts``; None where the kernel does not take them (not fp32 on the CPU, H or I
    not a multiple of 16, or no kernels here)."""
    e, two_i, h = w13.shape
    i = two_i // 2
    panel = cpu_kernels.PANEL
    if w13.device.type != "cpu" or w13.dtype != torch.float32 or w2.dtype != torch.float32:
        return None
    if h % panel or i % panel or w2.shape != (e, h, i) or not cpu_kernels.available():
        return None
    w13p = w13.detach().view(e, 2, i // panel, panel, h).permute(0, 2, 1, 4, 3).contiguous()
    w2p = w2.detach().view(e, h // panel, panel, i).transpose(2, 3).contiguous()
    return PackedExperts(w13p, w2p)


def fused_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    packed: PackedExperts,
    activation: str,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_i weights[t, i] * expert_{ids[t, i]}(x[t]) for each token t.

    x: [T, H] fp32 (unit last stride); weights: [T, k] (fp32); ids: [T, k] (int64 expert
    ids); an expert is down(act(gate(x)) * up(x)) with act ``"silu"`` or ``"gelu_tanh"``.
    With ``out`` [T, H] (unit last stride) the sum is added to it in place. Returns [T, H].
    """
    lib = _lib()
    tokens, hidden = x.shape
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_experts: activation {activation!r} is not one of {ACTIVATIONS}")
    if hidden != packed.hidden or x.stride(-1) != 1 or x.dtype != torch.float32:
        raise ValueError(f"fused_experts: x {tuple(x.shape)} does not fit H={packed.hidden}")
    if weights.shape != ids.shape or ids.dim() != 2 or ids.shape[0] != tokens:
        raise ValueError(
            f"fused_experts: {tokens} tokens need [{tokens}, k] weights and ids, got "
            f"{tuple(weights.shape)} and {tuple(ids.shape)}"
        )
    if out is not None and (out.shape != x.shape or out.stride(-1) != 1):
        raise ValueError(f"fused_experts: out {tuple(out.shape)} is not a row-major {x.shape}")
    accumulate = out is not None
    out = torch.empty_like(x) if out is None else out
    ids = ids.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    rc = lib.splitserve_moe_f32(
        x.data_ptr(), x.stride(0), tokens, hidden, ids.data_ptr(), weights.data_ptr(),
        ids.shape[1], packed.w13.data_ptr(), packed.w2.data_ptr(), packed.num_experts,
        packed.intermediate, out.data_ptr(), out.stride(0), int(accumulate),
        ACTIVATIONS[activation], torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise ValueError(f"fused_experts: {_ERRORS.get(rc, f'error {rc}')}")
    return out


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    lib.splitserve_moe_f32.restype = _I32
    lib.splitserve_moe_f32.argtypes = [
        _P, _I64, _I32, _I32, _P, _P,  # x, its row stride, tokens, hidden, ids, weights
        _I32, _P, _P, _I32, _I32,  # top_k, packed w13 and w2, experts, intermediate
        _P, _I64, _I32, _I32, _I32,  # out, its row stride, accumulate, activation, threads
    ]  # fmt: skip
    return lib
