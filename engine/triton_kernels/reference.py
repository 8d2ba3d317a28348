"""Plain torch oracles for the Triton kernels: dense gathers, explicit masks, fp32 math.

These are deliberately slow and obvious. The kernel tests compare against them; they are not
the CPU attention backend (that lives in ``engine.model.attention``).

Layouts (shared with the kernels):
- ``kv``: ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]``; K of layer ``l``
  is ``kv[:, l, 0]``, V is ``kv[:, l, 1]``.
- ``block_tables``: ``[batch, max_blocks]`` int32, padded past each sequence's last block.
- ``cos_sin_cache``: ``[max_position, head_dim]``, the first half of each row is
  ``cos(pos * inv_freq)``, the second half ``sin(pos * inv_freq)`` (rotate-half RoPE).
"""

from __future__ import annotations

import torch


def gather_kv(
    kv: torch.Tensor, layer: int, block_table: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence as dense tensors: each ``[length, num_kv_heads, head_dim]``."""
    block_size = kv.shape[3]
    positions = torch.arange(length, device=kv.device)
    blocks = block_table.long()[positions // block_size]  # [length]
    offsets = positions % block_size  # [length]
    k = kv[blocks, layer, 0, offsets]  # [length, kv_heads, head_dim]
    v = kv[blocks, layer, 1, offsets]
    return k, v


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of queries at absolute positions ``q_pos`` over keys ``0..len(k)-1``.

    q: [n, heads, d]; k, v: [len, kv_heads, d]; q_pos: [n]. With ``window`` > 0 a query at
    ``p`` sees only keys in ``(p - window, p]``; with ``sinks`` [heads] one more logit per
    head joins each softmax, its weight dropped. Returns [n, heads, d] in fp32.
    """
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)  # [len, heads, d]
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale  # [heads, n, len]
    key_pos = torch.arange(k.shape[0], device=q.device)
    allowed = key_pos[None, :] <= q_pos[:, None]  # [n, len]
    if window > 0:
        allowed &= key_pos[None, :] > q_pos[:, None] - window
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(-1, 1, 1).expand(-1, scores.shape[1], 1)  # [heads, n, 1]
        scores = torch.cat((scores, sink), dim=-1)
    probs = torch.softmax(scores, dim=-1)[..., : k.shape[0]]
    return torch.einsum("hnl,lhd->nhd", probs, v)


def decode_attention_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    block_tables: torch.Tensor,
    ctx_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence over its whole context (its last ``window`` tokens if > 0),
    with ``sinks`` [heads] in each softmax when given.

    q: [batch, heads, d]; block_tables: [batch, max_blocks]; ctx_lens: [batch].
    Returns [batch, heads, d] in q's dtype.
    """
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        length = int(ctx_lens[b])
        k, v = gather_kv(kv, layer, block_tables[b], length)
        pos = torch.tensor([length - 1], device=q.device)
        out[b] = _attend(q[b : b + 1], k, v, pos, scale, window, sinks)[0].to(q.dtype)
    return out


def prefill_attention_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    layer: int,
    cu_q: torch.Tensor,
    ctx_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int = 0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """New tokens of several sequences attending causally to cached prefix + themselves
    (with ``sinks`` [heads] in each softmax when given).

    q: [tokens, heads, d]; cu_q: [batch + 1] query start offsets; ctx_lens: [batch] cached +
    new tokens; the new tokens' K/V are already in the cache; ``window`` > 0 limits each
    query at ``p`` to keys in ``(p - window, p]``. Returns [tokens, heads, d].
    """
    out = torch.empty_like(q)
    for b in range(ctx_lens.shape[0]):
        start, end = int(cu_q[b]), int(cu_q[b + 1])
        length = int(ctx_lens[b])
        k, v = gather_kv(kv, layer, block_tables[b], length)
        q_pos = torch.arange(length - (end - start), length, device=q.device)
        out[start:end] = _attend(q[start:end], k, v, q_pos, scale, window, sinks).to(q.dtype)
    return out


def write_kv_ref(
    k: torch.Tensor, v: torch.Tensor, kv: torch.Tensor, layer: int, slot_mapping: torch.Tensor
) -> None:
    """Scatter k, v ``[tokens, kv_heads, d]`` into the cache at ``slot_mapping`` ``[tokens]``."""
    block_size = kv.shape[3]
    blocks = slot_mapping // block_size
    offsets = slot_mapping % block_size
    kv[blocks, layer, 0, offsets] = k.to(kv.dtype)
    kv[blocks, layer, 1, offsets] = v.to(kv.dtype)


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(norm(x + residual) * weight, x + residual)``; without residual the second is x.

    x, residual: [tokens, hidden]; weight: [hidden]. The sum is rounded to x's dtype, the
    norm is computed in fp32 (Llama convention).
    """
    summed = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    s = summed.float()
    normed = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype), summed


def rope_cos_sin_cache(
    head_dim: int, max_position: int, theta: float, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Rotate-half RoPE table ``[max_position, head_dim]``: cos half then sin half, fp32."""
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(half, device=device, dtype=torch.float32) / half)
    angles = torch.arange(max_position, device=device, dtype=torch.float32)[:, None] * inv_freq
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rope_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated copies of q ``[tokens, heads, d]`` and k ``[tokens, kv_heads, d]``."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        cos_sin = cos_sin_cache[positions.long()].float()  # [tokens, d]
        cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]  # [tokens, 1, half]
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)
