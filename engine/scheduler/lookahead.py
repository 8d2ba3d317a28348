"""Tokens computed ahead of a decode: the scheduler's plug-in point for speculative decoding.

A decode may be planned as one chunk of its last known token and tokens after it whose ids
are not known yet (guesses): the model computes them all in one step, and the step brings
back the tokens that stand. The scheduler owns the integers (budget, blocks, computed KV);
what the tokens ahead are and which emitted tokens are kept is the plug-in's
(engine.speculative.guess_lookahead implements it). A scheduler without one plans plain
decodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.scheduler.request import Request


class Lookahead(Protocol):
    """What a scheduler asks about tokens ahead of its decodes."""

    def tokens_ahead(self, request: Request, limit: int) -> Sequence[int]:
        """Tokens to compute after the request's decode in this step, at most `limit` (what
        the step's budget, the request's length and the cache allow); empty for a plain
        decode. The scheduler then finds their blocks, or (tokens ahead never preempt
        anyone) decodes the request plainly."""
        ...

    def accept(self, request: Request, emitted: Sequence[int]) -> int:
        """The step emitted these tokens for the request's chunk (the sampled one first):
        append those that stand, up to a stop. Returns how many were appended; the first
        n - 1 tokens ahead then count as computed, the blocks past them go back."""
        ...

    def drop(self, request: Request) -> None:
        """The request was preempted: tokens ahead were for this step only."""
        ...
