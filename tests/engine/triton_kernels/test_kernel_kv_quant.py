"""Quantized KV rows (int8 / fp8 e4m3, engine.kv_format.rows) in the Triton kernels: the writers
store the bytes ``quantize_rows`` stores, the attentions equal the oracle over the
dequantized cache."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, LAYER, NUM_LAYERS, make_cache, quantize_cache

from engine.kv_format.rows import (
    CODE_DTYPES,
    CODE_MAX,
    GROUPS,
    dequantize_rows,
    quantize_rows,
    row_width,
)
from engine.triton_kernels import (
    paged_decode_attention,
    paged_prefill_attention,
    rope_write_kv,
    write_kv,
)
from engine.triton_kernels.reference import (
    apply_rope_ref,
    decode_attention_ref,
    prefill_attention_ref,
    rope_cos_sin_cache,
)

pytest.importorskip("triton")

KV_DTYPES = ["int8", "fp8_e4m3"]
KV_HEADS = 2
HEAD_DIM = 16
# fp32 queries: tight; fp16: the dequantized K/V are rounded to fp16 before the dots
Q_TOLERANCE = {
    torch.float32: {"atol": 2e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}


def test_the_kernels_bake_in_the_row_format() -> None:
    """kv_quant hard-codes these (two groups, int8 127, e4m3 448)."""
    assert GROUPS == 2 and CODE_MAX == {"int8": 127.0, "fp8_e4m3": 448.0}


def _edge_rows(head_dim: int) -> torch.Tensor:
    """[4, 1, d] rows the rounding rules decide: zero and constant groups, exact ties for
    int8 (scale 1) and for e4m3 (scale 1: ties between codes, subnormal ties), tiny values."""
    half = head_dim // 2
    rows = torch.zeros(4, 1, head_dim)
    rows[0, 0, half:] = 0.75  # a zero group, then a constant one
    ties8 = torch.tensor([127.0, -127.0, 2.5, -3.5, 0.5, -0.5, 1.5, 126.5])
    rows[1, 0, :half] = ties8.repeat(half // 8 + 1)[:half]
    ties_e4m3 = torch.tensor([448.0, 17.0, -232.0, 2.5 / 512, 7.5 / 512, -0.5 / 512, 3.25, -0.0])
    rows[1, 0, half:] = ties_e4m3.repeat(half // 8 + 1)[:half]
    rows[2, 0] = torch.linspace(-1e-30, 3e-30, head_dim)
    rows[3, 0] = torch.linspace(-5.0, 7.0, head_dim) + 100.0  # a row far from 0
    return rows


def _assert_same_rows(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Byte equality, but for the sign of a zero scale or mid: a group of zeros gets +0 from
    the kernel and +0 or -0 from ``quantize_rows`` (torch's amax / maximum pick between 0
    and -0 by vector lane, so two calls on the same data can differ). Both dequantize alike.
    """
    d = got.shape[-1] - 8

    def canonical(rows: torch.Tensor) -> torch.Tensor:
        params = rows[..., d:].contiguous().view(torch.int16)
        params = torch.where(params == -32768, 0, params)  # bf16 -0 -> +0
        return torch.cat([rows[..., :d].view(torch.uint8), params.view(torch.uint8)], -1)

    assert torch.equal(canonical(got), canonical(expected))
    same = dequantize_rows(got, torch.float32) == dequantize_rows(expected, torch.float32)
    assert same.all()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 24])
def test_write_kv_stores_the_bytes_of_quantize_rows(
    head_dim: int, dtype: torch.dtype, kv_dtype: str
) -> None:
    tokens, block_size, blocks = 11, 4, 7
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(tokens, KV_HEADS, head_dim, generator=gen) * 3
    k[:4, :1] = _edge_rows(head_dim)
    v = torch.randn(tokens, KV_HEADS, head_dim, generator=gen)
    v[-4:, 1:] = _edge_rows(head_dim)
    k, v = k.to(dtype).to(DEVICE), v.to(dtype).to(DEVICE)
    shape = (blocks, NUM_LAYERS, 2, block_size, KV_HEADS, row_width(head_dim, kv_dtype))
    kv = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
    kv = kv.view(CODE_DTYPES[kv_dtype]).to(DEVICE)
    untouched = kv.view(torch.uint8).clone()
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens].to(DEVICE)
    write_kv(k, v, kv, LAYER, slots)
    b, o = slots // block_size, slots % block_size
    for i, x in enumerate((k, v)):
        _assert_same_rows(kv[b, LAYER, i, o], quantize_rows(x, kv_dtype))
    got = kv.view(torch.uint8)
    got[b, LAYER, :, o] = untouched[b, LAYER, :, o]
    assert torch.equal(got, untouched)  # nothing else written


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_rope_write_kv_stores_the_rotated_rows_quantized(kv_dtype: str) -> None:
    tokens, group, block_size = 5, 3, 4
    heads = KV_HEADS * group
    qkv = torch.randn(tokens, heads + 2 * KV_HEADS, HEAD_DIM, device=DEVICE)
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + KV_HEADS], qkv[:, heads + KV_HEADS :]
    shape = (6, NUM_LAYERS, 2, block_size, KV_HEADS, row_width(HEAD_DIM, kv_dtype))
    kv = torch.zeros(shape, dtype=CODE_DTYPES[kv_dtype], device=DEVICE)
    positions = torch.tensor([3, 0, 9, 4, 17], device=DEVICE)
    slots = torch.tensor([13, 2, 22, 7, 0], device=DEVICE)
    table = rope_cos_sin_cache(HEAD_DIM, 32, 10000.0, DEVICE)
    expected_q, expected_k = apply_rope_ref(q, k, positions, table)
    expected_v = v.clone()
    rope_write_kv(q, k, v, positions, table, kv, LAYER, slots)
    torch.testing.assert_close(q, expected_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k, expected_k, atol=1e-6, rtol=1e-6)
    got = kv[slots // block_size, LAYER, :, slots % block_size]
    _assert_same_rows(got[:, 0], quantize_rows(k, kv_dtype))  # k as rotated
    _assert_same_rows(got[:, 1], quantize_rows(expected_v, kv_dtype))


def _dequantized(kv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache the oracle reads: rows dequantized in fp32, then cast to q's dtype (as the
    torch backend does)."""
    return dequantize_rows(kv, torch.float32).to(dtype)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_decode_over_a_quantized_cache_matches_the_dequantized_oracle(
    num_splits: int | None, dtype: torch.dtype, kv_dtype: str
) -> None:
    """Paged, scattered tables; sequences of several lengths; GQA (3 query heads per KV
    head); unused rows have NaN scales, so a stray read shows."""
    block_size, group = 4, 3
    lengths = [1, 3, 5, 14]
    cache = quantize_cache(
        make_cache(lengths, block_size, KV_HEADS, HEAD_DIM, torch.float32), kv_dtype
    )
    q = torch.randn(len(lengths), KV_HEADS * group, HEAD_DIM, device=DEVICE).to(dtype)
    tables, ctx, scale = cache.block_tables, cache.ctx_lens, HEAD_DIM**-0.5
    out = paged_decode_attention(q, cache.kv, LAYER, tables, ctx, scale, num_splits)
    expected = decode_attention_ref(q, _dequantized(cache.kv, dtype), LAYER, tables, ctx, scale)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out, expected, **Q_TOLERANCE[dtype])


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_decode_sliding_window_over_a_quantized_cache(kv_dtype: str) -> None:
    cache = quantize_cache(make_cache([6, 13], 4, KV_HEADS, HEAD_DIM, torch.float32), kv_dtype)
    q = torch.randn(2, KV_HEADS * 2, HEAD_DIM, device=DEVICE)
    args = (cache.block_tables, cache.ctx_lens, 0.25)
    windowed = paged_decode_attention(q, cache.kv, LAYER, *args, window=5)
    expected = decode_attention_ref(q, _dequantized(cache.kv, q.dtype), LAYER, *args, window=5)
    torch.testing.assert_close(windowed, expected, **Q_TOLERANCE[q.dtype])


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_over_a_quantized_cache_matches_the_dequantized_oracle(
    dtype: torch.dtype, kv_dtype: str
) -> None:
    """A fresh prompt, a one-token chunk and chunks after cached prefixes, one run longer
    than a 16-query tile; GQA; paged, scattered tables."""
    block_size, group = 4, 3
    q_lens, ctx_lens = [5, 1, 3, 7], [5, 9, 11, 20]
    cache = make_cache(ctx_lens, block_size, KV_HEADS, HEAD_DIM, torch.float32)
    cache = quantize_cache(cache, kv_dtype)
    q = torch.randn(sum(q_lens), KV_HEADS * group, HEAD_DIM, device=DEVICE).to(dtype)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    args = (LAYER, cu_q.to(DEVICE), cache.ctx_lens, cache.block_tables, HEAD_DIM**-0.5)
    out = paged_prefill_attention(q, cache.kv, *args)
    expected = prefill_attention_ref(q, _dequantized(cache.kv, dtype), *args)
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out, expected, **Q_TOLERANCE[dtype])


def test_attention_refuses_a_non_float_query_over_a_quantized_cache() -> None:
    cache = quantize_cache(make_cache([3], 4, KV_HEADS, HEAD_DIM, torch.float32), "int8")
    q = torch.zeros(1, KV_HEADS, HEAD_DIM, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="quantized cache"):
        paged_decode_attention(q, cache.kv, LAYER, cache.block_tables, cache.ctx_lens, 0.25)
