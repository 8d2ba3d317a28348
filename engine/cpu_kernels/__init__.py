"""CPU kernels in C, built with the machine's C compiler on first use and called via ctypes.

- ``paged_prefill_attention`` (``prefill.py``, ``prefill_attention.c``): causal attention of
  the prefill chunks, flash-attention style over the cache in place: one call for a step's
  chunks instead of one SDPA per chunk.
- ``paged_decode_attention``: the torch attention backend gathers each decode's KV blocks
  into a padded buffer and runs SDPA over it: two extra passes over the whole KV of the
  batch, plus the padding to the longest context. This reads the blocks where they lie
  (``paged_attention.c``); on the CPU it is the decode half of the default backend.
- ``rope_write_kv``, ``silu_mul``, ``rms_norm`` and ``head_norm_`` (``fused_ops.c``; the
  norms' wrappers in ``norms.py``): one pass each where torch runs several element-wise ops
  and allocations per layer.
- ``linear`` (``linear.c``) over weights packed once by ``pack_linear_weight``: faster than
  ``F.linear`` (which re-packs the weight on every call) from 1 to 2048 rows as measured.
- ``sample`` (``sampling.c``): the batched sampler's argmax or temperature / top-k / top-p /
  min-p / inverse-CDF draw, one pass per row with a partial selection instead of torch's
  ``topk`` and its dozen batch-wide ops (engine.sampling.sampler uses it on the CPU).

The library is compiled once per source, compiler and CPU into ``$SPLITSERVE_KERNEL_CACHE``
(default ``~/.cache/splitserve/kernels``), written to a temporary name and renamed, so
processes that start together never load a half-written file. Without a C compiler (or with
``SPLITSERVE_CPU_KERNELS=0``) ``available()`` is False and callers keep the torch path; the
reason is logged once.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch

from engine.cpu_kernels.build import (
    CACHE_ENV,
    HEADERS,
    SOURCES,
    KernelBuildError,
    build,
    default_cache_dir,
)
from engine.kv_format.rows import SCALE_BYTES

log = logging.getLogger(__name__)

ENABLE_ENV = "SPLITSERVE_CPU_KERNELS"
# The kernel's fixed per-thread buffers (MAX_* in the C source).
MAX_GROUP, MAX_BLOCK_SIZE = 32, 128
PANEL = 16  # output columns per packed weight panel (linear.c)
HEAD_DIMS = (16, 32, 64, 96, 128, 256)  # the instantiations in the C source
_I64, _I32, _F32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


def available() -> bool:
    """True when the compiled kernels can be used in this process (built now if needed)."""
    return _library() is not None


def _threads() -> int:
    return torch.get_num_threads()


def supports(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """True when ``paged_decode_attention`` takes these tensors (else use the torch path)."""
    kv_heads, head_dim = kv_cache.shape[4], q.shape[-1]
    return (
        q.stride(-1) == 1
        and kv_cache.shape[5] == head_dim + (SCALE_BYTES if kv_cache.dtype == torch.int8 else 0)
        and q.shape[1] % kv_heads == 0
        and q.shape[1] // kv_heads <= MAX_GROUP
        and head_dim in HEAD_DIMS
        and kv_cache.shape[3] <= MAX_BLOCK_SIZE
        and fused_ops_supported(q, kv_cache)
    )


def paged_decode_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence over its paged context, K/V read in place; with ``window`` > 0
    only the last ``window`` keys (the blocks before them are never read), with ``softcap``
    > 0 each score soft-capped at it, with ``sinks`` [heads] one more logit per head in
    each softmax (gpt-oss's attention sinks).

    q: [seqs, heads, d] fp32 (any strides with the last one 1); kv_cache: the contiguous
    cache [num_blocks, layers, 2, block_size, kv_heads, d] fp32, or int8 with rows of d codes
    + scales and mids (kv_cache_dtype int8: [..., d + 8]); block_tables: [seqs, >= blocks
    needed] int32 of valid block ids (the block manager's); context_lens: [seqs] int32.
    Returns [seqs, heads, d]. Tables too short for their contexts raise ValueError.
    """
    lib = _require()
    seqs, heads, head_dim = q.shape
    _, _, _, block_size, kv_heads, _ = kv_cache.shape
    tables = block_tables if block_tables.dtype == torch.int32 else block_tables.int()
    tables = tables if tables.stride(-1) == 1 else tables.contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    # the C side trusts these: a short table or a missing row would read outside memory
    if tables.shape[0] != seqs or lens.shape != (seqs,):
        raise ValueError(
            f"paged_decode_attention: {seqs} queries, {tables.shape[0]} block tables, "
            f"{lens.shape[0]} context lengths"
        )
    if seqs and int(lens.max()) > tables.shape[1] * block_size:
        raise ValueError(
            f"paged_decode_attention: a context of {int(lens.max())} tokens needs more than "
            f"the {tables.shape[1]} blocks of its table"
        )
    out = torch.empty(seqs, heads, head_dim, dtype=q.dtype)
    k_offset = layer * kv_cache.stride(1)
    sink = sink_logits(sinks, heads)
    rc = lib.splitserve_paged_decode_f32(
        q.data_ptr(), q.stride(0), q.stride(1), out.data_ptr(),
        kv_cache.data_ptr(), int(kv_cache.dtype == torch.int8),
        kv_cache.stride(0), k_offset, k_offset + kv_cache.stride(2),
        tables.data_ptr(), tables.stride(0), lens.data_ptr(),
        seqs, heads, kv_heads, head_dim, block_size, scale, window, softcap,
        None if sink is None else sink.data_ptr(), _threads(),
    )  # fmt: skip
    if rc != 0:
        raise ValueError(
            f"paged_decode_attention: unsupported shape (heads {heads}, kv_heads {kv_heads}, "
            f"head_dim {head_dim}, block_size {block_size})"
        )
    return out


def sink_logits(sinks: torch.Tensor | None, heads: int) -> torch.Tensor | None:
    """The kernels' attention sinks: [heads] contiguous fp32 (None: none)."""
    if sinks is None:
        return None
    if sinks.shape != (heads,):
        raise ValueError(f"attention sinks of shape {tuple(sinks.shape)} for {heads} heads")
    return sinks.detach().float().contiguous()


def fused_ops_supported(x: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """True when the kernels take activations like ``x`` over this cache: fp32 on the CPU,
    a contiguous fp32 or int8 (kv_cache_dtype int8) cache, and the library built (the
    element-wise kernels need no more)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and kv_cache.dtype in (torch.float32, torch.int8)
        and kv_cache.is_contiguous()
        and available()
    )


def rope_write_kv(
    qkv: torch.Tensor,
    heads: int,
    kv_heads: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    slot_mapping: torch.Tensor,
    checked: bool = False,
) -> None:
    """Rotate the q and k heads of ``qkv`` in place and store K and V at their slots (as
    int8 codes + scales and mids per token and head in an int8 cache: engine.kv_format.rows).

    qkv: [tokens, (heads + 2 * kv_heads) * d] fp32 with unit last stride; positions and
    slot_mapping: [tokens] int64; cos, sin: [max_position, d / 2] contiguous. ``checked``:
    positions and slot_mapping come from ``rope_indices`` for this cache and these tables
    (a step's layers share them: checked once, not once a layer).
    """
    lib = _require()
    quantized = kv_cache.dtype == torch.int8
    tokens, head_dim = qkv.shape[0], kv_cache.shape[5] - (SCALE_BYTES if quantized else 0)
    if qkv.stride(-1) != 1 or qkv.shape[1] != (heads + 2 * kv_heads) * head_dim:
        raise ValueError(f"rope_write_kv: qkv of shape {tuple(qkv.shape)} does not match heads")
    if not checked:
        positions, slot_mapping = rope_indices(positions, slot_mapping, kv_cache, cos)
    if positions.shape != (tokens,):
        raise ValueError(f"rope_write_kv: {tokens} tokens need as many positions and slots")
    cos, sin, slots = cos.contiguous(), sin.contiguous(), slot_mapping
    k_offset = layer * kv_cache.stride(1)
    write = lib.splitserve_rope_write_kv_i8 if quantized else lib.splitserve_rope_write_kv_f32
    write(
        qkv.data_ptr(), qkv.stride(0), tokens, heads, kv_heads, head_dim,
        positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
        kv_cache.data_ptr(), kv_cache.stride(0), k_offset, k_offset + kv_cache.stride(2),
        kv_cache.stride(3), slots.data_ptr(), kv_cache.shape[3], _threads(),
    )  # fmt: skip


def rope_indices(
    positions: torch.Tensor, slot_mapping: torch.Tensor, kv_cache: torch.Tensor, cos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions and slot_mapping as contiguous int64, checked against the cache's slots and
    the rotary table's rows: the C side trusts them (an index out of range would write
    outside the cache)."""
    positions = positions.to(torch.int64).contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    tokens = positions.shape[0]
    slot_range = kv_cache.shape[0] * kv_cache.shape[3]
    if positions.dim() != 1 or slots.shape != (tokens,):
        raise ValueError(f"rope_write_kv: {tokens} tokens need as many positions and slots")
    if tokens and not (int(slots.min()) >= 0 and int(slots.max()) < slot_range):
        raise ValueError(f"rope_write_kv: a slot outside the cache's {slot_range} slots")
    if tokens and not (int(positions.min()) >= 0 and int(positions.max()) < cos.shape[0]):
        raise ValueError(f"rope_write_kv: a position beyond the {cos.shape[0]} rotary rows")
    return positions, slots


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [tokens, 2 * inter] fp32 (unit last stride)."""
    lib = _require()
    tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    if gate_up.stride(-1) != 1:
        raise ValueError("silu_mul: gate_up needs a unit last stride")
    out = torch.empty(tokens, inter, dtype=gate_up.dtype)
    lib.splitserve_silu_mul_f32(
        gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), out.stride(0), tokens, inter,
        _threads(),
    )  # fmt: skip
    return out


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [N, K] as panels [N / 16, K, 16] for ``linear``; None where the kernel does
    not take it (not fp32 on the CPU, N not a multiple of 16, or no kernels here)."""
    n, k = weight.shape
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or n % PANEL:
        return None
    if not available():
        return None
    return weight.detach().view(n // PANEL, PANEL, k).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, packed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T`` for x [M, K] fp32 (unit last stride) and ``packed`` from
    ``pack_linear_weight``; with ``out`` [M, N] (unit last stride) the product is added to
    it in place and ``out`` is returned."""
    lib = _require()
    panels, k, _ = packed.shape
    m, n = x.shape[0], panels * PANEL
    if x.device.type != "cpu" or (out is not None and out.device.type != "cpu"):
        raise ValueError(f"linear: the C kernel takes CPU tensors, got x on {x.device}")
    if x.shape[1] != k or x.stride(-1) != 1 or x.dtype != torch.float32:
        raise ValueError(f"linear: x {tuple(x.shape)} does not fit a weight of {n}x{k}")
    if out is not None and (out.shape != (m, n) or out.stride(-1) != 1):
        raise ValueError(f"linear: out {tuple(out.shape)} is not a [{m}, {n}] row-major view")
    accumulate = out is not None
    out = torch.empty(m, n, dtype=x.dtype) if out is None else out
    lib.splitserve_linear_f32(
        x.data_ptr(), x.stride(0), packed.data_ptr(), m, n, k, out.data_ptr(), out.stride(0),
        int(accumulate), _threads(),
    )  # fmt: skip
    return out


def vec_width() -> int:
    """Floats per vector the kernels were built for: 16 with AVX-512, else 8 (vecw.h)."""
    return int(_require().splitserve_vec_width())


def _require() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise KernelBuildError("CPU kernels are not available here (see the log)")
    return lib


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get(ENABLE_ENV, "1") == "0":
        log.info("cpu_kernels_disabled env=%s", ENABLE_ENV)
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (KernelBuildError, OSError) as exc:
        log.warning("cpu_kernels_unavailable fallback=torch error=%s", exc)
        return None
    lib.splitserve_paged_decode_f32.restype = ctypes.c_int
    lib.splitserve_paged_decode_f32.argtypes = [
        _P, _I64, _I64, _P,  # q, its strides, out
        _P, _I32, _I64, _I64, _I64,  # cache, quantized, block stride, K and V offsets
        _P, _I64, _P,  # tables, table stride, context lengths
        _I32, _I32, _I32, _I32, _I32, _F32,  # sizes, scale
        _I32, _F32, _P, _I32,  # window, soft-cap, sinks, threads
    ]  # fmt: skip
    for write in (lib.splitserve_rope_write_kv_f32, lib.splitserve_rope_write_kv_i8):
        write.restype = None
        write.argtypes = [
            _P, _I64, _I32, _I32, _I32, _I32,  # qkv, row stride, tokens, heads, kv heads, dim
            _P, _P, _P,  # positions, cos, sin
            _P, _I64, _I64, _I64, _I64,  # cache, block stride, K / V offsets, token stride
            _P, _I32, _I32,  # slots, block size, threads
        ]  # fmt: skip
    lib.splitserve_silu_mul_f32.restype = None
    lib.splitserve_silu_mul_f32.argtypes = [_P, _I64, _P, _I64, _I32, _I32, _I32]
    lib.splitserve_linear_f32.restype = None
    lib.splitserve_linear_f32.argtypes = [_P, _I64, _P, _I32, _I32, _I32, _P, _I64, _I32, _I32]
    lib.splitserve_vec_width.restype = ctypes.c_int32
    lib.splitserve_sample_f32.restype = ctypes.c_int
    lib.splitserve_sample_f32.argtypes = [_P, _I64, _I32, _I32, *([_P] * 7), _P, _I32]
    return lib


from engine.cpu_kernels.norms import head_norm_, rms_norm  # noqa: E402 (they use the above)
from engine.cpu_kernels.prefill import (  # noqa: E402
    PrefillIndex,
    paged_prefill_attention,
    prefill_index,
    prefill_supported,
)
from engine.cpu_kernels.sampling_ops import argmax, sample  # noqa: E402

__all__ = [
    "CACHE_ENV",
    "ENABLE_ENV",
    "HEADERS",
    "SOURCES",
    "KernelBuildError",
    "PrefillIndex",
    "argmax",
    "available",
    "build",
    "default_cache_dir",
    "fused_ops_supported",
    "head_norm_",
    "linear",
    "pack_linear_weight",
    "paged_decode_attention",
    "paged_prefill_attention",
    "prefill_index",
    "prefill_supported",
    "rms_norm",
    "rope_indices",
    "rope_write_kv",
    "sample",
    "silu_mul",
    "supports",
    "vec_width",
]
