"""Speculative chunks in the persistent batch (the batch's `ChunkRowLayout`): a decode and its
guesses run as decode rows, one per position, and the guesses' rows are scored after the
step's sampled rows, for `verify`."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from engine.scheduler.plan import ScheduledChunk, SchedulerOutput
from engine.scheduler.request import Request


class GuessRows(NamedTuple):
    """The step's speculative chunks as decode rows."""

    rows: list[int]  # the request's batch row, once per position
    starts: list[int]  # the position of each
    tokens: list[int]
    ends: list[int]  # end of each chunk among these rows
    rest: tuple[ScheduledChunk, ...]  # the step's chunks without guesses

    def logit_rows(
        self,
        out: SchedulerOutput,
        num_decodes: int,
        num_decode_rows: int,
        prefill_sampled: list[int],
    ) -> list[int]:
        """Rows to score: decodes, each sampled chunk's last (in step order), then each
        speculative chunk's guesses' rows (the positions before its last), chunk by chunk."""
        d = num_decodes
        sampled = list(range(d))
        guesses: list[int] = []
        regular, ends = iter(prefill_sampled), iter(self.ends)
        for chunk in out.prefills:
            if chunk.num_draft:
                last = d + next(ends) - 1
                sampled.append(last)
                guesses += range(last - chunk.num_draft, last)
            elif chunk.sample:
                sampled.append(num_decode_rows + next(regular))
        return sampled + guesses


class GuessRowLayout:
    """Lays out the step's chunks with guesses as decode rows; stateless."""

    def lay_out(self, out: SchedulerOutput, row: Callable[[Request], int]) -> GuessRows | None:
        if not any(c.num_draft for c in out.prefills):
            return None
        part = GuessRows([], [], [], [], tuple(c for c in out.prefills if not c.num_draft))
        for request, chunk in zip(out.prefill_requests, out.prefills, strict=True):
            if chunk.num_draft:
                n = chunk.num_tokens
                part.rows.extend([row(request)] * n)
                part.starts.extend(range(chunk.start, chunk.start + n))
                part.tokens.extend(chunk.token_ids)
                part.ends.append(len(part.rows))
        return part
