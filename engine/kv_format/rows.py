"""Quantized KV cache rows: int8 or fp8 (e4m3) codes, two bf16 scales and mids per token and head;
and ``write_kv``, the torch reference of storing K and V at their slots.

``kv_cache_dtype`` (vLLM's name, engine.kv_format.dtypes) is ``auto`` (the model dtype),
``int8`` or ``fp8_e4m3``. A quantized cache keeps the block-major shape and stores each
(token, KV head) row as ``head_dim`` one-byte codes followed by two bf16 scales and two bf16
mids (8 bytes): the cache's last dim is ``head_dim + 8`` (72 bytes for head_dim 64: 3.56x
fewer than fp32's 256). The scales live inside the block, so whatever moves blocks
(transfers, KV tiers, swap, prefix copies) moves them too, and a new token never
re-quantises the tokens already in its block (a per-block scale would have to grow and re-code
them).

Each row has two channel groups, its two halves, and each group a scale and a mid:
``x ~= code * scale + mid``. int8: ``mid = (max + min) / 2`` of the group, ``scale = half
range / 127``; fp8 (e4m3, whose codes are finest near 0): ``mid = 0``, ``scale = absmax / 448``
(e4m3's largest finite value). Scales and mids are rounded to bf16 (fp32's range: no under-
or overflow) and the codes computed with the rounded values. Measured on the default model
(fp32 K/V rounded to each format; RMS error of the query-key scores over the 12 oracle
prompts' prefill, bf16 KV: 0.008): one fp32 scale per row 0.048, four groups of 16 with one
scale each 0.027, these two groups with a scale and a mid each 0.023 (keys have per-channel
offsets that a symmetric code spends its range on). The greedy counts:
tests/engine/test_kv_dtype_oracle.py.

Per-channel key scales (KIVI-style: keys divided by a fixed table ``s``, queries multiplied by
it) do not help here (``python -m bench.kv_quant_error``, same score error): a weight-only
table from the row norms of ``W_k * input_norm`` with the two channels of each RoPE pair
sharing a value (so that it commutes with the fused rotary kernels) gives 0.024, a table from
the keys' own absmax under that constraint 0.034: in a low-frequency pair one channel carries
a large key offset and the other the largest queries, so a shared scale coarsens the channel
that matters. Scales free of the pair constraint (applied after RoPE) with the keys' mean
subtracted, both fitted on the measured prompts themselves, reach 0.0095: still above bf16's.

int8 rows store keys rotated (``rotate_heads_``): after RoPE, each head of q and k is multiplied
by a normalized Hadamard matrix H (Sylvester's, in blocks of the largest power of two that
divides head_dim). H is orthogonal and its own inverse, so ``(H q) . (H k) = q . k``: the
scores are unchanged, while a key's few large channels are spread over all of them before
its row is rounded. The layer ops rotate q and k together (the C kernel in its RoPE pass),
so every attention path reads rotated keys with rotated queries; V is stored as it is. fp8
rows keep their keys as they are (e4m3's codes already follow each value's size). On the
default model: score error 0.0194 rotated against 0.0227 (``bench.kv_quant_error``); greedy
output over 100 chat prompts x 48 tokens kept float32's tokens on 77 prompts rotated against
75 unrotated, and 11 of the 12 oracle prompts against 8 (the engine on a 2-core AVX-512 / AMX
Xeon). An emulation that rounds an fp32 cache after each step (same engine, torch rounding)
put it at 83 against 72, bfloat16 K/V at 89. The keys carry most of the error that is left:
over the prefill of 12 chat prompts the attention output's relative RMS error is 0.0102 with
both rounded, 0.0091 with the keys alone, 0.0045 with V alone (bf16 K and V: 0.0043).
Rotating V as well (0.0100), random signs before H (0.0090 to 0.0093) or a random orthogonal
matrix instead of H (0.0095) do not change it.
"""

from __future__ import annotations

import functools

import torch

GROUPS = 2  # channel groups (a scale and a mid each) per (token, KV head) row
SCALE_BYTES = 4 * GROUPS  # bf16 scales then bf16 mids, after the row's codes
# named in the layout fingerprint: blocks of another format are converted or refused
ROW_FORMAT = "bf16-scale-mid-per-token-head-half-x2+int8-keys-hadamard"
CODE_DTYPES = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
CODE_MAX = {"int8": 127.0, "fp8_e4m3": 448.0}


def kv_dtype_of(kv_cache: torch.Tensor) -> str:
    """The ``kv_cache_dtype`` of a cache tensor: ``int8``, ``fp8_e4m3`` or ``auto``."""
    return next((name for name, d in CODE_DTYPES.items() if d == kv_cache.dtype), "auto")


def is_quantized(kv_cache: torch.Tensor) -> bool:
    """Whether ``kv_cache`` holds codes + scales (a one-byte code dtype)."""
    return kv_cache.dtype in (torch.int8, torch.float8_e4m3fn)


def keys_rotated(kv_cache_dtype: str) -> bool:
    """Whether a cache of this dtype stores its keys rotated (``rotate_heads_``): int8's
    uniform codes gain from it; fp8's floating codes already follow each value's size."""
    return kv_cache_dtype == "int8"


def rotates_keys(kv_cache: torch.Tensor) -> bool:
    """``keys_rotated`` of a cache tensor."""
    return kv_cache.dtype == torch.int8


def hadamard_block(head_dim: int) -> int:
    """The rotation's block: the largest power of two dividing ``head_dim``."""
    return head_dim & -head_dim


@functools.cache
def hadamard_matrix(head_dim: int, device: torch.device) -> torch.Tensor:
    """H [head_dim, head_dim] fp32: the normalized Sylvester Hadamard in blocks of
    ``hadamard_block(head_dim)``, symmetric and orthogonal (so its own inverse)."""
    block = hadamard_block(head_dim)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / block**0.5
    return torch.block_diag(*[h] * (head_dim // block)).float().to(device)


def rotate_heads_(x: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] <- H x per head (``hadamard_matrix``), in place, and returned. On the
    CPU by butterflies in fp32 in the C kernel's order (the same bits); elsewhere one fp32
    matmul (a GPU step would pay a launch per butterfly stage). H is its own inverse: a
    second call undoes the first."""
    d = x.shape[-1]
    if x.device.type != "cpu":
        x.copy_(x.float() @ hadamard_matrix(d, x.device))
        return x
    block = hadamard_block(d)
    y = x.float().reshape(-1, d // block, block)
    span = 1
    while span < block:
        pairs = y.reshape(y.shape[0], y.shape[1], block // (2 * span), 2, span)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2).reshape(y.shape)
        span *= 2
    y = y * (1.0 / block**0.5)
    x.copy_(y.reshape(x.shape))
    return x


def _halves(x: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., GROUPS, d / 2]: each group's channels."""
    return x.reshape(*x.shape[:-1], GROUPS, x.shape[-1] // GROUPS)


def channel_groups(head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[head_dim] int64: the group (scale and mid) of each channel, 0 or 1."""
    return torch.arange(head_dim, device=device) // (head_dim // GROUPS)


def quantize_rows(x: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """x: [..., d] float -> [..., d + 8] code rows (codes, then two bf16 scales, two bf16 mids)."""
    code = CODE_DTYPES[kv_cache_dtype]
    xg = _halves(x.float())  # [..., G, d / G]
    hi, lo = xg.amax(dim=-1), xg.amin(dim=-1)  # [..., G]
    # int8: codes about the group's mid-range (keys carry per-channel offsets); e4m3 codes are
    # finest near 0, so fp8 rows keep mid 0
    mid = ((hi + lo) / 2 if code == torch.int8 else torch.zeros_like(hi)).bfloat16()
    m = mid.float()
    # the half range about the rounded mid, so that the codes reach both ends
    half = torch.maximum(hi - m, m - lo)
    scale = (half / CODE_MAX[kv_cache_dtype]).bfloat16()
    s = scale.float()
    divisor = torch.where(s > 0, s, torch.ones_like(s))[..., None]
    scaled = ((xg - m[..., None]) / divisor).flatten(-2)  # [..., d]
    if code == torch.int8:
        codes = scaled.round().clamp_(-127, 127).to(torch.int8)
    else:
        codes = scaled.clamp_(-448.0, 448.0).to(code)
    params = torch.cat([scale, mid], dim=-1).contiguous().view(torch.int8)  # [..., 8]
    return torch.cat([codes.view(torch.int8), params], dim=-1).view(code)


def dequantize_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rows: [..., d + 8] codes + scales + mids (one-byte code dtype) -> [..., d] of ``dtype``."""
    codes, scales, mids = split_rows(rows)
    values = _halves(codes.float()) * scales[..., None] + mids[..., None]
    return values.flatten(-2).to(dtype)


def split_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rows: [..., d + 8] -> codes [..., d] (a view), fp32 scales and mids, each [..., GROUPS]."""
    d = rows.shape[-1] - SCALE_BYTES
    params = rows[..., d:].contiguous().view(torch.bfloat16).float()  # [..., 2 * GROUPS]
    return rows[..., :d], params[..., :GROUPS], params[..., GROUPS:]


def row_width(head_dim: int, kv_cache_dtype: str) -> int:
    """Elements of one (token, KV head) row in the cache tensor."""
    return head_dim + (SCALE_BYTES if kv_cache_dtype != "auto" else 0)


def convert_rows(
    rows: torch.Tensor, src_kv_dtype: str, dst_kv_dtype: str, model_dtype: torch.dtype
) -> torch.Tensor:
    """Blocks' rows [..., 2 (K, V), block_size, kv_heads, row] of one cache's format in
    another's (``auto``: ``model_dtype`` values); keys are rotated into an int8 cache and back
    out of one (``rotate_heads_``)."""
    if src_kv_dtype == dst_kv_dtype:
        return rows
    if src_kv_dtype == "auto":
        values = rows.to(torch.float32, copy=True)  # rotated below: never the caller's rows
    else:
        values = dequantize_rows(rows, torch.float32)
    if keys_rotated(src_kv_dtype) != keys_rotated(dst_kv_dtype):  # H undoes itself
        rotate_heads_(values[..., 0, :, :, :])
    if dst_kv_dtype == "auto":
        return values.to(model_dtype)
    return quantize_rows(values, dst_kv_dtype)


def write_kv(
    kv: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store new keys and values of ``layer`` at their slots (quantised in a quantized cache)
    of a block-major cache ``[num_blocks, num_layers, 2, block_size, kv_heads, row]``: token
    slot ``s`` is row ``s % block_size`` of block ``s // block_size``.

    k, v: [tokens, kv_heads, head_dim]; slot_mapping: [tokens] int64.
    """
    block_size = kv.shape[3]
    blocks = slot_mapping // block_size  # [tokens]
    offsets = slot_mapping % block_size  # [tokens]
    if is_quantized(kv):
        kv_dtype = kv_dtype_of(kv)
        k, v = quantize_rows(k, kv_dtype), quantize_rows(v, kv_dtype)  # [tokens, kv_heads, d + 8]
    kv[:, layer, 0].index_put_((blocks, offsets), k)
    kv[:, layer, 1].index_put_((blocks, offsets), v)
