"""Both paths of the weight-only GEMM (the fused kernel, with and without split inputs, and
dequantize-then-matmul) equal a matmul with the dequantized weight, for int4 and fp8 weights
and every way a tile meets the groups and scale tiles."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, tolerance

pytest.importorskip("triton")

from engine.model.quant.fp8_checkpoint import Fp8Weight
from engine.model.quant.int4_checkpoint import Int4Weight
from engine.triton_kernels.w4a16 import pack_int4
from engine.triton_kernels.weight_only import (
    DEQUANT_ROWS,
    FP8,
    INT4,
    FusedConfig,
    weight_only_linear,
)

# (fused tiles, dequantize first): the default plan, tiles inside one group / scale column,
# tiles across groups, split inputs (a ragged last split), and the dequantizing path
PATHS = {
    "planned": (None, False),
    "one_group_tiles": (FusedConfig(16, 32, 1), False),
    "tiles_across_groups": (FusedConfig(32, 64, 1), False),
    "split_inputs": (FusedConfig(16, 16, 3), False),
    "dequantized": (None, True),
}


def _int4(out: int, inp: int, group: int) -> Int4Weight:
    gen = torch.Generator().manual_seed(out + inp)
    return Int4Weight(
        codes=torch.randint(0, 16, (out, inp), generator=gen, dtype=torch.uint8),
        scales=torch.rand(out, inp // group, generator=gen) * 0.05 + 0.01,
        zeros=torch.randint(0, 16, (out, inp // group), generator=gen).float(),
        group_size=group,
        perm=None,
    )


def _fp8(out: int, inp: int, block: tuple[int, int]) -> Fp8Weight:
    gen = torch.Generator().manual_seed(out * inp)
    codes = (torch.randn(out, inp, generator=gen) * 30).to(torch.float8_e4m3fn)
    scales = torch.rand(-(-out // block[0]), -(-inp // block[1]), generator=gen) * 0.01 + 0.001
    return Fp8Weight(codes, scales, block)


def _x(rows: int, inp: int) -> torch.Tensor:
    return torch.randn(rows, inp, generator=torch.Generator().manual_seed(rows))


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("rows", [1, 6])
def test_int4_paths_equal_the_dequantized_matmul(path: str, rows: int) -> None:
    w = _int4(40, 96, 32)
    fused, dequant = PATHS[path]
    packed = pack_int4(w, torch.float32, DEVICE)
    x = _x(rows, 96)
    got = weight_only_linear(
        x.to(DEVICE), 40, INT4, packed.qweight, packed.scales, packed.zeros, 32,
        fused=fused, dequant=dequant,
    )  # fmt: skip
    torch.testing.assert_close(got.cpu(), x @ w.dequantize().t(), **tolerance(torch.float32))


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("scaling", ["channel", "tile"])
def test_fp8_paths_equal_the_dequantized_matmul(path: str, scaling: str) -> None:
    out, inp = 48, 96
    block = {"channel": (1, inp), "tile": (16, 32)}[scaling]
    w = _fp8(out, inp, block)
    fused, dequant = PATHS[path]
    x = _x(5, inp)
    got = weight_only_linear(
        x.to(DEVICE), out, FP8, w.codes.to(DEVICE), w.scales.to(DEVICE), tile=block,
        fused=fused, dequant=dequant,
    )  # fmt: skip
    torch.testing.assert_close(got.cpu(), x @ w.dequantize().t(), **tolerance(torch.float32))


def test_prefill_chunks_take_the_dequantizing_path_with_the_same_result() -> None:
    w = _int4(24, 64, 32)
    packed = pack_int4(w, torch.float32, DEVICE)
    x = _x(DEQUANT_ROWS, 64).to(DEVICE)
    args = (24, INT4, packed.qweight, packed.scales, packed.zeros, 32)
    planned = weight_only_linear(x, *args)
    torch.testing.assert_close(planned, weight_only_linear(x, *args, dequant=True), rtol=0, atol=0)
    fused = weight_only_linear(x, *args, dequant=False)
    torch.testing.assert_close(planned, fused, **tolerance(torch.float32))


def test_split_inputs_give_the_same_bits_every_call() -> None:
    """Partial sums are added in a fixed order: no run-to-run noise in greedy output."""
    w = _int4(32, 128, 32)
    packed = pack_int4(w, torch.float32, DEVICE)
    x = _x(3, 128).to(DEVICE)
    args = (32, INT4, packed.qweight, packed.scales, packed.zeros, 32)
    first = weight_only_linear(x, *args, fused=FusedConfig(16, 16, 4))
    for _ in range(3):
        assert torch.equal(weight_only_linear(x, *args, fused=FusedConfig(16, 16, 4)), first)


@pytest.mark.parametrize(
    ("out", "fused"),
    [
        (128, FusedConfig(64, 128, 1)),  # half a column tile, one block a step
        (128, FusedConfig(128, 256, 2)),  # two blocks a step, split, the last step ragged
        (40, FusedConfig(64, 128, 1)),  # tiles of 16 columns: the tile shrinks to one
    ],
)
def test_int4_tiles_of_whole_blocks_read_the_words_by_rows(out: int, fused: FusedConfig) -> None:
    """The tiled kernel reads whole blocks of the prepacked words as rows (the decode
    layout), as it does at Llama's shapes."""
    w = _int4(out, 384, 64)
    packed = pack_int4(w, torch.float32, DEVICE)
    x = _x(20, 384)
    args = (out, INT4, packed.qweight, packed.scales, packed.zeros, 64)
    want = x @ w.dequantize().t()
    got = weight_only_linear(x.to(DEVICE), *args, fused=fused, dequant=False)
    torch.testing.assert_close(got.cpu(), want, **tolerance(torch.float32))
    dequantized = weight_only_linear(x.to(DEVICE), *args, dequant=True)
    torch.testing.assert_close(dequantized.cpu(), want, **tolerance(torch.float32))
