"""The KV cache's rows: int8 / fp8 codes with a scale and a mid per half row, the keys'
Hadamard rotation, and the torch write at slots that the kernels match."""

from __future__ import annotations

import pytest
import torch

from engine.kv_format.dtypes import check_kv_cache_dtype
from engine.kv_format.rows import (
    channel_groups,
    dequantize_rows,
    hadamard_block,
    hadamard_matrix,
    quantize_rows,
    rotate_heads_,
    split_rows,
    write_kv,
)


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


def test_write_lands_at_slots() -> None:
    kv = torch.zeros(6, 2, 2, 4, 2, 8)  # [blocks, layers, K/V, block_size, kv_heads, head_dim]
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    slots = torch.tensor([5 * 4 + 3, 0 * 4 + 1, 2 * 4 + 0])  # (block, offset): (5,3) (0,1) (2,0)
    write_kv(kv, 1, k, v, slots)
    for i, (block, offset) in enumerate([(5, 3), (0, 1), (2, 0)]):
        assert torch.equal(kv[block, 1, 0, offset], k[i])
        assert torch.equal(kv[block, 1, 1, offset], v[i])
    assert kv[:, 0].abs().sum() == 0  # the other layer is untouched
    assert int((kv != 0).sum()) == 2 * k.numel()


def test_an_unknown_kv_cache_dtype_is_refused_by_name() -> None:
    assert check_kv_cache_dtype("int8") == "int8"
    with pytest.raises(
        ValueError, match=r"KVLayout\.kv_dtype must be one of auto, int8, fp8_e4m3, got 'fp16'"
    ):
        check_kv_cache_dtype("fp16", "KVLayout.kv_dtype")


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
