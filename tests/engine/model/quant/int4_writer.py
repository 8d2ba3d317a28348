"""Test helper: int4 checkpoints written in AWQ's and GPTQ's published layouts.

Written word by word with plain loops over nibbles, independently of the loader's vectorised
unpacking, so a mistake in one does not hide in the other.
"""

from __future__ import annotations

import torch

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column 8 c + AWQ_PACK_ORDER[i]


def quantize(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit, per (output row, group of input columns): codes [out, in] int,
    zeros [out, groups] int, scales [out, groups] fp16 (as published checkpoints hold them)."""
    out, inp = w.shape
    g = w.float().view(out, inp // group, group)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    scales = ((hi - lo) / 15).clamp(min=1e-6).half()
    zeros = (-lo / scales.float()).round().clamp(0, 15).long()
    codes = (g / scales.float()[..., None]).round() + zeros[..., None]
    return codes.clamp(0, 15).long().view(out, inp), zeros, scales


def dequantize(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The reference weight [out, in] fp32: (code - zero) * scale, group by group."""
    out, inp = codes.shape
    group = inp // zeros.shape[1]
    c = codes.view(out, -1, group).float()
    return ((c - zeros[..., None].float()) * scales[..., None].float()).view(out, inp)


def _word(nibbles: list[int]) -> int:
    word = 0
    for i, v in enumerate(nibbles):
        word |= (int(v) & 0xF) << (4 * i)
    return word - (1 << 32) if word >= 1 << 31 else word


def _pack_columns(m: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """[rows, cols] -> int32 [rows, cols / 8], nibble i of word c = column 8 c + order[i]."""
    rows, cols = m.shape
    out = torch.zeros(rows, cols // 8, dtype=torch.int32)
    for r in range(rows):
        for c in range(cols // 8):
            out[r, c] = _word([m[r, 8 * c + order[i]] for i in range(8)])
    return out


def awq_tensors(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor) -> dict:
    """AWQ gemm: qweight [in, out / 8], qzeros [groups, out / 8], scales [groups, out]."""
    return {
        "qweight": _pack_columns(codes.t(), AWQ_PACK_ORDER),
        "qzeros": _pack_columns(zeros.t(), AWQ_PACK_ORDER),
        "scales": scales.t().contiguous(),
    }


def gptq_tensors(
    codes: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    v1: bool = True,
    perm: torch.Tensor | None = None,
) -> dict:
    """GPTQ: qweight [in / 8, out] (input rows packed in order), qzeros [groups, out / 8]
    (v1: each zero minus one), scales [groups, out], g_idx [in]. With ``perm`` (activation
    order), code column j of ``codes`` is the checkpoint's input column perm[j]."""
    out, inp = codes.shape
    group = inp // zeros.shape[1]
    g_idx = torch.arange(inp, dtype=torch.int32) // group
    if perm is not None:
        unpermuted = torch.empty_like(codes)
        unpermuted[:, perm] = codes
        codes = unpermuted
        g_idx = torch.empty_like(g_idx)
        g_idx[perm] = (torch.arange(inp) // group).to(torch.int32)
    cols = codes.t()  # [in, out]
    qweight = torch.zeros(inp // 8, out, dtype=torch.int32)
    for r in range(inp // 8):
        for o in range(out):
            qweight[r, o] = _word([cols[8 * r + i, o] for i in range(8)])
    stored = (zeros - 1) if v1 else zeros
    return {
        "qweight": qweight,
        "qzeros": _pack_columns(stored.t() & 0xF, tuple(range(8))),
        "scales": scales.t().contiguous(),
        "g_idx": g_idx,
    }
