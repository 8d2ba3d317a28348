"""The scheduler's plain results: which requests run, how many tokens, which blocks; where
imported KV goes; what an update did.

The runner turns it into tensors; nothing here touches torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from engine.scheduler.request import Request, RequestStatus


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
    num_draft: int = 0  # of token_ids, the last ones are computed ahead (guesses, not known)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    """One step: decodes first (running requests computing their one last token, sampled),
    then chunks (prefill chunks, in order). Decodes are plain references, so that a step of
    steady decoding costs no object per request; ``chunks`` spells the whole step out."""

    prefills: tuple[ScheduledChunk, ...] = ()
    preempted: tuple[str, ...] = ()
    decodes: tuple[Request, ...] = ()
    decode_starts: tuple[int, ...] = ()  # position each decode computes (its last token)
    prefill_requests: tuple[Request, ...] = ()  # the request of each prefill chunk
    grown: tuple[Request, ...] = ()  # decodes whose block table grew in this step
    swapped: tuple[str, ...] = ()  # of preempted, those swapped out (the rest: recomputed)

    @property
    def sampled_requests(self) -> list[Request]:
        """The requests that get a token from this step, in step order."""
        sampled = (r for r, c in zip(self.prefill_requests, self.prefills, strict=True) if c.sample)
        return [*self.decodes, *sampled]

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.prefills)

    @property
    def num_sampled(self) -> int:
        return len(self.decodes) + sum(1 for c in self.prefills if c.sample)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills

    @cached_property
    def chunks(self) -> tuple[ScheduledChunk, ...]:
        """Every chunk of the step, decodes first (built on demand, for tests and logs, once
        the decodes' input tokens are known)."""
        decodes = tuple(
            ScheduledChunk(r.request_id, (r.all_token_ids[s],), s, tuple(r.block_ids), True)
            for r, s in zip(self.decodes, self.decode_starts, strict=True)
        )
        return decodes + self.prefills

    def in_step_order(self, sampled: Mapping[str, int] | Sequence[int]) -> list[int]:
        """The sampled tokens (by request id, or a sequence) as a list in step order: decodes,
        then sampled prefill chunks."""
        if not isinstance(sampled, Mapping):
            if len(sampled) != self.num_sampled:
                raise ValueError(f"{len(sampled)} sampled tokens for {self.num_sampled} rows")
            return list(sampled)
        ids = [r.request_id for r in self.decodes]
        ids += [c.request_id for c in self.prefills if c.sample]
        missing = [rid for rid in ids if rid not in sampled]
        if missing:
            raise KeyError(f"no sampled token for request {missing[0]}")
        return [sampled[rid] for rid in ids]


class RequestTooLargeError(ValueError):
    """The request needs more KV blocks than the whole cache holds."""


@dataclass(frozen=True)
class ImportPlan:
    """Where the KV of a request admitted by `add_prefilled` goes.

    The KV of the first ``num_kv_tokens`` tokens must be written before `commit_prefilled`.
    The first ``num_cached_tokens`` of them (whole blocks) are already in the local prefix
    cache; block j of the sender goes to ``block_ids[j]`` for j in the range of
    ``fill_block_ids``.
    """

    block_ids: tuple[int, ...]  # the request's whole block table
    num_cached_tokens: int
    num_kv_tokens: int
    block_size: int
    # a hybrid model's: the last blocks of the table take the sender's last blocks, its
    # linear-attention state record (engine.kv.linear_state)
    num_state_blocks: int = 0

    @property
    def num_cached_blocks(self) -> int:
        return self.num_cached_tokens // self.block_size

    @property
    def fill_block_ids(self) -> tuple[int, ...]:
        """Local blocks to write, in order: block indices num_cached_blocks onward."""
        end = -(-self.num_kv_tokens // self.block_size)
        return self.block_ids[self.num_cached_blocks : end]


@dataclass(frozen=True)
class StepUpdate:
    """What `update()` did: the requests that got a token, in chunk order."""

    advanced: tuple[Request, ...]
    # chunks with tokens ahead: the tokens appended after the first, by id (stops honoured)
    more: dict[str, tuple[int, ...]] = field(default_factory=dict)
    done: tuple[Request, ...] | None = None  # `finished`, when the scheduler collected it

    @property
    def finished(self) -> tuple[Request, ...]:
        """Those that finished (or, prefill role, were pinned) with this token."""
        if self.done is not None:
            return self.done
        return tuple(r for r in self.advanced if r.status is not RequestStatus.RUNNING)
