"""A token whose slot is ``PAD_SLOT`` (a CUDA graph's padding row, engine.step.graphs) writes
nothing: the KV writers leave every byte of the cache as it was, whatever the cache's row
format, and still write the live tokens beside it."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, LAYER, NUM_LAYERS

from engine.kv_format.rows import CODE_DTYPES, row_width
from engine.triton_kernels import PAD_SLOT, rope_write_kv, write_kv
from engine.triton_kernels.reference import apply_rope_ref, rope_cos_sin_cache

pytest.importorskip("triton")

KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCKS = 2, 16, 4, 5


def _cache(kv_dtype: str) -> torch.Tensor:
    """A cache of random bytes: any write shows."""
    gen = torch.Generator().manual_seed(7)
    width = HEAD_DIM if kv_dtype == "auto" else row_width(HEAD_DIM, kv_dtype)
    shape = (BLOCKS, NUM_LAYERS, 2, BLOCK_SIZE, KV_HEADS, width)
    if kv_dtype == "auto":
        return torch.randn(shape, generator=gen).to(DEVICE)
    codes = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
    return codes.view(CODE_DTYPES[kv_dtype]).to(DEVICE)


def _bytes(kv: torch.Tensor) -> torch.Tensor:
    return kv.view(torch.uint8).clone()


def _written(before: torch.Tensor, kv: torch.Tensor) -> set[int]:
    """The slots of LAYER whose bytes changed."""
    diff = (before != kv.view(torch.uint8))[:, LAYER]  # [blocks, 2, block_size, ...]
    changed = diff.transpose(1, 2).flatten(2).any(-1)  # [blocks, block_size]
    return set(changed.flatten().nonzero().flatten().tolist())


@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "fp8_e4m3"])
def test_write_kv_skips_padding_slots(kv_dtype: str) -> None:
    kv = _cache(kv_dtype)
    before = _bytes(kv)
    k = torch.randn(4, KV_HEADS, HEAD_DIM, device=DEVICE) + 3.0
    slots = torch.tensor([PAD_SLOT, 6, PAD_SLOT, 13], device=DEVICE)
    write_kv(k, k.clone(), kv, LAYER, slots)
    assert _written(before, kv) == {6, 13}
    others = [i for i in range(NUM_LAYERS) if i != LAYER]
    assert torch.equal(kv.view(torch.uint8)[:, others], before[:, others])


@pytest.mark.parametrize("kv_dtype", ["auto", "int8", "fp8_e4m3"])
def test_rope_write_kv_skips_padding_slots_but_rotates_them(kv_dtype: str) -> None:
    kv = _cache(kv_dtype)
    before = _bytes(kv)
    heads = 2 * KV_HEADS
    qkv = torch.randn(3, heads + 2 * KV_HEADS, HEAD_DIM, device=DEVICE) + 3.0
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + KV_HEADS], qkv[:, heads + KV_HEADS :]
    table = rope_cos_sin_cache(HEAD_DIM, 32, 10000.0, DEVICE)
    positions = torch.tensor([5, 5, 9], device=DEVICE)
    slots = torch.tensor([PAD_SLOT, 1, PAD_SLOT], device=DEVICE)
    expected_q, _ = apply_rope_ref(q, k, positions, table)
    rope_write_kv(q, k, v, positions, table, kv, LAYER, slots)
    assert _written(before, kv) == {1}
    torch.testing.assert_close(q, expected_q, atol=1e-6, rtol=1e-6)  # padding rotated too
