"""The int4 decode GEMM over the prepacked layout: the layout round-trips, the kernel equals a
matmul with the dequantized weight at decode row counts (groups, tails, activation order,
split inputs), and ``w4a16_linear`` sends decode rows to it."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, random_int4, tolerance

pytest.importorskip("triton")

from engine.model.quant.int4_checkpoint import Int4Weight
from engine.triton_kernels import w4a16
from engine.triton_kernels.int4_layout import pack_codes, tile_n_for, unpack_codes
from engine.triton_kernels.w4a16 import DECODE_ROWS, pack_int4, w4a16_linear
from engine.triton_kernels.w4a16_decode import DecodeConfig, int4_decode_linear, plan_decode


def _weight(out: int, inp: int, group: int, ordered: bool = False) -> Int4Weight:
    return random_int4(out, inp, group, ordered, seed=out * 1000 + inp + group)


def _x(rows: int, inp: int) -> torch.Tensor:
    return torch.randn(rows, inp, generator=torch.Generator().manual_seed(rows + inp))


def _decode(x: torch.Tensor, w: Int4Weight, dtype: torch.dtype, splits: int = 1) -> torch.Tensor:
    p = pack_int4(w, dtype, DEVICE)
    args = (p.qweight, p.scales, p.zeros, p.out_features, p.group, DecodeConfig(splits))
    return int4_decode_linear(x.to(DEVICE, dtype), *args)


@pytest.mark.parametrize(("out", "inp"), [(48, 256), (40, 96), (130, 200), (7, 8)])
def test_the_prepacked_layout_gives_the_codes_back(out: int, inp: int) -> None:
    codes = _weight(out, inp, 8).codes
    for tile_n in (tile_n_for(out), 128):
        words = pack_codes(codes, tile_n)
        assert words.dtype == torch.int32 and words.shape[2] == tile_n
        assert torch.equal(unpack_codes(words, out, inp), codes)


def test_the_layout_pads_only_to_whole_tiles_and_blocks() -> None:
    # 4-bit codes: an eighth of the int32 words' element count, padding aside
    assert pack_codes(torch.zeros(256, 384, dtype=torch.uint8), 128).shape == (2, 48, 128)
    assert pack_codes(torch.zeros(40, 96, dtype=torch.uint8), tile_n_for(40)).shape == (3, 16, 16)
    with pytest.raises(ValueError, match="int4 tile_n 48"):
        pack_codes(torch.zeros(48, 128, dtype=torch.uint8), 48)


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_decode_equals_the_dequantized_matmul(rows: int, group: int) -> None:
    w = _weight(48, 256, group)
    x = _x(rows, 256)
    want = x @ w.dequantize().t()
    torch.testing.assert_close(_decode(x, w, torch.float32).cpu(), want, **tolerance(torch.float32))


@pytest.mark.parametrize(("out", "inp", "group"), [(40, 96, 32), (130, 320, 64), (24, 144, 16)])
def test_odd_output_and_input_tails(out: int, inp: int, group: int) -> None:
    """Outputs not a whole tile and inputs not a whole block (padded at pack time)."""
    w = _weight(out, inp, group)
    x = _x(3, inp)
    want = x @ w.dequantize().t()
    torch.testing.assert_close(_decode(x, w, torch.float32).cpu(), want, **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != torch.float32])
def test_half_precision_activations(dtype: torch.dtype) -> None:
    """16-bit activations dot the codes' bit patterns (bf16 128 + q, fp16 1024 + q) and
    remove the offset per group (bf16 on a GPU only: the interpreter's bf16 dots are wrong)."""
    w = _weight(64, 256, 128)
    x = _x(5, 256)
    got = _decode(x, w, dtype)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), x @ w.dequantize().t(), **tolerance(dtype))


def test_split_inputs_equal_one_pass_and_repeat_bit_for_bit() -> None:
    w = _weight(32, 512, 64)
    x = _x(3, 512)
    one = _decode(x, w, torch.float32)
    split = _decode(x, w, torch.float32, splits=3)  # 4 blocks: splits of 2, 2
    torch.testing.assert_close(split, one, **tolerance(torch.float32))
    assert all(torch.equal(_decode(x, w, torch.float32, splits=3), split) for _ in range(2))


def test_activation_order_gathers_the_inputs_first() -> None:
    w = _weight(32, 128, 32, ordered=True)
    x = _x(2, 128)
    got = w4a16_linear(x.to(DEVICE), pack_int4(w, torch.float32, DEVICE))
    torch.testing.assert_close(got.cpu(), x @ w.dequantize().t(), **tolerance(torch.float32))


def test_decode_rows_take_the_decode_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    decode, tiled = w4a16.int4_decode_linear, w4a16.weight_only_linear
    monkeypatch.setattr(
        w4a16, "int4_decode_linear", lambda *a: taken.append("decode") or decode(*a)
    )
    monkeypatch.setattr(w4a16, "weight_only_linear", lambda *a: taken.append("tiled") or tiled(*a))
    w = _weight(16, 128, 32)
    packed = pack_int4(w, torch.float32, DEVICE)
    for rows in (1, DECODE_ROWS, DECODE_ROWS + 1):
        got = w4a16_linear(_x(rows, 128).to(DEVICE), packed)
        want = _x(rows, 128) @ w.dequantize().t()
        torch.testing.assert_close(got.cpu(), want, **tolerance(torch.float32))
    assert taken == ["decode", "decode", "tiled"]


def test_a_group_the_decode_kernel_cannot_tile_takes_the_tiled_kernel() -> None:
    w = _weight(16, 96, 48)  # 48 inputs: three nibble planes, not a whole block's
    packed = pack_int4(w, torch.float32, DEVICE)
    got = w4a16_linear(_x(2, 96).to(DEVICE), packed)
    torch.testing.assert_close(
        got.cpu(), _x(2, 96) @ w.dequantize().t(), **tolerance(torch.float32)
    )
    with pytest.raises(ValueError, match="group 48 is not 16, 32, 64"):
        int4_decode_linear(
            _x(2, 96).to(DEVICE), packed.qweight, packed.scales, packed.zeros, 16, 48
        )


def test_the_plan_splits_the_inputs_when_the_tiles_cannot_fill_the_gpu() -> None:
    cpu = torch.device("cpu")  # the interpreter: one "SM", no split
    assert plan_decode(1, 4096, 4096, 128, cpu).splits == 1
    h200 = torch.device("cuda", 0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("engine.triton_kernels.w4a16_decode.sm_count", lambda d: 132)
        assert plan_decode(1, 4096, 4096, 128, h200).splits == 16  # 32 tiles: the most splits
        assert plan_decode(1, 28672, 4096, 128, h200).splits == 3  # 224 tiles: 672 programs
        assert plan_decode(16, 4096, 4096, 128, h200).splits == 8  # the workspace's share
        assert plan_decode(16, 4096, 256, 128, h200).splits == 1  # two blocks: one split
