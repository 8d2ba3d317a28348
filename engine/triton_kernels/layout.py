"""Shared launch helpers: the per-layer view of the paged KV cache and tile choices."""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from engine.triton_kernels.kv_quant import quant_code, row_head_dim


class KVLayerView(NamedTuple):
    """Element offsets into the block-major cache ``[blocks, layers, 2, block, kv_heads, d]``.

    K of token ``t`` in block ``b``, head ``h`` starts at
    ``layer_offset + b * block_stride + t * token_stride + h * head_stride``; V is ``v_offset``
    further. The head dimension is contiguous. A quantized cache (``quant`` 1: int8, 2: fp8
    e4m3, see ``kv_quant``) counts in bytes and its rows are ``head_dim`` + 8 bytes long.
    """

    layer_offset: int
    v_offset: int
    block_stride: int
    token_stride: int
    head_stride: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    quant: int = 0


def kv_layer_view(kv: torch.Tensor, layer: int) -> KVLayerView:
    """Strides of layer ``layer`` of ``kv``; checks the layout instead of copying the cache."""
    if kv.dim() != 6 or kv.shape[2] != 2:
        raise ValueError(
            f"kv must be [num_blocks, num_layers, 2, block_size, kv_heads, head_dim], "
            f"got {tuple(kv.shape)}"
        )
    if not 0 <= layer < kv.shape[1]:
        raise ValueError(f"layer {layer} out of range for a cache of {kv.shape[1]} layers")
    if kv.stride(-1) != 1:
        raise ValueError("kv must have a contiguous head_dim (stride 1)")
    return KVLayerView(
        layer_offset=layer * kv.stride(1),
        v_offset=kv.stride(2),
        block_stride=kv.stride(0),
        token_stride=kv.stride(3),
        head_stride=kv.stride(4),
        block_size=kv.shape[3],
        num_kv_heads=kv.shape[4],
        head_dim=row_head_dim(kv),
        quant=quant_code(kv),
    )


def interpreted(t: torch.Tensor) -> bool:
    """True when kernels run in Triton's CPU interpreter (tensors on the CPU)."""
    return t.device.type == "cpu"


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device, which the kernels' grids are planned to
    fill; 1 elsewhere (the interpreter: no splits)."""
    if device.type != "cuda":
        return 1
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pow2(n: int, minimum: int = 1) -> int:
    """Smallest power of two >= max(n, minimum): tl.arange needs power-of-two extents."""
    return max(triton.next_power_of_2(n), minimum)


@triton.jit
def _sum_splits_kernel(ws_ptr, out_ptr, total, splits, BLOCK: tl.constexpr):
    """out[i] = sum over s in order of ws[s, i] (fp32), in out's dtype."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < total
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(splits):
        acc += tl.load(ws_ptr + s * total + i, mask=ok, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=ok)


def sum_splits(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """partial [splits, *shape] fp32 (contiguous) summed over the splits in order, as
    ``dtype``: one kernel, and the same bits every call (no atomics)."""
    out = torch.empty(partial.shape[1:], dtype=dtype, device=partial.device)
    total, block = out.numel(), 1024
    _sum_splits_kernel[(triton.cdiv(total, block),)](
        partial, out, total, partial.shape[0], BLOCK=block
    )
    return out


def dot_precision(dtype: torch.dtype) -> str:
    """Exact fp32 dots for fp32 inputs (TF32 would miss the reference); default otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_attention_inputs(
    q: torch.Tensor, kv: torch.Tensor, view: KVLayerView, **index_tensors: torch.Tensor
) -> None:
    """Raise ValueError on inputs the attention kernels would misread.

    q: [rows, heads, d] with heads a multiple of the cache's KV heads; same dtype as kv (a
    float dtype over a quantized cache); everything on one device; contiguous last dimensions.
    """
    if q.dim() != 3 or q.shape[2] != view.head_dim or q.shape[1] % view.num_kv_heads:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit kv heads={view.num_kv_heads} d={view.head_dim}"
        )
    if view.quant and q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"q dtype {q.dtype} cannot attend over a quantized cache")
    if not view.quant and q.dtype != kv.dtype:
        raise ValueError(f"q dtype {q.dtype} differs from the cache dtype {kv.dtype}")
    tensors = {"q": q, "kv": kv, **index_tensors}
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors must share one device, got {devices}")
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous last dimension")


def sink_logits(sinks: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    """The kernels' attention sinks: [heads] contiguous fp32 on q's device, times log2(e)
    (the kernels' softmax is in the log2 domain); without sinks a one-element stand-in the
    kernels never read (a pointer argument needs a tensor)."""
    heads = q.shape[1]
    if sinks is None:
        return torch.zeros(1, dtype=torch.float32, device=q.device)
    if sinks.shape != (heads,):
        raise ValueError(f"attention sinks of shape {tuple(sinks.shape)} for {heads} heads")
    if sinks.device != q.device:
        raise ValueError(f"attention sinks on {sinks.device}, q on {q.device}")
    return sinks.detach().float() * 1.4426950408889634


@triton.jit
def soft_cap(s, cap):
    """``cap * tanh(s / cap)`` of scores ``s``; in the log2 domain the kernels work in, pass
    ``cap`` times log2(e). tanh(y) = 1 - 2 / (e^2y + 1): exact at both ends, no overflow."""
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))


@triton.jit
def sink_share(lse, sink):
    """The keys' share of a softmax whose keys sum to 2^lse beside an attention sink of logit
    ``sink`` (both log2 domain): 2^lse / (2^lse + 2^sink); 0 where no key was seen."""
    top = tl.maximum(lse, sink)
    keys = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - top))
    return keys / (keys + tl.exp2(sink - top))
