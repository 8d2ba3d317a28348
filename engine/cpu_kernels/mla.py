"""Multi-head latent attention over the paged latent cache (``mla_attention.c``): a step's
decodes and prefill chunks in one call, in the absorbed form (queries projected into the
latent space, outputs left in it). Its reference is the torch path
(``engine.model.mla_attention``); ``engine.model.mla_kernels`` picks it on the CPU.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from engine import cpu_kernels
from engine.cpu_kernels.prefill import PrefillIndex
from engine.kv_format.rows import SCALE_BYTES, is_latent, is_quantized

_I64, _I32, _F32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p
KERNEL = "paged_mla_attention"
# the C side's kv_cache_dtype codes (0: fp32 rows)
QUANT = {torch.float32: 0, torch.int8: 1, torch.float8_e4m3fn: 2}


def mla_supported(q: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """True when ``paged_mla_attention`` takes these tensors (else keep the torch path): fp32
    queries on the CPU over a contiguous latent cache of fp32, int8 or fp8 e4m3 rows, blocks
    of at most ``MAX_BLOCK_SIZE`` tokens, and the library built."""
    return (
        q.device.type == "cpu"
        and q.dtype == torch.float32
        and q.stride(-1) == 1
        and kv_cache.dtype in QUANT
        and kv_cache.is_contiguous()
        and is_latent(kv_cache)
        and kv_cache.shape[4] == 1
        and kv_cache.shape[3] <= cpu_kernels.MAX_BLOCK_SIZE
        and cpu_kernels.available()
    )


def paged_mla_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    index: PrefillIndex,
    kv_lora: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a step's absorbed queries over the latent cache.

    q: [tokens, heads, latent] fp32 (unit last stride): per head ``W_uk^T q_nope`` then the
    rotated ``q_pe``; kv_cache: [blocks, layers, 1, block_size, 1, latent] fp32, or int8 /
    fp8 e4m3 rows of latent codes + scales and mids; ``index``: ``cpu_kernels.prefill_index``
    of the step's query offsets (from 0), context lengths and block tables, every sequence
    (decodes are chunks of one). This step's rows must be in the cache. Returns [tokens,
    heads, kv_lora]: each head's softmax-weighted sum of the latents ``c``.
    """
    tokens, heads, latent = q.shape
    block_size = kv_cache.shape[3]
    row = kv_cache.shape[5] - (SCALE_BYTES if is_quantized(kv_cache) else 0)
    if latent != row or not 0 < kv_lora < latent:
        raise ValueError(
            f"{KERNEL}: queries of {latent} values over latent rows of {row} (kv_lora {kv_lora})"
        )
    if index.tokens != tokens or index.block_size != block_size:
        raise ValueError(
            f"{KERNEL}: index for {index.tokens} tokens in blocks of {index.block_size}, "
            f"called with {tokens} tokens in blocks of {block_size}"
        )
    out = torch.empty(tokens, heads, kv_lora, dtype=torch.float32)
    rc = _lib().splitserve_mla_attention_f32(
        q.data_ptr(), q.stride(0), q.stride(1), out.data_ptr(),
        kv_cache.data_ptr(), QUANT[kv_cache.dtype], kv_cache.stride(0),
        layer * kv_cache.stride(1), kv_cache.stride(3),
        index.block_tables.data_ptr(), index.block_tables.stride(0),
        index.query_start_loc.data_ptr(), index.context_lens.data_ptr(), index.seqs,
        heads, latent, kv_lora, block_size, scale, torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise ValueError(
            f"{KERNEL}: unsupported shape or out of memory (rc {rc}: heads {heads}, latent "
            f"{latent}, kv_lora {kv_lora}, block_size {block_size})"
        )
    return out


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    fn = lib.splitserve_mla_attention_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [
        _P, _I64, _I64, _P,  # q and its strides, out
        _P, _I32, _I64, _I64, _I64,  # cache, quant, block stride, layer offset, token stride
        _P, _I64, _P, _P, _I32,  # tables, table stride, query offsets, context lengths, seqs
        _I32, _I32, _I32, _I32,  # heads, latent, kv_lora, block size
        _F32, _I32,  # scale, threads
    ]  # fmt: skip
    return lib
