"""The element-wise work of a decoder layer around its matmuls and attention, per backend.

A layer normalises, rotates q and k and stores K and V, and gates its MLP. Three sets of ops
do that work: torch (the reference, any device), the C kernels (CPU fp32, see
``engine.cpu_kernels``) and the Triton kernels (with the Triton attention backend, see
``engine.triton_kernels``). The model picks one per step; the layer never branches on it.

The residual adds stay in the matmuls (``h.addmm_``: the GEMM adds into the residual in its
epilogue), so the norms here take no residual.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F

from engine import cpu_kernels
from engine.kv_format.rows import rotate_heads_, rotates_keys, write_kv
from engine.model.attention import AttentionMetadata


class QKV(NamedTuple):
    """Views into a layer's fused projection: q [tokens, heads, d], k and v [tokens, kv_heads,
    d]; q and k rotated, K and V already stored in the cache."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


class LayerOps(Protocol):
    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of x [tokens, hidden] in fp32, scaled by weight [hidden]."""
        ...

    def rope_write_kv(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
    ) -> QKV:
        """Rotate q and k of qkv [tokens, (heads + 2 kv_heads) * d] at ``meta.positions`` and
        store K and V of ``layer`` at ``meta.slot_mapping``."""
        ...

    def act_mul(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        """act(gate) * up for gate_up [tokens, 2 * inter] -> [tokens, inter]; ``activation``
        is ``silu`` or ``gelu_tanh`` (GELU, tanh approximation)."""
        ...

    def head_norm_(self, x: torch.Tensor, heads: int, weight: torch.Tensor, eps: float) -> None:
        """RMSNorm of each head of x [tokens, heads * d] (a view of the fused projection)
        over its d values, in place, scaled by weight [d]: q and k norms."""
        ...

    @property
    def backend(self) -> str:
        """``torch``, ``c`` or ``triton``: where the layer's other kernels (MoE) run too."""
        ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [tokens, hidden]. Normalised in fp32, scaled in the model dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype) * weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos, sin: [tokens, 1, head_dim / 2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def act_mul(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up in torch, over the gate_up buffer in place (no temporaries)."""
    gate, up = gate_up.chunk(2, dim=-1)  # each [tokens, inter]
    if activation == "silu":
        return F.silu(gate, inplace=True).mul_(up)
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh").mul_(up)
    raise ValueError(f"activation must be silu or gelu_tanh, got {activation!r}")


def head_norm_(x: torch.Tensor, heads: int, weight: torch.Tensor, eps: float) -> None:
    """RMSNorm of each head of x [tokens, heads * d] (any row stride) over its d values, in
    place, scaled by weight [d]: Qwen3's and Gemma 3's q and k norms, before the rotary."""
    v = x.unflatten(1, (heads, -1))  # [tokens, heads, d], a view
    scale = v.float().pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    v.copy_((v.float() * scale).to(v.dtype) * weight)


def _split(qkv: torch.Tensor, heads: int, kv_heads: int) -> QKV:
    qkv = qkv.view(qkv.shape[0], heads + 2 * kv_heads, -1)  # [tokens, heads + 2 kv_heads, d]
    return QKV(qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :])


class TorchOps:
    """Plain torch ops; ``cos`` and ``sin`` are this step's rows, each [tokens, 1, d / 2]."""

    backend = "torch"

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.cos, self.sin = cos, sin

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def rope_write_kv(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
    ) -> QKV:
        qkv = qkv.view(qkv.shape[0], heads + 2 * kv_heads, -1)
        qk = apply_rope(qkv[:, : heads + kv_heads], self.cos, self.sin)  # [tokens, h + kvh, d]
        if rotates_keys(kv_cache):  # keys stored rotated, queries rotated alike
            rotate_heads_(qk)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        write_kv(kv_cache, layer, k, v, meta.slot_mapping)
        return QKV(q, k, v)

    def act_mul(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        return act_mul(gate_up, activation)

    def head_norm_(self, x: torch.Tensor, heads: int, weight: torch.Tensor, eps: float) -> None:
        head_norm_(x, heads, weight, eps)


class CpuKernelOps:
    """The fused C kernels (CPU fp32); ``cos``, ``sin``: the model's [max_len, d / 2] tables."""

    backend = "c"

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        self.cos, self.sin = cos, sin
        # the last step's (metadata, cache) and its checked indices: every layer shares them
        self._indexed: tuple[AttentionMetadata, torch.Tensor] | None = None
        self._indices = (torch.empty(0), torch.empty(0))

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return cpu_kernels.rms_norm(x, weight, eps)

    def _rope_indices(
        self, meta: AttentionMetadata, kv_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        indexed = self._indexed
        if indexed is None or indexed[0] is not meta or indexed[1] is not kv_cache:
            self._indices = cpu_kernels.rope_indices(
                meta.positions, meta.slot_mapping, kv_cache, self.cos
            )
            self._indexed = (meta, kv_cache)
        return self._indices

    def rope_write_kv(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
    ) -> QKV:
        positions, slots = self._rope_indices(meta, kv_cache)
        cpu_kernels.rope_write_kv(
            qkv, heads, kv_heads, positions, self.cos, self.sin, kv_cache, layer, slots, True
        )
        return _split(qkv, heads, kv_heads)

    def act_mul(self, gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        if activation == "silu":
            return cpu_kernels.silu_mul(gate_up)
        return act_mul(gate_up, activation)

    def head_norm_(self, x: torch.Tensor, heads: int, weight: torch.Tensor, eps: float) -> None:
        cpu_kernels.head_norm_(x, heads, weight, eps)


class TritonOps(TorchOps):
    """RMSNorm and RoPE + KV write as Triton kernels; SiLU * up stays torch.

    ``cos``, ``sin``: the model's [max_len, d / 2] tables, kept as one fp32 [max_len, d]
    table (cos half | sin half) for ``engine.triton_kernels.apply_rope``.
    """

    backend = "triton"

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        super().__init__(cos, sin)
        self.cos_sin = torch.cat((cos, sin), dim=-1).float()  # [max_len, d]

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        from engine.triton_kernels import rms_norm as triton_rms_norm

        return triton_rms_norm(x, weight, eps)[0]

    def rope_write_kv(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        kv_cache: torch.Tensor,
        layer: int,
        meta: AttentionMetadata,
    ) -> QKV:
        from engine.triton_kernels import apply_rope, rope_write_kv
        from engine.triton_kernels import write_kv as triton_write_kv

        q, k, v = _split(qkv, heads, kv_heads)
        if not rotates_keys(kv_cache):
            rope_write_kv(q, k, v, meta.positions, self.cos_sin, kv_cache, layer, meta.slot_mapping)
            return QKV(q, k, v)
        # keys stored rotated (engine.kv_format.rows.rotate_heads_), queries rotated alike
        apply_rope(q, k, meta.positions, self.cos_sin)
        rotate_heads_(qkv.view(qkv.shape[0], heads + 2 * kv_heads, -1)[:, : heads + kv_heads])
        triton_write_kv(k, v, kv_cache, layer, meta.slot_mapping)
        return QKV(q, k, v)
