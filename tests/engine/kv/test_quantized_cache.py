"""A quantized KV cache (rows: tests/engine/kv_format/test_kv_rows.py): the smaller blocks it
sizes to, the layout that names it, and converting blocks between KV dtypes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import engine.kv.cache as cache_module
from engine.config import EngineConfig
from engine.kv.cache import KVLayout, allocate_kv_cache, copy_converted
from engine.kv.sizing import plan_kv_cache
from engine.kv_format.rows import dequantize_rows, rotate_heads_, write_kv

FP32 = KVLayout(  # the default model's KV shape
    model="smollm2", dtype="float32", block_size=16, num_layers=30, num_kv_heads=3, head_dim=64
)


def _no_gpu() -> None:
    raise AssertionError("sized on the CPU: no device measurement")


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
