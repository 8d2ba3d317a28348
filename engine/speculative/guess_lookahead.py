"""Speculative decoding's lookahead: its part in scheduling a step (the scheduler's
`Lookahead`).

A decoding request's guesses (`Request.draft_token_ids`, set by `Speculator.propose`) are
computed ahead of its decode, in one chunk; after the step, the tokens `verify` emitted are
appended up to a stop. The scheduler keeps the integers: the budget and length limits, the
blocks of the guesses (never taken by preempting anyone) and those given back after.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.scheduler.request import Request


class GuessLookahead:
    """The scheduler's lookahead for guesses: stateless, the guesses live on the requests."""

    def tokens_ahead(self, request: Request, limit: int) -> Sequence[int]:
        """The request's guesses for this step, at most `limit` of them."""
        guesses = request.draft_token_ids
        if not guesses or limit <= 0:
            return ()
        return guesses[:limit]

    def accept(self, request: Request, emitted: Sequence[int]) -> int:
        """Append the verified tokens up to a stop (EOS, a stop id, the length limit)."""
        n = 0
        for token in emitted:
            request.output_token_ids.append(token)
            n += 1
            if request.check_stop() is not None:
                break
        return n

    def drop(self, request: Request) -> None:
        request.draft_token_ids = []  # guesses were for the step they were proposed for
