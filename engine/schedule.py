"""The scheduler's plain result: which requests run, how many tokens, which blocks.

The runner turns it into tensors; nothing here touches torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens of one request computed in this step.

    Positions ``start .. start + len(token_ids) - 1`` of the request are computed; their K/V
    land in ``block_table`` (the request's whole table, in order). The attention context is
    ``start + len(token_ids)`` tokens. When ``sample`` is set the chunk ends at the request's
    last known token and the logits of its last position are sampled.
    """

    request_id: str
    token_ids: tuple[int, ...]
    start: int
    block_table: tuple[int, ...]
    sample: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: tuple[ScheduledChunk, ...]
    preempted: tuple[str, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks
