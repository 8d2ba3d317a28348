"""Packed quantized weights: rows stacked across formats, the embedding lookup, the torch
path where the kernel does not serve."""

from __future__ import annotations

import torch

from engine.model.quant.weight import QuantWeight, RowQuant, concat_rows


def rows(n: int, k: int, bits: int, group: int, mins: bool, seed: int) -> RowQuant:
    gen = torch.Generator().manual_seed(seed)
    low, high, dtype = (0, 16, torch.uint8) if bits == 4 else (-128, 128, torch.int8)
    codes = torch.randint(low, high, (n, k), generator=gen).to(dtype)
    scale = (torch.rand(n, k // group, generator=gen) * 0.05).half().float()
    m = (torch.randn(n, k // group, generator=gen) * 0.05).half().float() if mins else None
    return RowQuant(codes, scale, m, bits, group)


def test_stacked_formats_keep_every_value() -> None:
    parts = [rows(32, 64, 4, 32, True, 0), rows(16, 64, 8, 16, False, 1)]
    both = concat_rows(parts)
    assert (both.bits, both.group, both.mins is not None) == (8, 16, True)
    expected = torch.cat([p.dequantize() for p in parts])
    assert torch.equal(both.dequantize(), expected)
    assert torch.equal(QuantWeight(both).dequantize(), expected)


def test_embedding_rows() -> None:
    for bits in (4, 8):
        weight = QuantWeight(rows(48, 64, bits, 32, True, bits))
        ids = torch.tensor([0, 47, 8, 7, 16, 8])
        assert torch.equal(weight.rows(ids), weight.dequantize()[ids])


def test_rows_beyond_whole_panels_take_the_torch_path() -> None:
    q = rows(40, 64, 4, 32, True, 3)  # 40 rows: the last panel half padding
    weight = QuantWeight(q)
    assert weight.codes.shape == (3, 64, 8)
    x = torch.randn(5, 64)
    assert torch.allclose(weight.linear(x), x @ q.dequantize().T, rtol=1e-5, atol=1e-6)
    h = torch.ones(5, 40)
    assert torch.allclose(weight.linear(x, out=h), 1 + x @ q.dequantize().T, atol=1e-5)
