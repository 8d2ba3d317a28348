"""Paged prefill attention (``prefill_attention.c``): the query tokens of prefill chunks over
the paged cache, causal after a cached prefix, in one flash-attention-style call for all
chunks of a step. On the CPU it is the prefill half of the default attention backend
(engine.model.torch_attention); its reference is the torch path (SDPA over gathered blocks).
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from engine import cpu_kernels

_I64, _I32, _F32, _P = ctypes.c_int64, ctypes.c_int32, ctypes.c_float, ctypes.c_void_p


def prefill_supported(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor
) -> bool:
    """True when ``paged_prefill_attention`` takes these tensors (else keep the torch path):
    the decode kernel's conditions, and fresh K/V in fp32 with a unit last stride."""
    return (
        cpu_kernels.supports(q, kv_cache)
        and k.dtype == v.dtype == torch.float32
        and k.stride(-1) == 1
        and v.stride(-1) == 1
    )


@dataclass(frozen=True)
class PrefillIndex:
    """A step's prefill offsets, context lengths and block tables as int32 (unit last stride),
    checked against each other once so that every layer's call can trust them."""

    query_start_loc: torch.Tensor  # [seqs + 1] int32
    context_lens: torch.Tensor  # [seqs] int32
    block_tables: torch.Tensor  # [seqs, blocks] int32
    tokens: int
    block_size: int

    @property
    def seqs(self) -> int:
        return self.context_lens.shape[0]


def check_query_offsets(offsets: torch.Tensor, tokens: int, kernel: str) -> torch.Tensor:
    """Checks that ``offsets`` [seqs + 1] (from 0) cover ``tokens`` tokens in chunks of at
    least one; returns the chunks' lengths. The prefill kernels trust their offsets."""
    n = offsets[1:] - offsets[:-1]
    if int(offsets[0]) != 0 or int(offsets[-1]) != tokens or bool((n < 1).any()):
        raise ValueError(f"{kernel}: query offsets do not cover the tokens")
    return n


def prefill_index(
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    tokens: int,
    block_size: int,
    kernel: str = "paged_prefill_attention",
) -> PrefillIndex:
    """Converts and checks the per-step index tensors of ``kernel`` (the C side trusts
    them: a short table or a bad offset would read outside memory)."""
    qsl = query_start_loc.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    tables = block_tables.to(torch.int32)
    tables = tables if tables.stride(-1) == 1 else tables.contiguous()
    seqs = lens.shape[0]
    if qsl.shape != (seqs + 1,) or tables.shape[0] != seqs:
        raise ValueError(
            f"{kernel}: {seqs} context lengths, {qsl.shape[0]} query offsets, "
            f"{tables.shape[0]} block tables"
        )
    if seqs:
        n = check_query_offsets(qsl, tokens, kernel)
        if bool((lens < n).any()) or int(lens.max()) > tables.shape[1] * block_size:
            raise ValueError(
                f"{kernel}: a context shorter than its chunk or longer than its block table"
            )
    return PrefillIndex(qsl, lens, tables, tokens, block_size)


def paged_prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    layer: int,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    index: PrefillIndex | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of prefill chunks: sequence i owns query tokens ``query_start_loc[i] ..
    query_start_loc[i + 1] - 1``, the last of its ``context_lens[i]`` positions, and attends
    causally to its earlier positions (within ``window`` when > 0, scores soft-capped at
    ``softcap`` when > 0, ``sinks`` [heads] one more logit in each softmax). A sequence
    without a cached prefix reads its keys from the step's fresh ``k``, ``v``; the others
    read the cache (fp32, or int8 rows dequantised).

    q: [tokens, heads, d] fp32; k, v: [tokens, kv_heads, d] fp32 (unit last strides);
    kv_cache as ``cpu_kernels.paged_decode_attention``; query_start_loc: [seqs + 1] from 0;
    context_lens: [seqs]; block_tables: [seqs, >= blocks needed]. Returns [tokens, heads, d].
    ``index``: ``prefill_index`` of the same three tensors, built and checked once per step
    and shared by the layers (the three tensors are then not read again).
    """
    lib = _lib()
    tokens, heads, head_dim = q.shape
    _, _, _, block_size, kv_heads, _ = kv_cache.shape
    if index is None:
        index = prefill_index(query_start_loc, context_lens, block_tables, tokens, block_size)
    elif index.tokens != tokens or index.block_size != block_size:
        raise ValueError(
            f"paged_prefill_attention: index for {index.tokens} tokens in blocks of "
            f"{index.block_size}, called with {tokens} tokens in blocks of {block_size}"
        )
    qsl, lens, tables, seqs = (
        index.query_start_loc,
        index.context_lens,
        index.block_tables,
        index.seqs,
    )
    if k.shape != v.shape or k.shape[0] != tokens or k.shape[1:] != (kv_heads, head_dim):
        raise ValueError(f"paged_prefill_attention: k {tuple(k.shape)} does not match q")
    out = torch.empty(tokens, heads, head_dim, dtype=q.dtype)
    k_offset = layer * kv_cache.stride(1)
    sink = cpu_kernels.sink_logits(sinks, heads)
    rc = lib.splitserve_paged_prefill_f32(
        q.data_ptr(), q.stride(0), q.stride(1),
        k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(), v.stride(0), v.stride(1),
        out.data_ptr(), kv_cache.data_ptr(), int(kv_cache.dtype == torch.int8),
        kv_cache.stride(0), k_offset, k_offset + kv_cache.stride(2),
        tables.data_ptr(), tables.stride(0), qsl.data_ptr(), lens.data_ptr(), seqs,
        heads, kv_heads, head_dim, block_size, scale, window, softcap,
        None if sink is None else sink.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if rc != 0:
        raise ValueError(
            f"paged_prefill_attention: unsupported shape or out of memory (rc {rc}: heads "
            f"{heads}, kv_heads {kv_heads}, head_dim {head_dim})"
        )
    return out


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = cpu_kernels._require()
    fn = lib.splitserve_paged_prefill_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [
        _P, _I64, _I64,  # q and its strides
        _P, _I64, _I64, _P, _I64, _I64,  # fresh k, v and their strides
        _P, _P, _I32,  # out, cache, quantized
        _I64, _I64, _I64,  # block stride, K and V offsets
        _P, _I64, _P, _P, _I32,  # tables, table stride, query offsets, context lengths, seqs
        _I32, _I32, _I32, _I32,  # heads, kv heads, head dim, block size
        _F32, _I32, _F32, _P, _I32,  # scale, window, soft-cap, sinks, threads
    ]  # fmt: skip
    return lib
