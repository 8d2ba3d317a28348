"""Quantized KV: codes + scales and mids per (token, head) row, the smaller blocks it sizes to, the
layout that names it, and converting blocks between KV dtypes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import engine.kv.cache as cache_module
from engine.config import EngineConfig
from engine.kv.cache import KVLayout, allocate_kv_cache, copy_converted, write_kv
from engine.kv.quant import (
    channel_groups,
    dequantize_rows,
    hadamard_block,
    hadamard_matrix,
    quantize_rows,
    rotate_heads_,
    split_rows,
)
from engine.kv.sizing import plan_kv_cache

FP32 = KVLayout(  # the default model's KV shape
    model="smollm2", dtype="float32", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64
)


def _no_gpu() -> None:
    raise AssertionError("sized on the CPU: no device measurement")


@pytest.mark.parametrize(("kv_dtype", "tolerance"), [("int8", 0.5 / 127), ("fp8_e4m3", 1 / 16)])
# int8: half a step of the half range / 127; e4m3: 3 mantissa bits, half a step <= 1/16 of the
# value; either with the bf16 rounding of the scale and mid on top
def test_rows_round_trip_within_the_code_step(kv_dtype: str, tolerance: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(50, 3, 64) * torch.logspace(-30, 30, 50)[:, None, None]  # rows of any range
    x[..., 32:] = x[..., 32:] * 40 + 100 * x[..., 32:].abs().amax(-1, keepdim=True)  # offset half
    x[7, 1] = 0.0  # an all-zero row stays zero (no division by a zero scale)
    x[8, 2, 32:] = 5.0  # a constant half is exact in int8 (its mid)
    rows = quantize_rows(x, kv_dtype)
    assert rows.shape == (50, 3, 72) and rows.element_size() == 1
    codes, scales, mids = split_rows(rows)
    assert scales.shape == mids.shape == (50, 3, 2) and scales.dtype == torch.float32
    groups = channel_groups(64)
    assert groups.tolist() == [0] * 32 + [1] * 32
    back = dequantize_rows(rows, torch.float32)
    for g in (0, 1):
        xg, bg = x[..., groups == g], back[..., groups == g]
        hi, lo = xg.amax(-1, keepdim=True), xg.amin(-1, keepdim=True)
        span = (hi - lo) / 2 if kv_dtype == "int8" else xg.abs().amax(-1, keepdim=True)
        err = (bg - xg).abs()
        if kv_dtype == "int8":  # the offset half keeps int8's resolution: codes about the mid
            mid_rounding = 2**-9 * (hi + lo).abs() / 2  # the bf16 mid widens the range
            assert (err <= tolerance * (span + mid_rounding) * (1 + 2**-8)).all()
        else:
            assert (err <= tolerance * xg.abs() + 2**-9 * span).all()
    assert (back[7, 1] == 0).all()
    assert (back[8, 2, 32:] == 5.0).all() or kv_dtype != "int8"
    peak = codes[..., :32].float().abs().amax(-1)  # the codes span their range
    assert (peak == (127 if kv_dtype == "int8" else 448)).sum() > 100
    if kv_dtype == "fp8_e4m3":
        assert (mids == 0).all()  # e4m3 codes are finest about 0


def test_fixed_budget_holds_over_3_5x_the_tokens_of_fp32(tmp_path: Path) -> None:
    config = EngineConfig(model_dir=tmp_path, kv_cache_memory_gb=1.0)
    tokens = {
        kv: plan_kv_cache(config, FP32.with_kv_dtype(kv), _no_gpu).num_tokens
        for kv in ("auto", "int8", "fp8_e4m3")
    }
    assert tokens["int8"] == tokens["fp8_e4m3"]
    assert tokens["int8"] / tokens["auto"] >= 3.5  # 4 * 64 / (64 + 8) = 3.56
    assert FP32.with_kv_dtype("int8").block_bytes == 30 * 2 * 16 * 3 * 72


def test_layout_names_the_kv_dtype() -> None:
    int8, fp8 = FP32.with_kv_dtype("int8"), FP32.with_kv_dtype("fp8_e4m3")
    assert len({FP32.fingerprint(), int8.fingerprint(), fp8.fingerprint()}) == 3
    assert "kv_dtype=int8" in int8.describe() and "kv_dtype=fp8_e4m3" in fp8.describe()
    assert int8.block_shape == (30, 2, 16, 3, 72) and int8.torch_dtype == torch.int8
    assert allocate_kv_cache(fp8, 2, "cpu").dtype == torch.float8_e4m3fn
    with pytest.raises(ValueError, match="kv_dtype"):
        FP32.with_kv_dtype("int4")
    with pytest.raises(ValueError, match="head_dim divisible by 4"):
        dataclasses.replace(int8, head_dim=66)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(model_dir=Path("."), kv_cache_dtype="fp16")


@pytest.mark.parametrize(("src", "dst"), [("auto", "int8"), ("int8", "auto"), ("fp8_e4m3", "int8")])
def test_copy_converted_moves_blocks_between_kv_dtypes(src: str, dst: str) -> None:
    layout = dataclasses.replace(FP32, num_layers=2, block_size=4)
    src_layout, dst_layout = layout.with_kv_dtype(src), layout.with_kv_dtype(dst)
    k, v = torch.randn(8, 3, 64), torch.randn(8, 3, 64)
    slots = torch.tensor([4, 5, 6, 7, 12, 13, 14, 15])  # blocks 1 and 3
    src_kv = allocate_kv_cache(src_layout, 5, "cpu")
    # an int8 cache holds rotated keys (the layer ops rotate them before the write)
    write_kv(src_kv, 1, rotate_heads_(k.clone()) if src == "int8" else k, v, slots)
    dst_kv = allocate_kv_cache(dst_layout, 4, "cpu")
    copy_converted(src_kv, src_layout, dst_kv, dst_layout, [1, 3], [2, 0])
    if dst == "int8":  # the keys arrive rotated
        stored = dequantize_rows(dst_kv[[2, 0], 1, 0], torch.float32).flatten(0, 1)
        rotated = rotate_heads_(k.clone())
        torch.testing.assert_close(stored, rotated, atol=0.08 * rotated.abs().max(), rtol=0)
    fp32 = layout.with_kv_dtype("auto")
    back = allocate_kv_cache(fp32, 4, "cpu")
    copy_converted(dst_kv, dst_layout, back, fp32, [2, 0], [0, 1])
    got_k = back[:2, 1, 0].flatten(0, 1)  # [8, 3, 64]
    torch.testing.assert_close(got_k, k, atol=0.08 * k.abs().max().item(), rtol=0)
    torch.testing.assert_close(back[:2, 1, 1].flatten(0, 1), v, atol=0.08 * v.abs().max(), rtol=0)
    assert (back[2:] == 0).all()  # nothing else written


def test_copy_converted_refuses_layouts_that_differ_beyond_the_dtype() -> None:
    other = dataclasses.replace(FP32, num_kv_heads=4).with_kv_dtype("int8")
    kv = allocate_kv_cache(dataclasses.replace(FP32, num_layers=1), 1, "cpu")
    with pytest.raises(ValueError, match=r"beyond the KV dtype.*kv_heads=3.*kv_heads=4"):
        copy_converted(kv, FP32, kv, other, [0], [0])


def test_fingerprint_names_the_row_format(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache whose rows hold another scale format (e.g. the earlier one fp32 scale per row)
    has another fingerprint: its blocks are converted or refused, never read as these."""
    int8 = FP32.with_kv_dtype("int8")
    before, auto = int8.fingerprint(), FP32.fingerprint()
    monkeypatch.setattr(cache_module, "ROW_FORMAT", "fp32-scale-per-token-head")
    assert int8.fingerprint() != before and FP32.fingerprint() == auto


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


@pytest.mark.parametrize(("head_dim", "block"), [(64, 64), (128, 128), (80, 16), (96, 32)])
def test_key_rotation_is_a_hadamard_that_keeps_scores(head_dim: int, block: int) -> None:
    """H q . H k = q . k, H (H x) = x, and H is Sylvester's in blocks of the largest power of
    two dividing head_dim."""
    assert hadamard_block(head_dim) == block
    gen = torch.Generator().manual_seed(head_dim)
    q, k = torch.randn(5, 4, head_dim, generator=gen), torch.randn(5, 4, head_dim, generator=gen)
    hq, hk = rotate_heads_(q.clone()), rotate_heads_(k.clone())
    torch.testing.assert_close((hq * hk).sum(-1), (q * k).sum(-1), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(rotate_heads_(hk.clone()), k, atol=1e-5, rtol=1e-5)
    h = torch.block_diag(*[_sylvester(block)] * (head_dim // block))
    torch.testing.assert_close(hk.double(), k.double() @ h.t(), atol=1e-5, rtol=1e-5)
    # the matrix the GPU path multiplies by is the same H
    torch.testing.assert_close(hadamard_matrix(head_dim, torch.device("cpu")).double(), h)


def test_rotation_spreads_a_keys_outlier_channel() -> None:
    """What it is for: one large channel becomes head_dim moderate ones, so the row's range
    (and the int8 step) shrinks and the rounding error of every score with it."""
    k = torch.randn(64, 1, 64, generator=torch.Generator().manual_seed(1)) * 0.1
    k[..., 5] += 8.0  # a key offset channel, as RoPE'd keys of real models have
    q = torch.randn(64, 1, 64, generator=torch.Generator().manual_seed(2))

    def score_error(keys: torch.Tensor, queries: torch.Tensor) -> float:
        rounded = dequantize_rows(quantize_rows(keys, "int8"), torch.float32)
        return float((queries @ (rounded - keys).transpose(-1, -2)).pow(2).mean().sqrt())

    plain = score_error(k, q)
    rotated = score_error(rotate_heads_(k.clone()), rotate_heads_(q.clone()))
    assert rotated < plain / 2
