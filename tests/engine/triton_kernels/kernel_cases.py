"""Shared cases for the Triton kernel tests: device, dtypes, a paged cache with poisoned gaps.

On a machine without CUDA the root conftest sets TRITON_INTERPRET=1, so the same tests run
the kernels on CPU tensors in fp32 and fp16; on a GPU also in bf16. The interpreter (triton
3.9) gets bf16 wrong: ``tl.dot`` of bf16 tiles returns garbage and its bf16 rounding differs
from torch's, so bf16 is checked on a GPU only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from engine.kv_format.rows import quantize_rows
from engine.model.quant.int4_checkpoint import Int4Weight

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16] if CUDA else [torch.float32, torch.float16]
NUM_LAYERS = 3
LAYER = 1


class PagedCache(NamedTuple):
    """A cache whose unused slots hold NaN, so any read past a context shows in the output."""

    kv: torch.Tensor  # [blocks, layers, 2, block_size, kv_heads, d]
    block_tables: torch.Tensor  # [batch, max_blocks] int32, shuffled, padded with unused ids
    ctx_lens: torch.Tensor  # [batch] int32


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def random_int4(out: int, inp: int, group: int, ordered: bool = False, seed: int = 0) -> Int4Weight:
    """Random int4 codes, scales and zero points (a last group cut short where ``group`` does
    not divide ``inp``); activation-ordered when ``ordered``."""
    gen = torch.Generator().manual_seed(seed)
    groups = -(-inp // group)
    return Int4Weight(
        codes=torch.randint(0, 16, (out, inp), generator=gen, dtype=torch.uint8),
        scales=torch.rand(out, groups, generator=gen) * 0.05 + 0.01,
        zeros=torch.randint(0, 16, (out, groups), generator=gen).float(),
        group_size=group,
        perm=torch.randperm(inp, generator=gen) if ordered else None,
    )


def make_cache(
    lengths: Sequence[int], block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> PagedCache:
    """A cache holding random K/V for sequences of the given lengths, NaN everywhere else."""
    gen = torch.Generator().manual_seed(1234)
    needed = [-(-n // block_size) for n in lengths]
    max_blocks = max(needed) + 2  # padding columns the kernels must not follow
    num_blocks = sum(needed) * 2 + 3  # more blocks than used: tables are non-contiguous
    shape = (num_blocks, NUM_LAYERS, 2, block_size, kv_heads, head_dim)
    kv = torch.randn(shape, generator=gen).to(dtype)
    kv[:, LAYER] = float("nan")
    order = torch.randperm(num_blocks, generator=gen)
    tables = torch.empty((len(lengths), max_blocks), dtype=torch.int32)
    taken = 0
    for b, n in enumerate(lengths):
        tables[b] = order[taken : taken + max_blocks].to(torch.int32)
        pos = torch.arange(n)
        blocks = tables[b].long()[pos // block_size]  # [n]
        fresh = torch.randn((n, 2, kv_heads, head_dim), generator=gen).to(dtype)
        kv[blocks, LAYER, :, pos % block_size] = fresh  # [n, 2, kv_heads, d]
        taken += needed[b]
    ctx = torch.tensor(list(lengths), dtype=torch.int32)
    return PagedCache(kv.to(DEVICE), tables.to(DEVICE), ctx.to(DEVICE))


def poison_keys_before(cache: PagedCache, first_seen: Sequence[int]) -> torch.Tensor:
    """A copy of the cache with NaN at positions ``< first_seen[b]`` of each sequence ``b``.

    Keys below every query's sliding window must be skipped by the loop bounds, not read and
    masked: a NaN read there would reach the output (0 * NaN in the P @ V product).
    """
    kv = cache.kv.clone()
    block_size = kv.shape[3]
    for b, n in enumerate(first_seen):
        pos = torch.arange(max(n, 0), device=kv.device)
        blocks = cache.block_tables[b].long()[pos // block_size]
        kv[blocks, LAYER, :, pos % block_size] = float("nan")
    return kv


def quantize_cache(cache: PagedCache, kv_dtype: str) -> PagedCache:
    """``cache`` with every row quantized (``quantize_rows``); the rows that held NaN (unused
    slots) get NaN scales and mids, so a kernel that reads one shows it in its output."""
    kv = cache.kv
    unused = kv.isnan().any(-1)  # [blocks, layers, 2, block, kv_heads]
    rows = quantize_rows(torch.nan_to_num(kv, nan=0.0), kv_dtype)
    params = rows.view(torch.bfloat16)[..., kv.shape[-1] // 2 :]  # scales and mids
    params[unused] = float("nan")
    return PagedCache(rows, cache.block_tables, cache.ctx_lens)
