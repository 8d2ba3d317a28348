"""Decode attention's work plan (paged_attention.c) changes no bit of the output: a large
batch walks the kv heads of a sequence together, longest context first, a small one each
kv head apart, and a sequence's output is the same bits either way, whatever the threads."""

from __future__ import annotations

import pytest
import torch

from engine import cpu_kernels
from engine.kv_format.rows import quantize_rows

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)

SEQS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 24, 9, 3, 64, 16


def _case(quantized: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contexts of very different lengths (1 to 40 blocks), blocks scattered over the cache."""
    gen = torch.Generator().manual_seed(5)
    width = 40
    kv = torch.randn(SEQS * width + 2, 2, 2, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    if quantized:
        kv = quantize_rows(kv, "int8")
    q = torch.randn(SEQS, HEADS, HEAD_DIM, generator=gen)
    tables = torch.randperm(kv.shape[0], generator=gen)[: SEQS * width].view(SEQS, width).int()
    lens = torch.randint(1, width * BLOCK + 1, (SEQS,), generator=gen, dtype=torch.int32)
    lens[:3] = torch.tensor([1, width * BLOCK, BLOCK])
    return q, kv, tables, lens


@pytest.mark.parametrize("quantized", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("window", [0, 100])
def test_batched_output_is_each_sequence_alone_bit_for_bit(
    threads: int, quantized: bool, window: int
) -> None:
    q, kv, tables, lens = _case(quantized)
    batched = cpu_kernels.paged_decode_attention(q, kv, 1, tables, lens, 0.125, window=window)
    for s in range(SEQS):
        alone = cpu_kernels.paged_decode_attention(
            q[s : s + 1], kv, 1, tables[s : s + 1], lens[s : s + 1], 0.125, window=window
        )
        assert torch.equal(batched[s], alone[0]), f"sequence {s} (context {int(lens[s])})"
