"""Fused residual add + RMSNorm: one read of x and residual, one write of each result."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_kernels.layout import pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [tokens, hidden]
    res_ptr,  # [tokens, hidden], read when HAS_RESIDUAL
    w_ptr,  # [hidden]
    out_ptr,  # [tokens, hidden]
    new_res_ptr,  # [tokens, hidden], written when HAS_RESIDUAL
    stride_x,
    stride_r,
    stride_o,
    stride_n,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like the model's add
        tl.store(new_res_ptr + row * stride_n + cols, x, mask=mask)
    s = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(s * s, 0) / HIDDEN + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (s * inv_rms * w).to(x.dtype), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rmsnorm(x + residual) * weight, x + residual)`` in x's dtype.

    x, residual: [tokens, hidden]; weight: [hidden]. Without a residual the second result is
    x itself (the next layer's residual), so callers can chain layers the same way.
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"x must be [tokens, hidden] and weight [hidden], got {tuple(x.shape)}, "
            f"{tuple(weight.shape)}"
        )
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
    if x.stride(-1) != 1 or (residual is not None and residual.stride(-1) != 1):
        raise ValueError("x and residual need a contiguous last dimension")
    out = torch.empty_like(x)
    new_res = x if residual is None else torch.empty_like(x)
    res = x if residual is None else residual
    if x.shape[0] == 0:
        return out, new_res
    hidden = x.shape[1]
    block = pow2(hidden)
    _rms_norm_kernel[(x.shape[0],)](
        x, res, weight.contiguous(), out, new_res,
        x.stride(0), res.stride(0), out.stride(0), new_res.stride(0), eps,
        HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None,
        num_warps=min(max(block // 256, 1), 8),
    )  # fmt: skip
    return out, new_res
