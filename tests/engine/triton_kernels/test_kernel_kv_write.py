"""Writing new K / V into the paged cache (Triton) against the torch scatter."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, LAYER, NUM_LAYERS

from engine.triton_kernels import write_kv
from engine.triton_kernels.reference import write_kv_ref

pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [4, 16])
def test_write_kv_scatters_into_the_given_slots_only(block_size: int, dtype: torch.dtype) -> None:
    kv_heads, head_dim, tokens = 3, 16, 9
    kv = torch.randn(7, NUM_LAYERS, 2, block_size, kv_heads, head_dim, device=DEVICE).to(dtype)
    expected = kv.clone()
    # k and v are strided slices of one fused projection, as the model produces them.
    fused = torch.randn(tokens, 2 * kv_heads * head_dim + 5, device=DEVICE).to(dtype)
    k = fused[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    v = fused[:, kv_heads * head_dim : 2 * kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(7 * block_size, device=DEVICE)[:tokens]  # int64, scattered
    write_kv(k, v, kv, LAYER, slots)
    write_kv_ref(k, v, expected, LAYER, slots)
    assert torch.equal(kv, expected)
    blocks, offsets = slots // block_size, slots % block_size
    assert torch.equal(kv[blocks, LAYER, 0, offsets], k)
    assert torch.equal(kv[blocks, LAYER, 1, offsets], v)


def test_write_kv_rejects_mismatched_heads() -> None:
    kv = torch.zeros(2, NUM_LAYERS, 2, 4, 2, 16, device=DEVICE)
    k = torch.zeros(3, 3, 16, device=DEVICE)
    slots = torch.arange(3, device=DEVICE)
    with pytest.raises(ValueError, match="tokens, 2, 16"):
        write_kv(k, k, kv, LAYER, slots)
