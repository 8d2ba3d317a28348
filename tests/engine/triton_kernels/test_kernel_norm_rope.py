"""Fused add + RMSNorm, in-place RoPE and RoPE + KV write (Triton) against the torch
references."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import DEVICE, DTYPES, LAYER, NUM_LAYERS, tolerance

from engine.triton_kernels import apply_rope, rms_norm, rope_write_kv
from engine.triton_kernels.reference import (
    apply_rope_ref,
    rms_norm_ref,
    rope_cos_sin_cache,
    write_kv_ref,
)

pytest.importorskip("triton")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(with_residual: bool, dtype: torch.dtype) -> None:
    hidden = 72  # not a power of two
    x = torch.randn(5, hidden, device=DEVICE).to(dtype)
    weight = torch.randn(hidden, device=DEVICE).to(dtype)
    residual = torch.randn(5, hidden, device=DEVICE).to(dtype) if with_residual else None
    out, new_residual = rms_norm(x, weight, 1e-5, residual)
    expected_out, expected_residual = rms_norm_ref(x, weight, 1e-5, residual)
    torch.testing.assert_close(out, expected_out, **tolerance(dtype))
    torch.testing.assert_close(new_residual, expected_residual, atol=0, rtol=0)
    if residual is not None:
        torch.testing.assert_close(
            new_residual.float(), (x.float() + residual.float()).to(dtype).float()
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 3, 8])
def test_rope_rotates_strided_q_and_k_in_place(group: int, dtype: torch.dtype) -> None:
    tokens, kv_heads, head_dim = 6, 2, 32
    heads = kv_heads * group
    q_width, k_width = heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(tokens, q_width + 2 * k_width, device=DEVICE).to(dtype)
    q = qkv[:, :q_width].view(tokens, heads, head_dim)
    k = qkv[:, q_width : q_width + k_width].view(tokens, kv_heads, head_dim)
    v_before = qkv[:, q_width + k_width :].clone()
    positions = torch.tensor([0, 1, 5, 4, 30, 63], device=DEVICE)
    cache = rope_cos_sin_cache(head_dim, 64, 10000.0, DEVICE)
    expected_q, expected_k = apply_rope_ref(q, k, positions, cache)
    apply_rope(q, k, positions, cache)
    torch.testing.assert_close(q, expected_q, **tolerance(dtype))
    torch.testing.assert_close(k, expected_k, **tolerance(dtype))
    assert torch.equal(qkv[:, q_width + k_width :], v_before)  # V untouched


def test_rope_at_position_zero_is_identity() -> None:
    q = torch.randn(1, 3, 16, device=DEVICE)
    k = torch.randn(1, 1, 16, device=DEVICE)
    q0, k0 = q.clone(), k.clone()
    cache = rope_cos_sin_cache(16, 8, 10000.0, DEVICE)
    apply_rope(q, k, torch.zeros(1, dtype=torch.long, device=DEVICE), cache)
    assert torch.equal(q, q0) and torch.equal(k, k0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", [1, 3])
def test_rope_write_kv_equals_rope_then_write(group: int, dtype: torch.dtype) -> None:
    """Views of one fused QKV output, as the model passes them; the cache changes at the
    given slots of the given layer only."""
    tokens, kv_heads, head_dim, block_size = 5, 2, 16, 4
    heads = kv_heads * group
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, device=DEVICE).to(dtype)
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    kv = torch.randn(6, NUM_LAYERS, 2, block_size, kv_heads, head_dim, device=DEVICE).to(dtype)
    positions = torch.tensor([3, 0, 9, 4, 17], device=DEVICE)
    slots = torch.tensor([13, 2, 22, 7, 0], device=DEVICE)
    cache = rope_cos_sin_cache(head_dim, 32, 10000.0, DEVICE)
    expected_q, expected_k = apply_rope_ref(q, k, positions, cache)
    expected_kv = kv.clone()
    write_kv_ref(expected_k, v, expected_kv, LAYER, slots)
    rope_write_kv(q, k, v, positions, cache, kv, LAYER, slots)
    torch.testing.assert_close(q, expected_q, **tolerance(dtype))
    torch.testing.assert_close(k, expected_k, **tolerance(dtype))
    torch.testing.assert_close(kv, expected_kv, **tolerance(dtype))
    assert torch.equal(kv[:, LAYER + 1], expected_kv[:, LAYER + 1])  # other layers untouched


def test_rope_write_kv_rejects_a_cache_of_other_heads() -> None:
    q, k = torch.randn(2, 4, 16, device=DEVICE), torch.randn(2, 2, 16, device=DEVICE)
    kv = torch.randn(3, NUM_LAYERS, 2, 4, 1, 16, device=DEVICE)
    cache = rope_cos_sin_cache(16, 8, 10000.0, DEVICE)
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="must both be"):
        rope_write_kv(q, k, k.clone(), torch.tensor([0, 1], device=DEVICE), cache, kv, 0, slots)
