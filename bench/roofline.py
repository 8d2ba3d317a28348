"""The roofline of one decode step: the least time its bytes and its FLOPs can take on this
device, from limits measured in the same run.

A decode step of `batch` sequences whose contexts hold `context_tokens` tokens in all reads
every weight once (the linear layers and the LM head) and the K and V of every context token
in every layer; it computes 2 FLOPs per weight per sequence and 4 * heads * head_dim per
(query, key) pair in every layer. Its roofline is max(bytes / copy traffic, FLOPs / matmul
peak), where the copy traffic is what a same-run device copy moves per second, reads and
writes together (2 x bytes copied / time, as in bench.kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.common import ModelShape


@dataclass(frozen=True)
class DecodeStepCost:
    """What one decode step must read and compute."""

    weight_bytes: int
    kv_bytes: int
    flops: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


@dataclass(frozen=True)
class Roofline:
    """The least time of a step under each limit, in seconds."""

    memory_s: float  # bytes / copy traffic
    compute_s: float  # FLOPs / matmul peak

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def decode_step_cost(
    shape: ModelShape, batch: int, context_tokens: int, dtype_bytes: int
) -> DecodeStepCost:
    """Bytes read and FLOPs of one decode step; `context_tokens` sums every sequence's
    context, the new token included. Norm weights and the embedding rows are left out."""
    if batch < 1 or context_tokens < batch or dtype_bytes < 1:
        raise ValueError(
            f"need batch >= 1, context_tokens >= batch and dtype_bytes >= 1, got {batch}, "
            f"{context_tokens}, {dtype_bytes}"
        )
    weights = shape.layers * shape.layer_params + shape.hidden * shape.vocab
    kv_per_token = shape.layers * 2 * shape.kv_heads * shape.head_dim
    attention = 4 * shape.layers * shape.heads * shape.head_dim * context_tokens
    return DecodeStepCost(
        weight_bytes=weights * dtype_bytes,
        kv_bytes=context_tokens * kv_per_token * dtype_bytes,
        flops=2 * weights * batch + attention,
    )


def roofline(cost: DecodeStepCost, traffic_gbps: float, matmul_gflops: float) -> Roofline:
    """The step's roofline under a copy traffic (GB/s, reads + writes) and a matmul peak
    (GFLOP/s), both measured in the same run."""
    if traffic_gbps <= 0 or matmul_gflops <= 0:
        raise ValueError(f"limits must be > 0, got {traffic_gbps} GB/s, {matmul_gflops} GFLOP/s")
    return Roofline(
        memory_s=cost.bytes / (traffic_gbps * 1e9), compute_s=cost.flops / (matmul_gflops * 1e9)
    )
