"""A rank's share of a tensor-parallel model: which heads, rows, experts and vocabulary rows
it holds, and the two collectives the decoder needs (sum of partial outputs, gather of the
vocabulary's logits).

``Shard()`` is the whole model on one rank: every range is everything and the collectives
are no-ops. The process group behind a shard of ``size`` > 1 is set up by
``engine.parallel``; the layers only read the ranges and call the collectives.

Splits (Megatron's, as even as they go): whole KV groups of heads (column-parallel ``qkv``,
row-parallel ``o_proj``), or with fewer KV heads than ranks, a share of one group's query
heads and its KV head (replicated); MLP rows (column-parallel ``gate_up``, row-parallel
``down``); Gated DeltaNet layers by key head (each with its value heads, conv channels and
recurrent state; row-parallel ``out_proj``); the row-parallel outputs are summed; experts as
contiguous ranges; the vocabulary
in ranges of ``ceil(V / size)`` rows, the last one padded with zero rows whose logits are
dropped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist


class Span(NamedTuple):
    """Rows ``start .. start + length - 1`` of a dimension."""

    start: int
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    size: int = 1
    group: Any = None  # torch.distributed process group; None: the default one
    device: str = "cpu"  # where the group's collectives take tensors (NCCL: the GPU)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is not in [0, {self.size})")

    def part(self, n: int, what: str) -> Span:
        """The rank's share of ``n`` rows: ``[r n / size, (r + 1) n / size)`` (as even as
        it goes); ValueError naming ``what`` when there are fewer rows than ranks."""
        if n < self.size:
            raise ValueError(f"{what} ({n}) is below tensor_parallel_size ({self.size})")
        start = self.rank * n // self.size
        return Span(start, (self.rank + 1) * n // self.size - start)

    def heads(self, num_heads: int, num_kv_heads: int) -> tuple[Span, Span]:
        """(query heads, KV heads) of this rank. Whole KV groups (a KV head and the query
        heads that read it) go to a rank, as evenly as they go; with fewer KV heads than
        ranks each KV head is replicated on ``size / kv`` ranks that split its group."""
        group = num_heads // num_kv_heads
        if num_kv_heads >= self.size:
            kv = self.part(num_kv_heads, "num_key_value_heads")
            return Span(kv.start * group, kv.length * group), kv
        if self.size % num_kv_heads or group % (self.size // num_kv_heads):
            raise ValueError(
                f"tensor_parallel_size ({self.size}) cannot split {num_heads} heads over "
                f"{num_kv_heads} KV heads: it must divide the KV heads or be a multiple of "
                "them that divides each KV head's query heads"
            )
        replicas = self.size // num_kv_heads
        per = group // replicas
        return Span(self.rank * per, per), Span(self.rank // replicas, 1)

    def linear_heads(self, num_k_heads: int) -> Span:
        """The key heads (each with its value heads) of a Gated DeltaNet layer held here:
        an even share, so that every rank's state is the same size (ValueError otherwise)."""
        if num_k_heads % self.size:
            raise ValueError(
                f"tensor_parallel_size ({self.size}) must divide linear_num_key_heads "
                f"({num_k_heads}): the linear-attention layers are split by key head"
            )
        return self.part(num_k_heads, "linear_num_key_heads")

    def vocab(self, vocab_size: int) -> Span:
        """The vocabulary rows held here: ``ceil(V / size)`` per rank (the span is clipped
        to the vocabulary; the rank's tensor keeps the padded row count)."""
        per = -(-vocab_size // self.size)
        start = min(self.rank * per, vocab_size)
        return Span(start, min(per, vocab_size - start))

    def vocab_rows(self, vocab_size: int) -> int:
        return -(-vocab_size // self.size)

    def all_reduce_(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks in place (row-parallel outputs)."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def min_int(self, value: int) -> int:
        """The smallest of the ranks' ``value`` (a number all ranks must agree on)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def gather_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """logits: [rows, V / size] of this rank's vocabulary -> [rows, V]."""
        if self.size == 1:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)[:, :vocab_size]

    def embed(self, input_ids: torch.Tensor, table: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Vocabulary-parallel embedding: input_ids [tokens] -> [tokens, hidden]; each rank
        looks up the ids it holds, zeros the others', the sum is the lookup."""
        if self.size == 1:
            return torch.nn.functional.embedding(input_ids, table)
        span = self.vocab(vocab_size)
        local = input_ids - span.start
        outside = (local < 0) | (local >= span.length)
        h = torch.nn.functional.embedding(local.masked_fill(outside, 0), table)
        h.masked_fill_(outside.unsqueeze(-1), 0.0)
        return self.all_reduce_(h)


def shard_config(config: Any, shard: Shard) -> Any:
    """The ModelConfig of one rank's layers: its query and KV heads, its MLP rows and its
    shared expert's (the experts themselves are split by ``experts``), its Gated DeltaNet
    key and value heads."""
    if shard.size == 1:
        return config
    q, kv = shard.heads(config.num_attention_heads, config.num_key_value_heads)
    changes: dict[str, Any] = {
        "num_attention_heads": q.length,
        "num_key_value_heads": kv.length,
        "intermediate_size": shard.part(config.intermediate_size, "intermediate_size").length,
    }
    if config.moe is not None:
        shared = config.moe.shared_intermediate_size
        if shared:
            shared = shard.part(shared, "shared_expert_intermediate_size").length
        experts(shard, config.moe.num_experts)
        changes["moe"] = dataclasses.replace(config.moe, shared_intermediate_size=shared)
    if config.linear is not None:
        spec = config.linear
        k = shard.linear_heads(spec.num_k_heads).length
        v = k * (spec.num_v_heads // spec.num_k_heads)
        changes["linear"] = dataclasses.replace(spec, num_k_heads=k, num_v_heads=v)
    return dataclasses.replace(config, **changes)


def experts(shard: Shard, num_experts: int) -> Span:
    """The experts this rank holds (a contiguous range)."""
    return shard.part(num_experts, "the number of experts")
