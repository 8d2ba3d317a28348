"""Paged attention over scattered blocks equals dense causal attention."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_llama import TRITON_DEVICE

from engine import cpu_kernels
from engine.kv_format.rows import CODE_DTYPES, dequantize_rows, quantize_rows, row_width, write_kv
from engine.model.attention import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    TritonAttention,
)
from engine.model.backends import select_attention
from engine.model.torch_attention import TorchAttention

BLOCK = 4
KV_HEADS = 2
HEAD_DIM = 16
NUM_BLOCKS = 48


def dense_causal(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec | None = None
) -> torch.Tensor:
    """q: [len, heads, d]; k, v: [len, kv_heads, d] -> [len, heads, d], in float64; with
    ``spec``'s scale, window (query p sees keys in (p - window, p]), soft-cap and sinks (a
    logit per head in the softmax, its weight dropped)."""
    spec = spec or AttentionSpec(q.shape[-1] ** -0.5)
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * spec.scale
    if spec.softcap:
        scores = spec.softcap * torch.tanh(scores / spec.softcap)
    n = q.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    if spec.window:
        causal &= torch.ones(n, n, dtype=torch.bool).triu(1 - spec.window)
    scores = scores.masked_fill(~causal, float("-inf"))
    if spec.sinks is None:
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    sink = spec.sinks.double().view(-1, 1, 1).expand(-1, n, 1)
    probs = torch.cat((scores, sink), dim=-1).softmax(-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", probs, v)


def run_step(
    seqs: list[tuple[int, int]],
    group: int,
    seed: int = 0,
    backend: AttentionBackend | None = None,
    device: torch.device | str = "cpu",
    spec: AttentionSpec | None = None,
    kv_dtype: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Sequences given as (total length, start): positions before ``start`` are already in the
    cache, the rest are this step's queries. The step runs on `device`; returns (paged output,
    dense expectation) on the CPU, and the metadata. With a quantized ``kv_dtype`` the
    expectation attends over the explicitly dequantised K/V wherever the cache is read (all
    but a prompt chunk without a cached prefix, which attends over its fresh K/V)."""
    gen = torch.Generator().manual_seed(seed)
    heads = KV_HEADS * group
    row = row_width(HEAD_DIM, kv_dtype)
    dtype = torch.float32 if kv_dtype == "auto" else CODE_DTYPES[kv_dtype]
    kv = torch.zeros(NUM_BLOCKS, 3, 2, BLOCK, KV_HEADS, row, dtype=dtype, device=device)
    free = torch.randperm(NUM_BLOCKS, generator=gen).tolist()  # scattered, out of order
    tables, qs, ks, vs, expected = [], [], [], [], []
    for length, start in seqs:
        table = [free.pop() for _ in range(-(-length // BLOCK) + 1)]  # one spare block
        q = torch.randn(length, heads, HEAD_DIM, generator=gen)
        k = torch.randn(length, KV_HEADS, HEAD_DIM, generator=gen)
        v = torch.randn(length, KV_HEADS, HEAD_DIM, generator=gen)
        prefix = AttentionMetadata.build([start], [0], [table], BLOCK, device) if start else None
        if prefix is not None:  # an earlier step wrote the cached prefix
            write_kv(kv, 1, k[:start].to(device), v[:start].to(device), prefix.slot_mapping)
        tables.append(table)
        qs.append(q[start:])
        ks.append(k[start:])
        vs.append(v[start:])
        if kv_dtype != "auto" and (start or length == 1):
            k, v = (dequantize_rows(quantize_rows(x, kv_dtype), torch.float32) for x in (k, v))
        expected.append(dense_causal(q, k, v, spec)[start:])
    meta = AttentionMetadata.build(
        [length - start for length, start in seqs], [s for _, s in seqs], tables, BLOCK, device
    )
    k_step, v_step = torch.cat(ks).to(device), torch.cat(vs).to(device)
    write_kv(kv, 1, k_step, v_step, meta.slot_mapping)
    q_step = torch.cat(qs).to(device)
    out = (backend or TorchAttention())(q_step, k_step, v_step, kv, 1, meta, spec)
    return out.cpu(), torch.cat(expected).float(), meta


MIXED = [
    (9, 8),  # decodes: one new token over a context that is not a multiple of the block
    (4, 3),
    (1, 0),  # a one-token prompt
    (11, 0),  # a prompt in one chunk
    (14, 6),  # a chunk over a cached prefix, starting mid-block
    (6, 5),  # a single-token chunk after the prefills: handled as a prefill, still exact
    (21, 16),  # a chunk over a prefix that ends on a block boundary
]


@pytest.mark.parametrize("group", [1, 3, 8])
def test_mixed_step_equals_dense_causal(group: int) -> None:
    out, expected, meta = run_step(MIXED, group)
    assert meta.num_decodes == 3
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 3, 8])
def test_decode_only_step(group: int) -> None:
    seqs = [(n, n - 1) for n in (1, 5, 8, 13, 30)]
    out, expected, meta = run_step(seqs, group, seed=1)
    assert meta.num_decodes == len(seqs)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_metadata_positions_and_slots() -> None:
    meta = AttentionMetadata.build([1, 3], [5, 2], [(7, 3, 9), (4, 0)], BLOCK)
    assert meta.positions.tolist() == [5, 2, 3, 4]
    # seq 0 pos 5 -> block 3 offset 1; seq 1 pos 2, 3 -> block 4; pos 4 -> block 0 offset 0
    assert meta.slot_mapping.tolist() == [3 * 4 + 1, 4 * 4 + 2, 4 * 4 + 3, 0]
    assert meta.query_start_loc.tolist() == [0, 1, 4]
    assert meta.context_lens.tolist() == [6, 5]
    assert meta.block_tables.tolist() == [[7, 3], [4, 0]]  # cut to what the context needs
    assert meta.block_tables.dtype == torch.int32


def test_short_block_table_is_refused() -> None:
    with pytest.raises(ValueError, match="sequence 1"):
        AttentionMetadata.build([1, 4], [0, 2], [(1,), (2,)], BLOCK)


def needs_triton() -> None:
    pytest.importorskip("triton")
    from engine.triton_kernels import triton_available

    if not triton_available():
        pytest.skip("triton needs CUDA or TRITON_INTERPRET=1")


@pytest.mark.parametrize("group", [1, 3])
def test_triton_backend_equals_dense_causal(group: int) -> None:
    """On the GPU when there is one, else interpreted on the CPU."""
    needs_triton()
    out, expected, _ = run_step(MIXED, group, backend=TritonAttention(), device=TRITON_DEVICE)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    seqs = [(n, n - 1) for n in (1, 5, 13)]
    out, expected, _ = run_step(
        seqs, group, seed=1, backend=TritonAttention(), device=TRITON_DEVICE
    )
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_backend_selection() -> None:
    cpu = torch.device("cpu")
    assert isinstance(select_attention("torch", cpu), TorchAttention)
    assert isinstance(select_attention("auto", cpu), TorchAttention)
    with pytest.raises(ValueError):
        select_attention("bogus", cpu)


SPECS = {
    "window": AttentionSpec(scale=0.3, window=5),
    "softcap": AttentionSpec(scale=0.5, softcap=2.0),
    "both": AttentionSpec(scale=0.25, window=7, softcap=1.5),
    # gpt-oss's sinks (4 heads: 2 KV heads of 2), alone and in a window
    "sinks": AttentionSpec(scale=0.3, sinks=torch.tensor([0.5, -1.0, 2.0, 0.0])),
    "window_sinks": AttentionSpec(scale=0.3, window=5, sinks=torch.tensor([1.5, -2.0, 0.3, 3.0])),
}
# decodes and chunks whose contexts run past the windows, windows not multiples of the block
LONG = [(23, 22), (9, 8), (30, 29), (17, 0), (26, 11), (13, 12)]


@pytest.mark.parametrize("spec_name", list(SPECS))
@pytest.mark.parametrize("path", ["torch", "c", "triton"])
def test_windows_softcap_and_scale_on_every_path(path: str, spec_name: str) -> None:
    """Each path against explicit scores over the whole context with the window's mask, the
    soft-cap and the sinks: decodes and chunks over cached prefixes, grouped heads."""
    device: torch.device | str = "cpu"
    backend: AttentionBackend
    spec = SPECS[spec_name]
    if path == "triton":
        needs_triton()
        backend, device = TritonAttention(), TRITON_DEVICE
        if spec.sinks is not None:
            spec = replace(spec, sinks=spec.sinks.to(device))
    elif path == "c":
        if not cpu_kernels.available():
            pytest.skip("no C compiler here")
        backend = TorchAttention(cpu_kernel=True)
    else:
        backend = TorchAttention(cpu_kernel=False)
    out, expected, meta = run_step(LONG, 2, backend=backend, device=device, spec=spec)
    assert meta.num_decodes == 3
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
    plain, _, _ = run_step(LONG, 2, backend=backend, device=device)
    assert not torch.allclose(plain, expected, atol=1e-3)  # the spec changes the answer


@pytest.mark.parametrize("path", ["c", "triton"])
def test_window_never_reads_blocks_behind_it(path: str) -> None:
    """Blocks wholly behind a decode's window may be back in the pool: the C and Triton
    decode kernels never read them (NaN there leaves the answer untouched)."""
    if path == "triton":
        needs_triton()
    elif not cpu_kernels.available():
        pytest.skip("no C compiler here")
    device = TRITON_DEVICE if path == "triton" else torch.device("cpu")
    gen = torch.Generator().manual_seed(5)
    ctx, window, heads = 22, 6, 4  # keys 16..21 seen: blocks 0-3 wholly behind
    kv = torch.randn(8, 1, 2, BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    q = torch.randn(1, heads, HEAD_DIM, generator=gen)
    table = torch.tensor([[7, 1, 2, 3, 4, 5]], dtype=torch.int32)
    lens = torch.tensor([ctx], dtype=torch.int32)
    k = kv[table[0].long(), 0, 0].reshape(-1, KV_HEADS, HEAD_DIM)[:ctx]
    v = kv[table[0].long(), 0, 1].reshape(-1, KV_HEADS, HEAD_DIM)[:ctx]
    spec = AttentionSpec(scale=HEAD_DIM**-0.5, window=window)
    full_q = torch.zeros(ctx, heads, HEAD_DIM)
    full_q[-1] = q[0]
    want = dense_causal(full_q, k, v, spec)[-1:].float()
    kv[[7, 1, 2, 3]] = float("nan")
    if path == "c":
        got = cpu_kernels.paged_decode_attention(q, kv, 0, table, lens, spec.scale, window)
    else:
        from engine.triton_kernels import paged_decode_attention

        got = paged_decode_attention(
            q.to(device), kv.to(device), 0, table.to(device), lens.to(device), spec.scale,
            max_ctx_len=ctx, window=window,
        ).cpu()  # fmt: skip
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
