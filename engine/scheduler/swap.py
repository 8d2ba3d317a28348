"""Preemption's cost rule: swap a request's KV to the host tier and back, or recompute it.

Swapping costs its blocks' bytes twice (out, then back in) at the measured copy rate;
recomputing costs its computed tokens at the measured prefill rate. The cheaper wins; the
step scheduler swaps only when the host tier has room (engine.kv.tiered_blocks), else recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

SMOOTHING = 0.2  # weight of the latest step in the prefill rate's moving average
MIN_TOKENS = 32  # steps with fewer tokens say little about the prefill rate


@dataclass
class SwapRule:
    block_bytes: int
    copy_bytes_per_s: float  # measured at start (engine.kv.copier)
    prefill_tokens_per_s: float = 1000.0  # learnt from the steps (observe)

    def __post_init__(self) -> None:
        if self.copy_bytes_per_s <= 0 or self.prefill_tokens_per_s <= 0:
            raise ValueError(
                f"SwapRule rates must be > 0, got {self.copy_bytes_per_s} B/s and "
                f"{self.prefill_tokens_per_s} tokens/s"
            )

    def swap_seconds(self, num_blocks: int) -> float:
        return 2 * num_blocks * self.block_bytes / self.copy_bytes_per_s

    def recompute_seconds(self, num_tokens: int) -> float:
        return num_tokens / self.prefill_tokens_per_s

    def prefers_swap(self, num_blocks: int, num_tokens: int) -> bool:
        """Whether swapping `num_blocks` blocks beats recomputing `num_tokens` tokens."""
        return num_tokens > 0 and self.swap_seconds(num_blocks) < self.recompute_seconds(num_tokens)

    def observe(self, num_tokens: int, seconds: float) -> None:
        """A step computed `num_tokens` tokens in `seconds`."""
        if num_tokens >= MIN_TOKENS and seconds > 0:
            rate = num_tokens / seconds
            self.prefill_tokens_per_s += SMOOTHING * (rate - self.prefill_tokens_per_s)


class StateRoom(Protocol):
    """Room for a swapped-out request's linear-attention states (a hybrid model's,
    engine.kv.state_swap), reserved before its blocks are swapped out."""

    def reserve(self, request_id: str) -> bool:
        """False: no room, the request is recomputed."""
        ...

    def release(self, request_id: str) -> None: ...
