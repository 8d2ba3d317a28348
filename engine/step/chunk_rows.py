"""Chunks laid out as decode rows: the persistent batch's plug-in point for speculative decoding.

A chunk of a decode and the tokens computed ahead of it (engine.scheduler.lookahead) can run
as one decode row per position: the query at position p attends to positions 0 .. p, like a
decode whose context ends there, so the decode kernels compute it (the step's K/V are
written first). Which chunks go so, and which of their rows are scored, is the plug-in's
(engine.speculative.rows implements it). A batch without one lays every chunk out as a
prefill chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine.scheduler.plan import ScheduledChunk, SchedulerOutput
from engine.scheduler.request import Request


class ChunkDecodeRows(Protocol):
    """A step's chunks laid out after its decodes, one decode row per position."""

    @property
    def rows(self) -> list[int]:
        """The batch row of each position's request."""
        ...

    @property
    def starts(self) -> list[int]:
        """The position each row computes."""
        ...

    @property
    def tokens(self) -> list[int]:
        """The input token of each row."""
        ...

    @property
    def rest(self) -> tuple[ScheduledChunk, ...]:
        """The step's other prefill chunks, laid out as prefill chunks."""
        ...

    def logit_rows(
        self,
        out: SchedulerOutput,
        num_decodes: int,
        num_decode_rows: int,
        prefill_sampled: list[int],
    ) -> list[int]:
        """The step's rows to score, in the order the sampler takes them. `num_decodes`:
        plain decodes (rows 0 ..), `num_decode_rows`: all decode rows (these after them),
        `prefill_sampled`: each sampled prefill chunk's last row, among the prefill rows."""
        ...


class ChunkRowLayout(Protocol):
    """Picks the chunks of a step that run as decode rows."""

    def lay_out(
        self, out: SchedulerOutput, row: Callable[[Request], int]
    ) -> ChunkDecodeRows | None:
        """The step's chunks to run as decode rows (None: none in this step). `row`: a
        request's batch row."""
        ...
