"""The C kernels of engine.cpu_kernels equal the torch ops they replace, and the build is
cached, atomic and optional."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.kv_format.rows import dequantize_rows, rotate_heads_, write_kv
from engine.model.layer_ops import apply_rope
from engine.model.torch_attention import decode_attention

pytestmark = pytest.mark.skipif(
    not cpu_kernels.available(), reason="the CPU kernels need a C compiler (cc or $CC)"
)


def _decode_case(
    seqs: int, heads: int, kv_heads: int, head_dim: int, block_size: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q as a strided view into a qkv row, a cache with scattered blocks, tables wider than
    needed, and context lengths that end mid-block, on a block boundary and at 1."""
    gen = torch.Generator().manual_seed(seed)
    layers, width = 3, 12
    kv = torch.randn(seqs * width + 4, layers, 2, block_size, kv_heads, head_dim, generator=gen)
    qkv = torch.randn(seqs, heads + 2 * kv_heads, head_dim, generator=gen)
    perm = torch.randperm(kv.shape[0], generator=gen)[: seqs * width]
    tables = perm.view(seqs, width).int()
    lens = torch.randint(1, width * block_size + 1, (seqs,), generator=gen, dtype=torch.int32)
    lens[0], lens[-1] = 1, block_size * 2
    return qkv[:, :heads], kv, tables, lens


def _torch_decode(q, kv, layer, tables, lens):  # type: ignore[no-untyped-def]
    block_size = kv.shape[3]
    width = int(-(-lens.max() // block_size))
    mask = (torch.arange(width * block_size)[None, :] < lens[:, None])[:, None, None, :]
    return decode_attention(q, kv, layer, tables[:, :width], mask)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 16), (4, 4, 16, 16), (8, 2, 32, 8), (12, 3, 96, 32), (8, 1, 128, 16),
     (4, 2, 256, 4)],
)  # fmt: skip
def test_paged_decode_attention_equals_gather_and_sdpa(
    heads: int, kv_heads: int, head_dim: int, block_size: int
) -> None:
    q, kv, tables, lens = _decode_case(7, heads, kv_heads, head_dim, block_size)
    assert cpu_kernels.supports(q, kv)
    for layer in (0, 2):
        got = cpu_kernels.paged_decode_attention(q, kv, layer, tables, lens, head_dim**-0.5)
        want = _torch_decode(q, kv, layer, tables, lens)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_paged_decode_attention_reads_only_the_context() -> None:
    """Slots past a sequence's length, and blocks past its table, never change the output
    (each block belongs to one sequence: the tables are a permutation)."""
    q, kv, tables, lens = _decode_case(5, 8, 2, 64, 16, seed=1)
    before = cpu_kernels.paged_decode_attention(q, kv, 1, tables, lens, 0.125)
    poisoned = kv.clone()
    for s in range(5):
        n = int(lens[s])
        last, offset = tables[s, (n - 1) // 16], n % 16
        if offset:
            poisoned[last, 1, :, offset:] = float("nan")
        poisoned[tables[s, -(-n // 16) :].long(), 1] = float("nan")
    after = cpu_kernels.paged_decode_attention(q, poisoned, 1, tables, lens, 0.125)
    assert not after.isnan().any()
    torch.testing.assert_close(after, before)


def test_tables_too_short_for_their_contexts_are_refused() -> None:
    q, kv, tables, lens = _decode_case(3, 8, 2, 64, 16)
    lens[1] = tables.shape[1] * 16 + 1
    with pytest.raises(ValueError, match="more than the 12 blocks"):
        cpu_kernels.paged_decode_attention(q, kv, 0, tables, lens, 0.125)
    with pytest.raises(ValueError, match="3 queries, 2 block tables"):
        cpu_kernels.paged_decode_attention(q, kv, 0, tables[:2], lens, 0.125)


def test_unsupported_shapes_are_declined() -> None:
    q, kv, _, _ = _decode_case(2, 8, 2, 64, 16)
    assert not cpu_kernels.supports(q.half(), kv.half())  # fp32 only
    assert not cpu_kernels.supports(q[..., :40], kv[..., :40].contiguous())  # head_dim 40
    assert not cpu_kernels.supports(q, kv[:, :, :, :, :, :].transpose(0, 1))  # not contiguous


def test_rope_write_kv_equals_rope_then_write() -> None:
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, d, block_size, tokens = 6, 2, 32, 8, 40
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen)
    cos = torch.randn(100, d // 2, generator=gen)
    sin = torch.randn(100, d // 2, generator=gen)
    positions = torch.randint(0, 100, (tokens,), generator=gen)
    slots = torch.randperm(12 * block_size, generator=gen)[:tokens]
    kv_want = torch.zeros(12, 2, 2, block_size, kv_heads, d)
    kv_got = kv_want.clone()

    view = qkv.view(tokens, -1, d)
    rotated = apply_rope(view[:, : heads + kv_heads], cos[positions, None], sin[positions, None])
    write_kv(kv_want, 1, rotated[:, heads:], view[:, heads + kv_heads :], slots)

    got = qkv.clone()
    cpu_kernels.rope_write_kv(got, heads, kv_heads, positions, cos, sin, kv_got, 1, slots)
    got = got.view(tokens, -1, d)
    torch.testing.assert_close(got[:, : heads + kv_heads], rotated)
    torch.testing.assert_close(got[:, heads + kv_heads :], view[:, heads + kv_heads :])
    torch.testing.assert_close(kv_got, kv_want)  # layer 0 and unused slots stay zero


HEADS, KV_HEADS, BLOCK, TOKENS = 6, 2, 8, 40


def _int8_rope_case(seed: int, d: int, scale: float = 1.0) -> tuple[torch.Tensor, ...]:
    """qkv [TOKENS, (HEADS + 2 KV_HEADS) * d], cos and sin [100, d / 2], positions, slots,
    and an empty int8 cache of 12 blocks and 2 layers."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(TOKENS, (HEADS + 2 * KV_HEADS) * d, generator=gen) * scale
    cos = torch.randn(100, d // 2, generator=gen)
    sin = torch.randn(100, d // 2, generator=gen)
    positions = torch.randint(0, 100, (TOKENS,), generator=gen)
    slots = torch.randperm(12 * BLOCK, generator=gen)[:TOKENS]
    kv = torch.zeros(12, 2, 2, BLOCK, KV_HEADS, d + 8, dtype=torch.int8)
    return qkv, cos, sin, positions, slots, kv


def test_rope_write_kv_into_int8_cache_writes_torch_codes_and_scales() -> None:
    """An int8 cache (kv_cache_dtype int8) gets the bytes torch's write_kv writes for the
    kernel's own rotated K and V: the same codes and scales, nothing else touched."""
    heads, kv_heads, d, tokens = HEADS, KV_HEADS, 64, TOKENS
    qkv, cos, sin, positions, slots, kv_got = _int8_rope_case(3, d, scale=3.0)
    kv_want = kv_got.clone()
    got = qkv.clone()
    cpu_kernels.rope_write_kv(got, heads, kv_heads, positions, cos, sin, kv_got, 1, slots)
    rows = got.view(tokens, -1, d)
    write_kv(kv_want, 1, rows[:, heads : heads + kv_heads], rows[:, heads + kv_heads :], slots)
    assert torch.equal(kv_got, kv_want)
    assert kv_got[:, 1, ..., :d].abs().amax() == 127 and not kv_got[:, 0].any()


@pytest.mark.parametrize("head_dim", [64, 80])
def test_rope_write_kv_into_int8_cache_rotates_q_and_k_as_torch_does(head_dim: int) -> None:
    """With an int8 cache the kernel stores keys Hadamard-rotated and rotates q alike
    (engine.kv_format.rows.rotate_heads_, blocks of 64 or 16 here): the torch path's values, so
    q . k and the stored rows agree with it."""
    heads, kv_heads, d, block_size, tokens = HEADS, KV_HEADS, head_dim, BLOCK, TOKENS
    qkv, cos, sin, positions, slots, kv_got = _int8_rope_case(4, d)
    got = qkv.clone()
    cpu_kernels.rope_write_kv(got, heads, kv_heads, positions, cos, sin, kv_got, 1, slots)
    got = got.view(tokens, -1, d)

    view = qkv.view(tokens, -1, d)
    want = rotate_heads_(
        apply_rope(view[:, : heads + kv_heads], cos[positions, None], sin[positions, None])
    )
    torch.testing.assert_close(got[:, : heads + kv_heads], want, atol=1e-5, rtol=1e-5)
    stored = dequantize_rows(kv_got[:, 1, 0], torch.float32)  # [blocks, block, kv_heads, d]
    b, o = slots // block_size, slots % block_size
    keys = want[:, heads:]
    torch.testing.assert_close(stored[b, o], keys, atol=keys.abs().max() / 100, rtol=0)


def test_rope_write_kv_refuses_indices_outside_the_cache() -> None:
    kv = torch.zeros(4, 1, 2, 8, 1, 16)
    qkv = torch.zeros(2, 3 * 16)
    cos = sin = torch.zeros(10, 8)
    ok = torch.tensor([0, 31])
    with pytest.raises(ValueError, match="slot outside the cache's 32 slots"):
        cpu_kernels.rope_write_kv(qkv, 1, 1, ok, cos, sin, kv, 0, torch.tensor([0, 32]))
    with pytest.raises(ValueError, match="beyond the 10 rotary rows"):
        cpu_kernels.rope_write_kv(qkv, 1, 1, torch.tensor([0, 10]), cos, sin, kv, 0, ok)
    cpu_kernels.rope_write_kv(qkv, 1, 1, torch.tensor([0, 9]), cos, sin, kv, 0, ok)
    assert kv.abs().sum() == 0  # zeros written where asked, nothing else touched


def test_silu_mul_and_rms_norm_equal_torch() -> None:
    gen = torch.Generator().manual_seed(3)
    for tokens in (1, 33, 700):  # one row, the serial path, the threaded path
        gate_up = torch.randn(tokens, 2 * 100, generator=gen) * 30  # 100: a scalar tail
        gate, up = gate_up.chunk(2, dim=-1)
        torch.testing.assert_close(
            cpu_kernels.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6
        )
        x = torch.randn(tokens, 70, generator=gen) * 5
        w = torch.randn(70, generator=gen)
        torch.testing.assert_close(
            cpu_kernels.rms_norm(x, w, 1e-6), F.rms_norm(x, (70,), w, 1e-6), rtol=1e-5, atol=1e-6
        )


def test_build_is_cached_per_source_and_machine(tmp_path: Path) -> None:
    first = cpu_kernels.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    again = cpu_kernels.build(tmp_path)
    assert again == first and again.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind


def test_missing_compiler_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(cpu_kernels.KernelBuildError, match="no-such-cc"):
        cpu_kernels.build(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_disabled_by_env_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_kernels.ENABLE_ENV, "0")
    cpu_kernels._library.cache_clear()
    try:
        assert not cpu_kernels.available()
        with pytest.raises(cpu_kernels.KernelBuildError):
            cpu_kernels.silu_mul(torch.zeros(1, 16))
    finally:
        monkeypatch.delenv(cpu_kernels.ENABLE_ENV)
        cpu_kernels._library.cache_clear()
    assert cpu_kernels.available()
    assert os.environ.get(cpu_kernels.ENABLE_ENV) is None
